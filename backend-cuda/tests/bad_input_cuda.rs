//! The bad-input suite for device metadata on the CUDA backend, when a device answers (otherwise
//! every test prints `skipped: <reason>`): each malformed block table, slot mapping, cu_seqlens,
//! state index, expert id, ... must come back as a typed error from the kernels' checks.

kernel_api::bad_input_suite!(k3_backend_cuda::cuda_backend(0));
