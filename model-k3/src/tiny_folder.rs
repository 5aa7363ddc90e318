//! The tiny checkpoint's folder: written to a temporary sibling and renamed into place, a
//! completion marker written last, writers taking turns through a lock on the parent folder, and
//! the classification `k3 demo` uses to tell a complete folder from a half-made one (a writer of
//! an older version killed half-way) and from a folder that is not the tiny checkpoint at all
//! (never replaced).

use crate::checkpoint::{shard_file_name, INDEX_FILE};
use crate::config::{K3Config, TINY_CONFIG_JSON};
use crate::error::{ModelError, Result};
use crate::files::{read_text_capped, temp_prefix, temp_sibling};
use crate::limits::CONFIG_FILE_MAX;
use crate::tiny::write_files;
use std::path::Path;

/// Written last into a tiny checkpoint folder: a folder with it is complete.
pub const COMPLETE_MARKER: &str = ".k3-tiny-complete";

/// What [`ensure_tiny_checkpoint`] found and did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ensured {
    /// A complete tiny checkpoint was already there.
    Existing,
    /// `DIR` is not a tiny checkpoint folder (a real checkpoint, say): used as it is.
    NotTiny,
    /// The folder was missing or empty: written (this many tensors).
    Made(usize),
    /// A half-made tiny checkpoint (why) was found and written again (this many tensors).
    Remade { why: String, tensors: usize },
}

/// `k3 demo`'s checkpoint: makes the tiny checkpoint in `dir` when it is missing, empty or
/// half-made (a killed writer of an older version, files removed by hand), and leaves a
/// complete one, or any folder that is not a tiny checkpoint, alone. Processes that run this at
/// the same time on the same `dir` take turns (a lock on the parent folder), so each finds
/// either nothing or the complete folder.
pub fn ensure_tiny_checkpoint(dir: &Path, seed: u64, bf16_twin: bool) -> Result<Ensured> {
    // Fast path without the lock: a complete folder is never modified by this function.
    if tiny_state(dir)? == TinyState::Complete {
        return Ok(Ensured::Existing);
    }
    let _lock = lock_parent(dir)?;
    match tiny_state(dir)? {
        TinyState::Complete => Ok(Ensured::Existing),
        TinyState::Foreign(_) => Ok(Ensured::NotTiny),
        TinyState::Missing => install(dir, seed, bf16_twin).map(Ensured::Made),
        TinyState::HalfMade(why) => install(dir, seed, bf16_twin).map(|tensors| Ensured::Remade { why, tensors }),
    }
}

/// What a path holds, as far as the tiny checkpoint is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TinyState {
    /// Nothing there, or an empty folder.
    Missing,
    /// Every file of the tiny checkpoint, with the completion marker (or, for a folder written
    /// before the marker existed, a checkpoint the inspector passes).
    Complete,
    /// Only files the tiny writer makes, config.json (if present) the tiny config, but not
    /// complete: why.
    HalfMade(String),
    /// Anything else: why it is not a tiny checkpoint folder.
    Foreign(String),
}

