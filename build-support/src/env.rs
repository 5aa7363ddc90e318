//! Environment access and cargo directives.
//!
//! Every environment variable this crate looks at goes through [`BuildEnv::var`], which records
//! the name and emits `cargo::rerun-if-env-changed` for it exactly once, so a build script that
//! uses this crate re-runs whenever anything that could change the result changes. Directives
//! are always collected (tests inspect them) and, for a build script, also printed.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Where variables come from and where directives go.
#[derive(Debug)]
pub struct BuildEnv {
    /// `None`: the process environment; `Some`: a fixed map (tests).
    fixed: Option<BTreeMap<String, OsString>>,
    /// Print directives to stdout (a build script) or only collect them.
    print: bool,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    read: BTreeSet<String>,
    lines: Vec<String>,
}

impl BuildEnv {
    /// For a build script: the process environment, directives printed to stdout.
    pub fn build_script() -> Self {
        BuildEnv { fixed: None, print: true, state: Mutex::new(State::default()) }
    }

    /// The process environment, directives only collected (tests, tools).
    pub fn process_quiet() -> Self {
        BuildEnv { fixed: None, print: false, state: Mutex::new(State::default()) }
    }

    /// A fixed set of variables (everything else unset), directives only collected.
    pub fn from_vars<K: Into<String>, V: Into<OsString>>(vars: impl IntoIterator<Item = (K, V)>) -> Self {
        let fixed = vars.into_iter().map(|(k, v)| (k.into(), v.into())).collect();
        BuildEnv { fixed: Some(fixed), print: false, state: Mutex::new(State::default()) }
    }

    fn with_state<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        // A poisoned lock only means another thread panicked mid-push; the data is still usable.
        let mut guard = match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut guard)
    }

    /// The variable's value if set and not empty; records it for `rerun-if-env-changed`.
    pub fn var_os(&self, name: &str) -> Option<OsString> {
        let first = self.with_state(|s| s.read.insert(name.to_string()));
        if first {
            self.directive(format!("cargo::rerun-if-env-changed={name}"));
        }
        let value = match &self.fixed {
            Some(map) => map.get(name).cloned(),
            None => std::env::var_os(name),
        };
        value.filter(|v| !v.is_empty())
    }

    /// [`var_os`](Self::var_os) as UTF-8 (a non-UTF-8 value counts as unset).
    pub fn var(&self, name: &str) -> Option<String> {
        self.var_os(name).and_then(|v| v.into_string().ok())
    }

    /// A variable read as a path.
    pub fn path(&self, name: &str) -> Option<PathBuf> {
        self.var_os(name).map(PathBuf::from)
    }

    /// `1`, `true`, `yes` or `on` (any case).
    pub fn flag(&self, name: &str) -> bool {
        self.var(name).is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
    }

    /// Emits one directive line (e.g. `cargo::rustc-cfg=x`).
    pub fn directive(&self, line: String) {
        if self.print {
            println!("{line}");
        }
        self.with_state(|s| s.lines.push(line));
    }

    /// A `cargo::warning`, one directive per line of `msg` (cargo shows only the first line of a
    /// multi-line warning otherwise).
    pub fn warning(&self, msg: &str) {
        for line in msg.lines().filter(|l| !l.trim().is_empty()) {
            self.directive(format!("cargo::warning={line}"));
        }
    }

    /// An informational line: printed by a build script (visible with `cargo build -vv`),
    /// collected otherwise, never a directive.
    pub fn note(&self, msg: &str) {
        if self.print {
            println!("k3-build-support: {msg}");
        }
    }

    /// `cargo::rerun-if-changed` for a file or directory.
    pub fn rerun_if_changed(&self, path: &Path) {
        self.directive(format!("cargo::rerun-if-changed={}", path.display()));
    }

    /// Every directive emitted so far, in order.
    pub fn directives(&self) -> Vec<String> {
        self.with_state(|s| s.lines.clone())
    }

    /// Names of every variable read so far (sorted).
    pub fn vars_read(&self) -> Vec<String> {
        self.with_state(|s| s.read.iter().cloned().collect())
    }

    /// `PATH` split into directories.
    pub fn path_dirs(&self) -> Vec<PathBuf> {
        match self.var_os("PATH") {
            Some(p) => std::env::split_paths(&p).collect(),
            None => Vec::new(),
        }
    }

    /// The first executable called `name` on `PATH`.
    pub fn which(&self, name: &str) -> Option<PathBuf> {
        self.path_dirs().into_iter().map(|d| d.join(name)).find(|p| is_executable(p))
    }
}

/// A regular file with an execute bit (on Unix), or any regular file elsewhere.
pub fn is_executable(p: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(p) else { return false };
    if !meta.is_file() {
        return false;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        meta.permissions().mode() & 0o111 != 0
    }
    #[cfg(not(unix))]
    {
        true
    }
}
