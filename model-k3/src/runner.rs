//! Loading a model and generating with it: chunked prefill (carrying KDA and conv states across
//! chunks), prefix reuse when a prompt exactly extends what a live sequence was fed, greedy
//! decoding, and batched decode over many sequences.

use crate::checkpoint::Checkpoint;
use crate::error::{ModelError, Result};
use crate::exec::ModelBackend;
use crate::model::{K3Model, ModelOptions};
use crate::weights::ModelWeights;
use kernel_api::HostTensor;
use std::path::Path;

/// Opens a checkpoint and loads it onto `backend`. `progress(done_bytes, total_bytes)` is called
/// after every tensor upload.
pub fn load_model<B: ModelBackend>(dir: &Path, backend: B, opts: ModelOptions, progress: &mut dyn FnMut(u64, u64)) -> Result<K3Model<B>> {
    let ck = Checkpoint::open(dir)?;
    if let Some(p) = ck.problems.first() {
        return Err(ModelError::checkpoint(dir, format!("inconsistent checkpoint: {p} (run `k3 inspect` for all deviations)")));
    }
    let total: u64 = ck.tensors.values().map(|e| (e.end - e.start) as u64).sum();
    let mut done = 0u64;
    let weights = ModelWeights::load(&ck, &backend, &mut |b| {
        done += b as u64;
        progress(done.min(total), total);
    })?;
    Ok(K3Model::new(backend, ck.config.clone(), weights, opts)?)
}

/// Index of the largest value (lowest index on ties): greedy sampling.
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// What one generation produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    pub tokens: Vec<u32>,
    /// Logits `[fed_positions, vocab]` f32 of every position fed in this call (the new prompt
    /// tokens, then every generated token but the last).
    pub logits: Vec<f32>,
    pub vocab: usize,
    /// Prompt tokens reused from the live sequence instead of recomputed.
    pub reused: usize,
}

impl Generation {
    pub fn rows(&self) -> usize {
        if self.vocab == 0 {
            0
        } else {
            self.logits.len() / self.vocab
        }
    }
}

impl<B: ModelBackend> K3Model<B> {
    /// Feeds `prompt` to sequence `id` (reusing its cache when the prompt extends what it was
    /// fed, else restarting it) in chunks of at most `chunk` tokens, then generates `max_new`
    /// tokens greedily.
    pub fn generate(&mut self, id: u64, prompt: &[u32], max_new: usize, chunk: usize) -> Result<Generation> {
        if prompt.is_empty() {
            return Err(kernel_api::Error::invalid("prompt", "must hold at least one token").into());
        }
        let chunk = chunk.max(1);
        let reused = match self.sequence(id).and_then(|s| s.reusable_prefix(prompt)) {
            Some(n) => n,
            None => {
                self.release(id);
                self.add_sequence(id)?;
                0
            }
        };
        let vocab = self.cfg.vocab_size;
        let mut logits = Vec::new();
        let mut last: Vec<f32> = Vec::new();
        for piece in prompt[reused..].chunks(chunk) {
            let out = self.forward(&[(id, piece)])?.to_f32();
            last = out[out.len() - vocab..].to_vec();
            logits.extend(out);
        }
        let mut tokens = Vec::with_capacity(max_new);
        for i in 0..max_new {
            let next = argmax(&last);
            tokens.push(next);
            if i + 1 == max_new {
                break;
            }
            let out = self.forward(&[(id, &[next])])?.to_f32();
            last.clone_from(&out);
            logits.extend(out);
        }
        Ok(Generation { tokens, logits, vocab, reused })
    }

    /// One decode step for many sequences at once: feeds `tokens[i]` to `ids[i]` and returns
    /// the logits `[ids.len(), vocab]`.
    pub fn decode_batch(&mut self, ids: &[u64], tokens: &[u32]) -> Result<HostTensor> {
        if ids.len() != tokens.len() {
            return Err(kernel_api::Error::invalid("tokens", format!("{} tokens for {} sequences", tokens.len(), ids.len())).into());
        }
        let batch: Vec<(u64, &[u32])> = ids.iter().zip(tokens).map(|(&i, t)| (i, std::slice::from_ref(t))).collect();
        Ok(self.forward(&batch)?)
    }
}

/// Writes a 2-D f32 array as `.npy` (format 1.0, little-endian, C order).
pub fn write_npy(path: &Path, rows: usize, cols: usize, data: &[f32]) -> Result<()> {
    if rows * cols != data.len() {
        return Err(ModelError::checkpoint(path, format!("{} values for a {rows}x{cols} array", data.len())));
    }
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
    // Magic (6) + version (2) + header length (2) + header + '\n' is a multiple of 64.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + data.len() * 4);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in data {
        out.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(path, out).map_err(|e| ModelError::io(path, e))
}
