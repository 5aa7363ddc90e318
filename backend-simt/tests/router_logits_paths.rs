//! The router's two logits paths past one token tile on a bf16 weight: the matrix-unit kernel
//! (`moe_router_logits_mma`, the default) and the CUDA-core one (`moe_router_logits_batched`),
//! which `set_router_matrix_units(false)` selects so `k3-device-bench` can time them side by
//! side. Both must pass the router's conformance checks, at warp 32 and 64.

use k3_backend_simt::{simt_backend_from, SimtRuntime};
use kernel_api::conformance::moe_router::{moe_router_bias_selects_only, moe_router_matches_oracle};

#[test]
fn both_logits_paths_match_the_oracle() {
    for warp in [32, 64] {
        let b = simt_backend_from(SimtRuntime::new(warp).expect("simt runtime")).expect("simt backend");
        for matrix_units in [false, true] {
            b.set_router_matrix_units(matrix_units);
            moe_router_matches_oracle(&b);
            moe_router_bias_selects_only(&b);
        }
    }
}
