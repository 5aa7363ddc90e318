//! Finding the ROCm shared libraries: libamdhip64, libhiprtc and libhipblaslt, opened with
//! libloading and kept loaded for the life of the process.
//!
//! Search order for each library `lib<stem>`:
//! 1. its override variable (`K3_HIP_LIBRARY`, `K3_HIPBLASLT_LIBRARY`): a full path, used alone;
//! 2. the `lib/` folder of `$ROCM_PATH`, `$HIP_PATH`, then `/opt/rocm/lib`, each soname in turn;
//! 3. the dynamic loader (`LD_LIBRARY_PATH`, the ld cache), each soname in turn.
//!
//! Sonames: `lib<stem>.so`, then the major versions newest first (`.so.7`, `.so.6`, `.so.5` for
//! the HIP runtime and hiprtc). Every place tried is kept, so "not found" names all of them.

use libloading::Library;
use std::path::{Path, PathBuf};

/// A library the process keeps loaded, and where it came from.
#[derive(Debug)]
pub struct Lib {
    /// The full path or loader name it was opened under.
    pub found_as: String,
    pub lib: Library,
}

/// Which library to look for and how.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    /// `amdhip64`, `hiprtc`, `hipblaslt`.
    pub stem: &'static str,
    /// Sonames after the bare `.so`, newest first (`7`, `6`, `5`).
    pub majors: &'static [&'static str],
    /// The variable that names the library by full path, overriding the search.
    pub override_var: Option<&'static str>,
}

pub const HIP: Spec = Spec { stem: "amdhip64", majors: &["7", "6", "5"], override_var: Some("K3_HIP_LIBRARY") };
pub const HIPRTC: Spec = Spec { stem: "hiprtc", majors: &["7", "6", "5"], override_var: None };
pub const HIPBLASLT: Spec = Spec { stem: "hipblaslt", majors: &["1", "0"], override_var: Some("K3_HIPBLASLT_LIBRARY") };

impl Spec {
    /// `libamdhip64.so`, `libamdhip64.so.7`, ...
    pub fn sonames(&self) -> Vec<String> {
        std::iter::once(format!("lib{}.so", self.stem)).chain(self.majors.iter().map(|m| format!("lib{}.so.{m}", self.stem))).collect()
    }
}

/// The ROCm `lib/` folders searched before the loader: `$ROCM_PATH/lib`, `$HIP_PATH/lib`,
/// `/opt/rocm/lib` (unset variables skipped, duplicates dropped).
pub fn rocm_lib_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = ["ROCM_PATH", "HIP_PATH"]
        .iter()
        .filter_map(|v| std::env::var_os(v).filter(|s| !s.is_empty()).map(|s| PathBuf::from(s).join("lib")))
        .collect();
    dirs.push(PathBuf::from("/opt/rocm/lib"));
    let mut unique: Vec<PathBuf> = Vec::new();
    for d in dirs {
        if !unique.contains(&d) {
            unique.push(d);
        }
    }
    unique
}

/// Why a library could not be opened: every place tried, and the loader's error for files that
/// exist but did not load.
#[derive(Clone, Debug, Default)]
pub struct NotFound {
    pub searched: Vec<String>,
    pub failures: Vec<String>,
}

impl NotFound {
    /// One line: `searched a, b, c` plus any load errors.
    pub fn describe(&self) -> String {
        let mut s = format!("searched {}", self.searched.join(", "));
        if !self.failures.is_empty() {
            s.push_str(&format!("; could not load {}", self.failures.join("; ")));
        }
        s
    }
}

fn open(path_or_name: &str) -> Result<Library, String> {
    // SAFETY: loading a ROCm library runs its initialisers, which is what using it means.
    unsafe { Library::new(path_or_name) }.map_err(|e| e.to_string())
}

/// Opens the library `spec` names, following the search order of the module docs.
pub fn find(spec: &Spec) -> Result<Lib, NotFound> {
    find_in(spec, &rocm_lib_dirs(), true)
}

