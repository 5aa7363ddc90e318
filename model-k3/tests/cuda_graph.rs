//! CUDA graph capture of one decode step at the tiny model's dims (device only; skips with a
//! printed reason when there is no CUDA device). The step and the check are in
//! `common/decode_step.rs`, shared with the HIP-graph test.
#![cfg(feature = "cuda")]

mod common;

use k3_backend_cuda::{cuda_backend, CudaBackend};
use kernel_api::Error;

fn device() -> Option<CudaBackend> {
    match cuda_backend(0) {
        Ok(b) => Some(b),
        Err(Error::Unavailable { why }) => {
            println!("skipped: no CUDA device: {why}");
            None
        }
        Err(e) => panic!("the probe must answer Ok or Unavailable, got {e}"),
    }
}

#[test]
fn tiny_decode_step_replays_from_a_cuda_graph_bit_identically() {
    let Some(b) = device() else { return };
    let rt = b.runtime();
    common::decode_step::replays_bit_identically(&b, |s| rt.begin_capture(s), |s| rt.end_capture(s), |g, s| rt.replay(g, s));
}
