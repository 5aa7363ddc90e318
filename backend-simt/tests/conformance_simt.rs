//! The conformance suite on the SIMT emulator at warp 32 and warp 64: the GPU kernel sources of
//! kernels/csrc/ops, run on the CPU.

macro_rules! simt_suite {
    ($name:ident, $warp:expr) => {
        mod $name {
            kernel_api::conformance_suite!(
                k3_backend_simt::simt_backend($warp)
            );
        }
    };
}

simt_suite!(simt32, 32);
simt_suite!(simt64, 64);
