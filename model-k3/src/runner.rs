//! Loading a model and generating with it: chunked prefill (carrying KDA and conv states across
//! chunks), prefix reuse when a prompt exactly extends what a live sequence was fed, greedy
//! decoding, and batched decode over many sequences.

use crate::checkpoint::Checkpoint;
use crate::error::{ModelError, Result};
use crate::config::K3Config;
use crate::exec::ModelBackend;
use crate::files::{check_replaceable, write_bytes_replacing};
use crate::inspect::inspect_checkpoint;
use crate::limits::{DEFAULT_MAX_CONTEXT, LOGITS_OUT_MAX_BYTES};
use crate::model::{K3Model, ModelOptions};
use crate::weights::ModelWeights;
use kernel_api::HostTensor;
use std::path::Path;

/// Opens a checkpoint and loads it onto `backend`. `progress(done_bytes, total_bytes)` is called
/// after every tensor upload.
pub fn load_model<B: ModelBackend>(dir: &Path, backend: B, opts: ModelOptions, progress: &mut dyn FnMut(u64, u64)) -> Result<K3Model<B>> {
    let ck = Checkpoint::open(dir)?;
    // The inspector's findings are the loader's preconditions: a checkpoint that deviates from
    // its config (fewer layers in the config than in the shards, a tensor of the wrong shape) is
    // refused before anything is allocated, and every size the loader uses is then backed by
    // bytes that really are in the shards.
    let report = inspect_checkpoint(&ck);
    if let Some(p) = report.deviations.first() {
        let more = report.deviations.len() - 1;
        let more = if more > 0 { format!(" and {more} more") } else { String::new() };
        return Err(ModelError::checkpoint(dir, format!("checkpoint deviates from its config: {p}{more} (run `k3 inspect` for all of them)")));
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
    /// Logits `[rows, vocab]` f32: of every position fed in this call (the new prompt tokens,
    /// then every generated token but the last), or only of the last one when the generation
    /// was asked not to keep them ([`K3Model::generate_with`]).
    pub logits: Vec<f32>,
    pub vocab: usize,
    /// Prompt tokens reused from the live sequence instead of recomputed.
    pub reused: usize,
    /// Positions fed through the model in this call.
    pub positions: usize,
}

impl Generation {
    /// Rows of [`Self::logits`].
    pub fn rows(&self) -> usize {
        if self.vocab == 0 {
            0
        } else {
            self.logits.len() / self.vocab
        }
    }
}

/// The demo's parity verdict: two generations agree when their tokens are equal, every logit
/// on both sides is finite, and the logits' relative RMSE is within `tol`. (A relative RMSE
/// skips positions where both sides are NaN, so finiteness is checked separately: NaN on both
/// sides is never "OK".)
#[derive(Clone, Debug, PartialEq)]
pub struct Parity {
    pub tokens_equal: bool,
    /// Non-finite logits in (the tested run, the reference).
    pub nonfinite: (usize, usize),
    pub rel_rmse: f64,
    pub ok: bool,
}

pub fn parity(tested: &Generation, reference: &Generation, tol: kernel_api::Tolerance) -> Parity {
    let count = |v: &[f32]| v.iter().filter(|x| !x.is_finite()).count();
    let nonfinite = (count(&tested.logits), count(&reference.logits));
    let c = kernel_api::tolerance::compare(&tested.logits, &reference.logits);
    let tokens_equal = tested.tokens == reference.tokens;
    let ok = tokens_equal
        && nonfinite == (0, 0)
        && c.nonfinite_mismatches == 0
        && tested.logits.len() == reference.logits.len()
        && c.rel_rmse <= tol.rel_rmse;
    Parity { tokens_equal, nonfinite, rel_rmse: c.rel_rmse, ok }
}

/// Positions one sequence may hold: the config's `max_position_embeddings`, else
/// [`DEFAULT_MAX_CONTEXT`].
pub fn max_context(cfg: &K3Config) -> usize {
    if cfg.max_position_embeddings > 0 {
        cfg.max_position_embeddings
    } else {
        DEFAULT_MAX_CONTEXT
    }
}

/// Checks a `k3 run` request against the model's config before the checkpoint is loaded (a
/// large model takes minutes to load) and returns the positions the sequence will hold (the
/// cache is sized for them). Errors name the flag: `--prompt-ids` (empty, or a token id outside
/// the vocabulary), `--max-new-tokens` (prompt + new tokens over the model's context, see
/// [`max_context`]), `--chunk` (0), `--kv-scale` (not finite and positive), `--logits-out` (not
/// a file that may be replaced, or the logits of every position over [`LOGITS_OUT_MAX_BYTES`]).
pub fn check_run_request(cfg: &K3Config, prompt: &[u32], max_new: usize, chunk: usize, kv_scale: f32, logits_out: Option<&Path>) -> Result<usize> {
    let invalid = |flag: &str, why: String| -> ModelError { kernel_api::Error::invalid(flag, why).into() };
    if let Some(p) = logits_out {
        check_replaceable(p).map_err(|e| ModelError::io(p, e))?;
    }
    let keep_logits = logits_out.is_some();
    if chunk == 0 {
        return Err(invalid("--chunk", "must be at least 1 token".into()));
    }
    if !(kv_scale.is_finite() && kv_scale > 0.0) {
        return Err(invalid("--kv-scale", format!("must be finite and positive, got {kv_scale}")));
    }
    let prompt_len = prompt.len();
    if prompt_len == 0 {
        return Err(invalid("--prompt-ids", "must hold at least one token".into()));
    }
    if let Some((i, t)) = prompt.iter().enumerate().find(|(_, &t)| t as usize >= cfg.vocab_size) {
        return Err(invalid("--prompt-ids", format!("token {i} is {t}, outside the vocabulary of {} ids", cfg.vocab_size)));
    }
    let context = max_context(cfg);
    let tokens = prompt_len.checked_add(max_new).filter(|&t| t <= context).ok_or_else(|| {
        invalid(
            "--max-new-tokens",
            format!("{prompt_len} prompt tokens + {max_new} new tokens exceed the model's context of {context} positions (max_position_embeddings)"),
        )
    })?;
    // Rows of logits: every fed position (the last generated token is not fed).
    let rows = (tokens - usize::from(max_new > 0)) as u64;
    let bytes = rows.saturating_mul(cfg.vocab_size as u64).saturating_mul(4);
    if keep_logits && bytes > LOGITS_OUT_MAX_BYTES {
        return Err(invalid(
            "--logits-out",
            format!("{rows} positions x {} vocab x 4 bytes = {bytes} bytes of logits, over the limit of {LOGITS_OUT_MAX_BYTES} (model_k3::limits::LOGITS_OUT_MAX_BYTES); generate fewer tokens", cfg.vocab_size),
        ));
    }
    Ok(tokens)
}

/// Fails on the first non-finite value of `logits` (`[rows, vocab]`, row `r` at sequence
/// position `first_position + r`): no token is ever reported from NaN or infinite logits.
fn check_finite(logits: &[f32], vocab: usize, first_position: usize, what: &str) -> Result<()> {
    match logits.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(i) => Err(ModelError::NonFinite {
            what: what.to_string(),
            position: first_position + i / vocab.max(1),
            index: i % vocab.max(1),
            value: logits[i],
        }),
    }
}

