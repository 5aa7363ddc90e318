//! The CPU reference is bit-stable across thread counts (the tolerance policy,
//! `kernel_api::tolerance`): the same request run by `k3 run` with `RAYON_NUM_THREADS` = 1, 2, 3,
//! 4 and 8 (a child process each: the rayon pool is sized once per process) writes the same
//! logits, bit for bit. The request mixes chunked prefill and decode so every op the model uses
//! runs: GEMMs, KDA chunked prefill and decode, MLA absorbed prefill and split-KV decode, MoE.

mod common;

use common::{k3, tiny};
use std::time::Duration;

#[test]
fn cpu_logits_are_bit_identical_for_any_thread_count() {
    let d = tiny("threads");
    let prompt: Vec<String> = (0..70u32).map(|i| (i.wrapping_mul(2654435761) % 509 + 3).to_string()).collect();
    let prompt = prompt.join(",");
    let logits = |threads: &str| {
        let out = d.join(format!("logits-{threads}.npy"));
        let args = ["run", "--model", d.to_str().unwrap(), "--prompt-ids", &prompt, "--max-new-tokens", "24", "--chunk", "29"];
        let r = k3(&[&args[..], &["--logits-out", out.to_str().unwrap(), "--backend", "cpu"]].concat(), &[("RAYON_NUM_THREADS", threads)], Duration::from_secs(120));
        assert!(r.ok(), "{threads} threads: {r:?}");
        std::fs::read(&out).unwrap()
    };
    let one = logits("1");
    assert!(one.len() > 90 * 512 * 4, "{} bytes", one.len());
    for t in ["2", "3", "4", "8"] {
        let other = logits(t);
        let differ = one.chunks_exact(4).zip(other.chunks_exact(4)).filter(|(a, b)| a != b).count();
        assert!(one.len() == other.len() && differ == 0, "{t} threads: {differ} logits differ from 1 thread");
    }
}
