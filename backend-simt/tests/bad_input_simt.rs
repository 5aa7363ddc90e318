//! The bad-input suite for device metadata (kernel-api conformance/bad_input) on the SIMT
//! emulator at warp 32 and warp 64. In an AddressSanitizer build (`K3_SIMT_ASAN=1`) any access
//! outside the tensors stops the process: the suite passing there shows there was none.

mod simt32 {
    kernel_api::bad_input_suite!(k3_backend_simt::simt_backend(32));
}
mod simt64 {
    kernel_api::bad_input_suite!(k3_backend_simt::simt_backend(64));
}