impl<B: ModelBackend> K3Model<B> {
    /// Feeds `prompt` to sequence `id` (reusing its cache when the prompt extends what it was
    /// fed, else restarting it) in chunks of at most `chunk` tokens, then generates `max_new`
    /// tokens greedily. Keeps the logits of every fed position.
    pub fn generate(&mut self, id: u64, prompt: &[u32], max_new: usize, chunk: usize) -> Result<Generation> {
        self.generate_with(id, prompt, max_new, chunk, true)
    }

    /// [`Self::generate`]; `keep_logits: false` keeps only the last position's logits (memory
    /// stays bounded by the cache however many tokens are generated). Refuses `chunk` 0 and a
    /// request past the model's context ([`max_context`]); a non-finite logit anywhere is an
    /// error naming its position ([`ModelError::NonFinite`]), never a token.
    pub fn generate_with(&mut self, id: u64, prompt: &[u32], max_new: usize, chunk: usize, keep_logits: bool) -> Result<Generation> {
        if prompt.is_empty() {
            return Err(kernel_api::Error::invalid("prompt", "must hold at least one token").into());
        }
        if chunk == 0 {
            return Err(kernel_api::Error::invalid("chunk", "must be at least 1 token").into());
        }
        let context = max_context(&self.cfg);
        if prompt.len().checked_add(max_new).is_none_or(|t| t > context) {
            return Err(kernel_api::Error::invalid(
                "max_new_tokens",
                format!("{} prompt tokens + {max_new} new tokens exceed the model's context of {context} positions", prompt.len()),
            )
            .into());
        }
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
        let mut position = reused;
        for piece in prompt[reused..].chunks(chunk) {
            let out = self.forward(&[(id, piece)])?.to_f32();
            check_finite(&out, vocab, position, "prompt")?;
            position += piece.len();
            last = out[out.len() - vocab..].to_vec();
            if keep_logits {
                logits.extend(out);
            }
        }
        let mut tokens = Vec::with_capacity(max_new);
        for i in 0..max_new {
            let next = argmax(&last);
            tokens.push(next);
            if i + 1 == max_new {
                break;
            }
            let out = self.forward(&[(id, &[next])])?.to_f32();
            check_finite(&out, vocab, position, &format!("generation step {}", i + 1))?;
            position += 1;
            last.clone_from(&out);
            if keep_logits {
                logits.extend(out);
            }
        }
        if !keep_logits {
            logits = last;
        }
        Ok(Generation { tokens, logits, vocab, reused, positions: position - reused })
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
/// The file is written to a temporary sibling and renamed into place: only a regular file (or
/// a link to one) is ever replaced.
pub fn write_npy(path: &Path, rows: usize, cols: usize, data: &[f32]) -> Result<()> {
    if rows.checked_mul(cols) != Some(data.len()) {
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
    write_bytes_replacing(path, &out).map_err(|e| ModelError::io(path, e))
}