/// Classifies `dir` (see [`TinyState`]).
pub fn tiny_state(dir: &Path) -> Result<TinyState> {
    let meta = match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(TinyState::Missing),
        other => other.map_err(|e| ModelError::io(dir, e))?,
    };
    if !meta.is_dir() {
        return Ok(TinyState::Foreign("is not a folder".into()));
    }
    let cfg = K3Config::from_json_str(TINY_CONFIG_JSON)?;
    let n_shards = cfg.num_layers + 1;
    let mut ours: Vec<String> = (0..n_shards).map(|i| shard_file_name(i, n_shards)).collect();
    ours.extend(["config.json", INDEX_FILE, COMPLETE_MARKER].map(String::from));
    let mut present = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| ModelError::io(dir, e))? {
        let name = entry.map_err(|e| ModelError::io(dir, e))?.file_name().to_string_lossy().into_owned();
        if !ours.contains(&name) {
            return Ok(TinyState::Foreign(format!("holds `{name}`, which is not a file of the tiny checkpoint")));
        }
        present.push(name);
    }
    if present.is_empty() {
        return Ok(TinyState::Missing);
    }
    let cfg_path = dir.join("config.json");
    if present.iter().any(|n| n == "config.json") {
        match read_text_capped(&cfg_path, CONFIG_FILE_MAX, "model_k3::limits::CONFIG_FILE_MAX") {
            Ok(text) if text == TINY_CONFIG_JSON => {}
            Ok(_) => return Ok(TinyState::Foreign("its config.json is not the tiny config".into())),
            Err(e) => return Ok(TinyState::Foreign(format!("its config.json cannot be read: {e}"))),
        }
    }
    if present.iter().any(|n| n == COMPLETE_MARKER) {
        return Ok(TinyState::Complete);
    }
    let missing: Vec<&String> = ours.iter().filter(|n| *n != COMPLETE_MARKER && !present.contains(n)).collect();
    if let Some(first) = missing.first() {
        return Ok(TinyState::HalfMade(format!("{} of its files are missing, `{first}` first, and it has no completion marker", missing.len())));
    }
    // Every file is there but no marker: written before the marker existed, or cut short while
    // writing the last file. The inspector tells the two apart.
    match crate::inspect::inspect_dir(dir) {
        Ok(r) if r.ok() => Ok(TinyState::Complete),
        Ok(r) => Ok(TinyState::HalfMade(format!("no completion marker, and the inspector finds: {}", r.deviations[0]))),
        Err(e) => Ok(TinyState::HalfMade(format!("no completion marker, and it does not open: {e}"))),
    }
}

/// Writes the checkpoint to a temporary sibling of `out` and renames it into place (replacing a
/// missing, empty or earlier tiny folder: the caller holds the parent's lock and has checked).
pub(crate) fn install(out: &Path, seed: u64, bf16_twin: bool) -> Result<usize> {
    let tmp = temp_sibling(out, "tmp");
    let result = std::fs::create_dir(&tmp)
        .map_err(|e| ModelError::io(&tmp, e))
        .and_then(|()| write_files(&tmp, seed, bf16_twin))
        .and_then(|n| {
            if std::fs::symlink_metadata(out).is_ok() {
                // An empty folder is replaced by the rename itself; an earlier tiny folder is
                // moved aside first, then removed.
                let old = temp_sibling(out, "old");
                std::fs::rename(out, &old).map_err(|e| ModelError::io(out, e))?;
                let _ = std::fs::remove_dir_all(&old);
            }
            std::fs::rename(&tmp, out).map_err(|e| ModelError::io(out, e))?;
            Ok(n)
        });
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

/// Holds an exclusive lock on the folder that contains `path` until dropped (Unix `flock`,
/// released by the kernel when the process dies, so a killed writer never leaves it held).
/// Temporary folders of writers that died while holding it are removed once it is taken.
pub(crate) fn lock_parent(path: &Path) -> Result<ParentLock> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let lock = ParentLock::take(&parent).map_err(|e| ModelError::io(&parent, e))?;
    let stale = temp_prefix(path);
    if let Ok(entries) = std::fs::read_dir(&parent) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(&stale) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    Ok(lock)
}

/// An open handle on a folder with an exclusive `flock` (no-op on non-Unix systems, where
/// concurrent writers are not serialised).
pub(crate) struct ParentLock(#[allow(dead_code)] std::fs::File);

impl ParentLock {
    fn take(dir: &Path) -> std::io::Result<Self> {
        let f = std::fs::File::open(dir)?;
        #[cfg(unix)]
        {
            use std::os::fd::AsRawFd;
            // SAFETY: `f` owns a valid open descriptor for the duration of the call.
            let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
            if rc != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(ParentLock(f))
    }
}
