//! Helpers shared by the model-k3 integration tests: one decode step for the graph-capture tests
//! (`decode_step`); for the hardening tests, temporary folders, the tiny checkpoint and edits of
//! it, and the `k3` binary run as a child process under a memory cap and a timeout (so a hang, a
//! signal or unbounded memory is a test failure, not a stuck CI job), and the bad-input
//! generators (`mutate`, `requests`).
#![allow(dead_code)]

pub mod decode_step;
pub mod mutate;
pub mod requests;

use model_k3::tiny::write_tiny_checkpoint;
use serde_json::Value;
use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A fresh, empty folder per call (tests run in parallel, and in several processes).
pub fn tmp(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("k3-hardening-{}-{tag}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A fresh tiny checkpoint (MXFP4 experts, seed 7) in its own folder.
pub fn tiny(tag: &str) -> PathBuf {
    let d = tmp(tag).join("ckpt");
    write_tiny_checkpoint(&d, 7, false).unwrap();
    d
}

/// Edits `DIR/config.json` (its `text_config`).
pub fn edit_config(dir: &Path, f: impl FnOnce(&mut Value)) {
    let p = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v["text_config"]);
    std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

/// The shard file holding `tensor` (full name), from the index.
pub fn shard_of(dir: &Path, tensor: &str) -> PathBuf {
    let index: Value = serde_json::from_str(&std::fs::read_to_string(dir.join(model_k3::checkpoint::INDEX_FILE)).unwrap()).unwrap();
    dir.join(index["weight_map"][tensor].as_str().unwrap_or_else(|| panic!("{tensor} not in the index")))
}

/// Rewrites the payload of one tensor in place (same dtype, shape and size: the header and the
/// index stay valid, only the values change).
pub fn patch_tensor(dir: &Path, tensor: &str, f: impl FnOnce(&mut [u8])) {
    let p = shard_of(dir, tensor);
    let mut bytes = std::fs::read(&p).unwrap();
    let (n, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let (s, e) = meta.info(tensor).unwrap().data_offsets;
    f(&mut bytes[8 + n + s..8 + n + e]);
    std::fs::write(&p, bytes).unwrap();
}

/// What a child process did.
#[derive(Debug)]
pub struct Ran {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    pub secs: f64,
}

impl Ran {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }
    /// Exited by itself, with a status (no signal, no timeout, no panic message).
    pub fn clean(&self) -> bool {
        self.code.is_some() && !self.timed_out && !self.stderr.contains("panicked")
    }
}

/// Address space given to a child `k3`: generous for the tiny model, far below what any of the
/// issue's runaway allocations reached (6 GB and more).
pub const CHILD_MEMORY_KB: u64 = 4 << 20;

/// Runs the `k3` binary with `args` under `ulimit -v` and a wall-clock `timeout`.
pub fn k3<S: AsRef<OsStr>>(args: &[S], env: &[(&str, &str)], timeout: Duration) -> Ran {
    k3_in(None, args, env, timeout)
}

/// As [`k3`], in the working folder `cwd`.
pub fn k3_in<S: AsRef<OsStr>>(cwd: Option<&Path>, args: &[S], env: &[(&str, &str)], timeout: Duration) -> Ran {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg("ulimit -v \"$1\" && shift && exec \"$@\"").arg("sh").arg(CHILD_MEMORY_KB.to_string());
    cmd.arg(env!("CARGO_BIN_EXE_k3")).args(args);
    cmd.envs(env.iter().copied()).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    if let Some(d) = cwd {
        cmd.current_dir(d);
    }
    run_with_timeout(cmd, timeout)
}

/// Runs `cmd` (stdout and stderr piped), killing it after `timeout`.
pub fn run_with_timeout(mut cmd: Command, timeout: Duration) -> Ran {
    let start = Instant::now();
    let mut child = cmd.spawn().unwrap();
    let read = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = r.read_to_end(&mut s);
            String::from_utf8_lossy(&s).into_owned()
        })
    };
    let out = read(Box::new(child.stdout.take().unwrap()));
    let err = read(Box::new(child.stderr.take().unwrap()));
    let mut timed_out = false;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > timeout {
            timed_out = true;
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    use std::os::unix::process::ExitStatusExt;
    Ran {
        code: status.code(),
        signal: status.signal(),
        timed_out,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
        secs: start.elapsed().as_secs_f64(),
    }
}

/// Makes a FIFO at `path` (the `mkfifo` tool).
pub fn mkfifo(path: &Path) {
    let st = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(st.success(), "mkfifo {}", path.display());
}
