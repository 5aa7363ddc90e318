//! The kernel sources as data: every file of `csrc/` embedded by build.rs (include_str!), the
//! sets of `.cu` files a backend loads as one module, and the kernel names a file registers.
//! The GPU backends compile these texts at run time (NVRTC, hiprtc) when they have no embedded
//! binary for the device; the source tree is never read at run time.

mod generated {
    include!(concat!(env!("OUT_DIR"), "/kernel_sources.rs"));
}

pub use generated::SOURCES;
use std::fmt;

/// A group of kernel files loaded as one module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelSet {
    /// `csrc/ops/**.cu`: the op kernels the launchers of this crate call.
    Ops,
    /// `csrc/tests/**.cu`: the dialect's own test kernels.
    Tests,
}

impl KernelSet {
    pub const ALL: [KernelSet; 2] = [KernelSet::Ops, KernelSet::Tests];

    /// The folder of csrc the set's `.cu` files live in.
    pub const fn dir(self) -> &'static str {
        match self {
            KernelSet::Ops => "ops",
            KernelSet::Tests => "tests",
        }
    }

    /// The set's kernel files (paths relative to csrc), sorted.
    pub fn files(self) -> Vec<&'static str> {
        let prefix = format!("{}/", self.dir());
        SOURCES.iter().map(|(p, _)| *p).filter(|p| p.starts_with(&prefix) && p.ends_with(".cu")).collect()
    }
}

impl fmt::Display for KernelSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.dir())
    }
}

/// The embedded text of a csrc file.
pub fn source(path: &str) -> Option<&'static str> {
    SOURCES.iter().find(|(p, _)| *p == path).map(|(_, s)| *s)
}

/// The headers (every embedded file but the `.cu` kernel files), what a run-time compiler is
/// given as its include tree.
pub fn headers() -> impl Iterator<Item = &'static (&'static str, &'static str)> {
    SOURCES.iter().filter(|(p, _)| !p.ends_with(".cu"))
}

/// Kernel names a source registers with `K3_EXPORT(name)` (the dialect's registration macro).
/// `unconditional_only`: only those outside any preprocessor conditional, the kernels every
/// target's build of the file has (`#if K3_WARP_SIZE == 64` blocks are absent from CUDA
/// builds); otherwise also those inside, the kernels some build of the file may have.
pub fn registered_kernels(source: &str, unconditional_only: bool) -> Vec<String> {
    let mut depth = 0usize;
    let mut names = Vec::new();
    for line in source.lines().map(str::trim) {
        if let Some(directive) = line.strip_prefix('#').map(str::trim_start) {
            if directive.starts_with("if") {
                depth += 1;
            } else if directive.starts_with("endif") {
                depth = depth.saturating_sub(1);
            }
            continue;
        }
        if depth > 0 && unconditional_only {
            continue;
        }
        let name = line.strip_prefix("K3_EXPORT(").and_then(|rest| rest.split(')').next()).map(str::trim);
        if let Some(n) = name.filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')) {
            names.push(n.to_string());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_embedded_and_sets_list_kernel_files() {
        assert!(source("k3/compat.h").is_some_and(|s| s.contains("K3_COMPAT_H")));
        assert!(KernelSet::Tests.files().contains(&"tests/reduce.cu"));
        assert!(KernelSet::Ops.files().iter().all(|f| f.starts_with("ops/") && f.ends_with(".cu")));
        assert!(headers().all(|(p, _)| !p.ends_with(".cu")) && headers().any(|(p, _)| *p == "k3/compat.h"));
        assert_eq!(SOURCES.len(), headers().count() + KernelSet::ALL.iter().map(|s| s.files().len()).sum::<usize>());
    }

    #[test]
    fn registered_kernels_with_and_without_conditionals() {
        assert_eq!(registered_kernels(source("tests/reduce.cu").unwrap(), true), ["block_reduce"]);
        // The macro's definitions in the dialect headers are not registrations.
        for h in ["k3/detail/target_cuda.h", "k3/detail/target_hip.h"] {
            assert!(registered_kernels(source(h).unwrap(), false).is_empty(), "{h}");
        }
        let conditional = "K3_EXPORT(a);\n#if K3_WARP_SIZE == 64\nK3_EXPORT(b);\n#endif\n// K3_EXPORT(c);\nK3_EXPORT(d);\n";
        assert_eq!(registered_kernels(conditional, true), ["a", "d"]);
        assert_eq!(registered_kernels(conditional, false), ["a", "b", "d"]);
    }
}
