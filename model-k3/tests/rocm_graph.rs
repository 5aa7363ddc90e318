//! HIP graph capture of one decode step at the tiny model's dims (a HIP device, or the
//! emulator-backed stand-in, which records captures too; skips with a printed reason without
//! one). The step and the check are in
//! `common/decode_step.rs`, shared with the CUDA-graph test.
#![cfg(feature = "rocm")]

mod common;

use k3_backend_rocm::{rocm_backend, RocmBackend};
use kernel_api::Error;

fn device() -> Option<RocmBackend> {
    match rocm_backend(0) {
        Ok(b) => Some(b),
        Err(Error::Unavailable { why }) => {
            println!("skipped: no HIP device: {why}");
            None
        }
        Err(e) => panic!("the probe must answer Ok or Unavailable, got {e}"),
    }
}

#[test]
fn tiny_decode_step_replays_from_a_hip_graph_bit_identically() {
    let Some(b) = device() else { return };
    let rt = b.runtime();
    common::decode_step::replays_bit_identically(&b, |s| rt.begin_capture(s), |s| rt.end_capture(s), |g, s| rt.replay(g, s));
}
