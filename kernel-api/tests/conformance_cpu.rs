//! The conformance suite on the CPU reference backend.
kernel_api::conformance_suite!(Ok::<_, kernel_api::Error>(kernel_api::cpu::CpuBackend::new()));
