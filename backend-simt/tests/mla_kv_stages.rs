//! The MLA `*_mma` kernels' KV pipeline at every depth it can take (warp 32, where the copies are
//! deferred to their wait, so a wait that retires too few groups reads stale tiles): on an
//! emulated block with an H200's 227 KiB of shared memory, at the depth the host picks by default
//! (7 stages for fp8 caches, 4 for bf16) and at each depth fixed by `set_mla_kv_stages`, the
//! decode and absorbed-prefill conformance checks that cover every cache format at K3's dims.
//! `cargo test` runs simt32 at 48 KiB, where the default is 3 / 2 stages; this file is what
//! exercises the deeper ones without the CUDA stand-in.

use k3_backend_simt::{simt_backend_from, SimtRuntime};
use kernel_api::conformance::mla_decode::{mla_decode_every_cache_format, mla_prefill_absorbed_matches_oracle};

fn h200_block() -> k3_backend_simt::SimtBackend {
    let rt = SimtRuntime::new(32).and_then(|rt| rt.with_shared_limit(227 * 1024)).expect("simt32 runtime");
    simt_backend_from(rt).expect("simt32 backend")
}

#[test]
fn default_depth_with_an_h200_block() {
    let b = h200_block();
    assert_eq!(b.mla_kv_stages(), None);
    mla_decode_every_cache_format(&b);
    mla_prefill_absorbed_matches_oracle(&b);
}

#[test]
fn every_fixed_depth() {
    let b = h200_block();
    for stages in 2..=8 {
        b.set_mla_kv_stages(Some(stages)).expect("a depth in 2..=8");
        mla_decode_every_cache_format(&b);
        mla_prefill_absorbed_matches_oracle(&b);
    }
    b.set_mla_kv_stages(None).expect("back to the default");
}

#[test]
fn depths_outside_the_range_are_refused() {
    let b = h200_block();
    for bad in [0, 1, 9] {
        let err = b.set_mla_kv_stages(Some(bad)).expect_err("outside 2..=8").to_string();
        assert!(err.contains("kv_stages"), "{err}");
    }
    assert_eq!(b.mla_kv_stages(), None);
}