/// [`find`] over the given folders; `loader` adds the dynamic loader's search.
pub fn find_in(spec: &Spec, dirs: &[PathBuf], loader: bool) -> Result<Lib, NotFound> {
    let mut nf = NotFound::default();
    if let Some(var) = spec.override_var {
        if let Some(path) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            let shown = Path::new(&path).display().to_string();
            return match open(&shown) {
                Ok(lib) => Ok(Lib { found_as: shown, lib }),
                Err(e) => {
                    nf.searched.push(format!("{var}={shown}"));
                    nf.failures.push(format!("{shown}: {e}"));
                    Err(nf)
                }
            };
        }
    }
    let sonames = spec.sonames();
    for dir in dirs {
        nf.searched.push(format!("{}/lib{}.so{{,{}}}", dir.display(), spec.stem, spec.majors.iter().map(|m| format!(".{m}")).collect::<Vec<_>>().join(",")));
        for name in &sonames {
            let p = dir.join(name);
            if !p.exists() {
                continue;
            }
            let shown = p.display().to_string();
            match open(&shown) {
                Ok(lib) => return Ok(Lib { found_as: shown, lib }),
                Err(e) => nf.failures.push(format!("{shown}: {e}")),
            }
        }
    }
    if loader {
        nf.searched.push(format!("the dynamic loader ({})", sonames.join(", ")));
        for name in &sonames {
            if let Ok(lib) = open(name) {
                return Ok(Lib { found_as: name.clone(), lib });
            }
        }
    }
    Err(nf)
}

impl Lib {
    /// Whether the library exports `symbol`.
    pub fn has(&self, symbol: &str) -> bool {
        // SAFETY: only the address is looked up; nothing is called.
        unsafe { self.lib.get::<*const ()>(symbol).is_ok() }
    }

    /// One function of the library outside the generated tables.
    ///
    /// # Safety
    /// `T` must be the function's exact C signature.
    pub unsafe fn function<T: Copy>(&self, symbol: &str) -> Option<T> {
        // SAFETY: forwarded from the caller; the library stays loaded while `self` lives (the
        // callers keep it in a static).
        unsafe { self.lib.get::<T>(symbol).ok().map(|s| *s) }
    }

    /// The folder the library was loaded from, when it was found by path.
    pub fn dir(&self) -> Option<PathBuf> {
        let p = PathBuf::from(&self.found_as);
        p.is_absolute().then(|| p.parent().map(PathBuf::from)).flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sonames_and_search_description() {
        assert_eq!(HIP.sonames(), ["libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5"]);
        assert_eq!(HIPBLASLT.sonames(), ["libhipblaslt.so", "libhipblaslt.so.1", "libhipblaslt.so.0"]);
        let spec = Spec { stem: "k3-no-such-library", majors: &["7", "6"], override_var: None };
        let nf = find_in(&spec, &[PathBuf::from("/nonexistent/rocm/lib")], true).unwrap_err();
        let d = nf.describe();
        assert!(d.contains("/nonexistent/rocm/lib/libk3-no-such-library.so{,.7,.6}"), "{d}");
        assert!(d.contains("the dynamic loader (libk3-no-such-library.so, libk3-no-such-library.so.7, libk3-no-such-library.so.6)"), "{d}");
    }

    #[test]
    fn a_file_that_is_no_library_is_reported_with_the_loader_error() {
        let dir = std::env::temp_dir().join(format!("k3-rocm-dylib-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("libk3-not-elf.so.6"), b"not an ELF file").expect("write");
        let spec = Spec { stem: "k3-not-elf", majors: &["6"], override_var: None };
        let nf = find_in(&spec, std::slice::from_ref(&dir), false).unwrap_err();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(nf.failures.len(), 1, "{nf:?}");
        assert!(nf.describe().contains("libk3-not-elf.so.6:"), "{}", nf.describe());
    }
}
