//! The conformance suite on the CUDA backend: every op's GPU kernel against the oracles, when a
//! device answers (otherwise every test prints `skipped: <reason>`).

kernel_api::conformance_suite!(k3_backend_cuda::cuda_backend(0));
