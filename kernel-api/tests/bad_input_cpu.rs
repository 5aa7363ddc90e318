//! The bad-input suite for device metadata on the CPU reference backend.
kernel_api::bad_input_suite!(Ok::<_, kernel_api::Error>(kernel_api::cpu::CpuBackend::new()));
