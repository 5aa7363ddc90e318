//! Finding the CUDA shared libraries before cudarc touches them.
//!
//! cudarc (dynamic-loading) resolves every function lazily and *panics* when the library or a
//! symbol is missing. Everything in this crate therefore asks this module first:
//! [`Lib::find`] opens the library under the names cudarc would try (the dynamic loader's
//! search: `LD_LIBRARY_PATH`, the ld cache), then, for the toolkit libraries, the `lib64`/`lib`
//! folders of `$CUDA_HOME`, `$CUDA_PATH`, `$CUDA_ROOT`, `$CUDA_TOOLKIT_ROOT_DIR` and
//! `/usr/local/cuda`. A library found by full path is kept loaded for the life of the process,
//! so cudarc's own later `dlopen("libnvrtc.so.13")` finds it by its soname. [`Lib::has`] checks
//! a symbol before cudarc would load it.
//!
//! An explicit library ([`Lib::from_env`]: `K3_CUDA_DRIVER_LIBRARY`, `K3_CUBLASLT_LIBRARY`, full
//! paths) is opened first and replaces the search, by the same mechanism: its soname must be
//! the first name cudarc tries (`libcuda.so`, `libcublasLt.so`), which is checked, so cudarc
//! never mixes in another library. This is how the emulator-backed stand-ins (`standin/`) are
//! selected; nothing else finds them.

use libloading::Library;
use std::path::{Path, PathBuf};

/// The dynamic loader's handle for `path` (the same value for every name of one loaded object).
/// The reference it takes is never released: these libraries stay loaded for the process.
fn raw_handle(path: &Path) -> Result<usize, String> {
    // SAFETY: as for every library load here; the object is already loaded or is a CUDA library.
    let l = unsafe { libloading::os::unix::Library::new(path) }.map_err(|e| e.to_string())?;
    Ok(l.into_raw() as usize)
}

/// An opened library: where it came from and the handle (kept open for the process).
#[derive(Debug)]
pub struct Lib {
    /// The name or path it was opened under.
    pub found_as: String,
    lib: Library,
}

/// A library that could not be opened, with every place searched.
#[derive(Clone, Debug)]
pub struct NotFound {
    pub searched: Vec<String>,
}

impl NotFound {
    /// `libcuda.so, libcuda.so.1, ... (searched with the dynamic loader)`, shortened for messages.
    pub fn describe(&self) -> String {
        let mut unique: Vec<&str> = Vec::new();
        for s in &self.searched {
            if !unique.contains(&s.as_str()) {
                unique.push(s);
            }
        }
        let more = unique.len().saturating_sub(12);
        let shown = &unique[..unique.len() - more];
        if more > 0 {
            format!("{} and {more} more", shown.join(", "))
        } else {
            shown.join(", ")
        }
    }
}

/// Toolkit roots named by the usual environment variables, then `/usr/local/cuda`.
pub fn toolkit_roots() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDA_TOOLKIT_ROOT_DIR"]
        .iter()
        .filter_map(|v| std::env::var_os(v).filter(|s| !s.is_empty()).map(PathBuf::from))
        .collect();
    roots.push(PathBuf::from("/usr/local/cuda"));
    roots.dedup();
    roots
}

