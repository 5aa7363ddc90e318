//! The conformance suite on the SIMT emulator at warp 32 and warp 64: the GPU kernel sources of
//! kernels/csrc/ops, run on the CPU.

macro_rules! simt_suite {
    ($name:ident, $warp:expr) => {
        mod $name {
            kernel_api::conformance_suite!(
                k3_backend_simt::simt_backend($warp),
                pending = [
                    gemm, rms_norm, gated_rms_norm, l2_norm, attn_res_mix, situ_glu, sigmoid_gate, embedding_gather,
                    kda_gate, kda_prefill, kda_decode,
                    causal_conv1d, moe_router, moe_align, moe_grouped_gemm, moe_combine
                ]
            );
        }
    };
}

simt_suite!(simt32, 32);
simt_suite!(simt64, 64);
