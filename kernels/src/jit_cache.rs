//! The on-disk cache of kernels the GPU backends compile at run time (NVRTC cubins on CUDA,
//! hiprtc code objects on ROCm).
//!
//! Root: `$K3_KERNEL_CACHE_DIR` (`off` disables the cache), else `$XDG_CACHE_HOME/k3-kernels`,
//! else `~/.cache/k3-kernels`. Files are `<vendor>/<file>-<target>-<key>.<ext>`, the key a content
//! hash the backend computes (sources, headers, options, compiler version). Writes go through a
//! temporary file and a rename, so concurrent processes never read half a binary; a cached file
//! that fails the backend's validity check is compiled afresh.

use kernel_api::Result;
use std::path::{Path, PathBuf};

/// What happened with the cache on one compile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    Hit(PathBuf),
    Stored(PathBuf),
    NotStored(String),
}

/// Where compiled kernels are kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelCache {
    dir: Option<PathBuf>,
}

impl KernelCache {
    /// `$K3_KERNEL_CACHE_DIR` (`off` disables), else `$XDG_CACHE_HOME/k3-kernels`, else
    /// `$HOME/.cache/k3-kernels`, else no cache.
    pub fn from_env() -> Self {
        let dir = match std::env::var_os("K3_KERNEL_CACHE_DIR").filter(|v| !v.is_empty()) {
            Some(v) if v == "off" => None,
            Some(v) => Some(PathBuf::from(v)),
            None => std::env::var_os("XDG_CACHE_HOME")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".cache")))
                .map(|c| c.join("k3-kernels")),
        };
        KernelCache { dir }
    }
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        KernelCache { dir: Some(dir.into()) }
    }
    pub fn disabled() -> Self {
        KernelCache { dir: None }
    }
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// `<root>/<vendor>/<file>-<target>-<key>.<ext>` (`file` with every non-alphanumeric
    /// character as `_`), or `None` when the cache is disabled.
    pub fn path(&self, vendor: &str, file: &str, target: &str, key: &str, ext: &str) -> Option<PathBuf> {
        let stem: String = file.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        self.dir.as_ref().map(|d| d.join(vendor).join(format!("{stem}-{target}-{key}.{ext}")))
    }

    /// The binary at `path` when it is there and passes `valid`, else `compile()`'s output,
    /// stored at `path` when it can be.
    pub fn get_or_compile(
        &self,
        path: Option<PathBuf>,
        valid: impl Fn(&[u8]) -> bool,
        compile: impl FnOnce() -> Result<Vec<u8>>,
    ) -> Result<(Vec<u8>, CacheOutcome)> {
        if let Some(p) = &path {
            if let Ok(bytes) = std::fs::read(p) {
                if valid(&bytes) {
                    return Ok((bytes, CacheOutcome::Hit(p.clone())));
                }
            }
        }
        let binary = compile()?;
        let outcome = match &path {
            Some(p) => match store(p, &binary) {
                Ok(()) => CacheOutcome::Stored(p.clone()),
                Err(why) => CacheOutcome::NotStored(why),
            },
            None => CacheOutcome::NotStored("cache disabled".into()),
        };
        Ok((binary, outcome))
    }
}

fn store(path: &Path, bytes: &[u8]) -> std::result::Result<(), String> {
    let dir = path.parent().ok_or("cache path has no folder")?;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot move {} into place: {e}", tmp.display())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_the_compile_once_flow() {
        assert_eq!(KernelCache::disabled().path("hip", "a.cu", "gfx90a", "k", "hsaco"), None);
        let dir = std::env::temp_dir().join(format!("k3-jit-cache-{}", std::process::id()));
        let c = KernelCache::at(&dir);
        assert_eq!(c.dir(), Some(dir.as_path()));
        let p = c.path("cuda", "ops/x.cu", "sm_90a", "00ff", "cubin").expect("path");
        assert_eq!(p, dir.join("cuda").join("ops_x_cu-sm_90a-00ff.cubin"));
        let valid = |b: &[u8]| b.starts_with(b"OK");
        let (b, o) = c.get_or_compile(Some(p.clone()), valid, || Ok(b"OK1".to_vec())).expect("compile");
        assert_eq!((b.as_slice(), o), (&b"OK1"[..], CacheOutcome::Stored(p.clone())));
        let (b, o) = c.get_or_compile(Some(p.clone()), valid, || panic!("must hit")).expect("hit");
        assert_eq!((b.as_slice(), o), (&b"OK1"[..], CacheOutcome::Hit(p.clone())));
        // A damaged entry is compiled afresh.
        std::fs::write(&p, b"bad").expect("damage");
        let (b, _) = c.get_or_compile(Some(p.clone()), valid, || Ok(b"OK2".to_vec())).expect("recompile");
        assert_eq!(b, b"OK2");
        let _ = std::fs::remove_dir_all(&dir);
        let (_, o) = KernelCache::disabled().get_or_compile(None, valid, || Ok(b"OK".to_vec())).expect("no cache");
        assert_eq!(o, CacheOutcome::NotStored("cache disabled".into()));
    }
}