impl Lib {
    /// Opens `stem` (`cuda`, `nvrtc`, `cublasLt`) under cudarc's candidate names; with
    /// `search_toolkit`, also `lib{stem}.so*` files in the toolkit roots' `lib64`/`lib`.
    pub fn find(stem: &str, search_toolkit: bool) -> Result<Lib, NotFound> {
        let names = cudarc::get_lib_name_candidates(stem);
        for name in &names {
            // SAFETY: loading a CUDA library runs its initialisers, which is what using it means.
            if let Ok(lib) = unsafe { Library::new(name) } {
                return Ok(Lib { found_as: name.clone(), lib });
            }
        }
        let mut searched: Vec<String> = names;
        if search_toolkit {
            let prefix = format!("lib{stem}.so");
            for root in toolkit_roots() {
                for sub in ["lib64", "lib", "lib/x64"] {
                    let dir = root.join(sub);
                    searched.push(format!("{}/{prefix}*", dir.display()));
                    let Ok(rd) = std::fs::read_dir(&dir) else { continue };
                    let mut hits: Vec<PathBuf> = rd
                        .filter_map(|e| e.ok().map(|e| e.path()))
                        .filter(|p| {
                            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                                n == prefix || (n.starts_with(&format!("{prefix}.")) && !n.contains("alt"))
                            })
                        })
                        .collect();
                    // Shortest name first: libnvrtc.so.13 before libnvrtc.so.13.5.37.
                    hits.sort_by_key(|p| p.as_os_str().len());
                    for p in hits {
                        // SAFETY: as above. While this handle lives (callers keep it in a
                        // static), cudarc's later dlopen by soname matches the loaded object.
                        if let Ok(lib) = unsafe { Library::new(&p) } {
                            return Ok(Lib { found_as: p.display().to_string(), lib });
                        }
                    }
                }
            }
        }
        Err(NotFound { searched })
    }

    /// The library named by the environment variable `var` (a full path), when it is set: opened,
    /// and checked to be what cudarc's own lookup of `stem` opens (the first of its candidate
    /// names that loads must resolve to this very object). `None` when `var` is unset or empty.
    pub fn from_env(var: &str, stem: &str) -> Option<Result<Lib, String>> {
        let raw = std::env::var_os(var).filter(|v| !v.is_empty())?;
        let path = PathBuf::from(&raw);
        Some(Self::open_explicit(var, &path, stem))
    }

    fn open_explicit(var: &str, path: &Path, stem: &str) -> Result<Lib, String> {
        let shown = format!("{var}={}", path.display());
        if !path.is_absolute() {
            return Err(format!("{shown}: must be an absolute path"));
        }
        // SAFETY: loading the named library runs its initialisers, which is what using it means.
        let lib = unsafe { Library::new(path) }.map_err(|e| format!("{shown} cannot be loaded: {e}"))?;
        let ours = raw_handle(path).map_err(|e| format!("{shown}: {e}"))?;
        for name in cudarc::get_lib_name_candidates(stem) {
            match raw_handle(Path::new(&name)) {
                Ok(h) if h == ours => return Ok(Lib { found_as: path.display().to_string(), lib }),
                Ok(_) => {
                    return Err(format!(
                        "{shown} is loaded, but cudarc would open another library as `{name}`: give the library the soname `{name}`"
                    ))
                }
                Err(_) => continue,
            }
        }
        Err(format!("{shown} is loaded, but none of cudarc's names for lib{stem} resolves to it: its soname must be lib{stem}.so"))
    }

    /// Whether the library exports `symbol`.
    pub fn has(&self, symbol: &str) -> bool {
        // SAFETY: only the address is looked up; nothing is called.
        unsafe { self.lib.get::<*const ()>(symbol.as_bytes()).is_ok() }
    }

    /// A function of the library, for entry points the pinned bindings do not declare.
    ///
    /// # Safety
    /// `T` must be the function's exact C signature.
    pub unsafe fn function<T: Copy>(&self, symbol: &str) -> Option<T> {
        // SAFETY: forwarded from the caller; the library stays loaded while `self` lives (the
        // callers keep it in a static).
        unsafe { self.lib.get::<T>(symbol.as_bytes()).ok().map(|s| *s) }
    }

    /// The symbols of `list` this library lacks.
    pub fn missing<'a>(&self, list: &[&'a str]) -> Vec<&'a str> {
        list.iter().copied().filter(|s| !self.has(s)).collect()
    }

    /// The folder the library was loaded from, when it was found by path.
    pub fn dir(&self) -> Option<PathBuf> {
        let p = PathBuf::from(&self.found_as);
        p.is_absolute().then(|| p.parent().map(PathBuf::from)).flatten()
    }
}
