//! Kernel sources and the headers they may include.

use std::path::{Path, PathBuf};

/// Extensions of files that `#include` can pull into a kernel (hashed into every cache key).
pub const HEADER_EXTS: &[&str] = &["h", "cuh", "hpp", "hh", "inc", "inl"];

/// Files under `dir` (recursively, sorted, symlinked directories not followed) whose extension
/// is one of `exts`, skipping directories whose name is in `skip_dirs`.
pub fn find_files(dir: &Path, exts: &[&str], skip_dirs: &[&str]) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    walk(dir, exts, skip_dirs, &mut out)?;
    out.sort();
    Ok(out)
}

fn walk(dir: &Path, exts: &[&str], skip_dirs: &[&str], out: &mut Vec<PathBuf>) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        let path = entry.path();
        let Ok(ft) = entry.file_type() else { continue };
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if ft.is_dir() {
            if !skip_dirs.contains(&name.as_ref()) && !name.starts_with('.') {
                walk(&path, exts, skip_dirs, out)?;
            }
        } else if path.extension().and_then(|e| e.to_str()).is_some_and(|e| exts.contains(&e)) {
            out.push(path);
        }
    }
    Ok(())
}

/// Every kernel translation unit (`*.cu`) under a dialect source tree such as
/// `kernels/csrc`, skipping the dialect's own header directory `k3/`.
pub fn kernel_sources(csrc: &Path) -> Result<Vec<PathBuf>, String> {
    find_files(csrc, &["cu"], &["k3"])
}

/// A kernel listed with `K3_EXPORT(name)` in a dialect source, with the condition of the
/// innermost `#if`/`#ifdef` around it (`K3_WARP_SIZE == 64`), if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Export {
    pub name: String,
    pub condition: Option<String>,
}

/// The `K3_EXPORT` lines of a source text, in order.
pub fn kernel_exports(text: &str) -> Vec<Export> {
    let mut conds: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("#if") {
            conds.push(rest.trim().trim_start_matches("def").trim().to_string());
        } else if t.starts_with("#endif") {
            conds.pop();
        } else if let Some(rest) = t.strip_prefix("K3_EXPORT(") {
            if let Some(name) = rest.split(')').next() {
                out.push(Export { name: name.trim().to_string(), condition: conds.last().cloned() });
            }
        }
    }
    out
}

/// Whether an export is compiled for a target of this warp size: unconditional, or under
/// `#if K3_WARP_SIZE == 64` on a wave64 target.
pub fn export_present(e: &Export, warp64: bool) -> bool {
    e.condition.is_none() || (warp64 && e.condition.as_deref() == Some("K3_WARP_SIZE == 64"))
}

/// Every header under the include directories (sorted, deduplicated).
pub fn headers(include_dirs: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut all = Vec::new();
    for d in include_dirs {
        all.extend(find_files(d, HEADER_EXTS, &[])?);
    }
    all.sort();
    all.dedup();
    Ok(all)
}

/// Every directory under `dir`, itself included (for `rerun-if-changed`, so that an added file
/// is noticed).
pub fn dirs_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    if let Ok(entries) = std::fs::read_dir(dir) {
        let mut subdirs: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect();
        subdirs.sort();
        for s in subdirs {
            out.extend(dirs_under(&s));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_with_their_conditions() {
        let src = "K3_KERNEL void a() {}\nK3_EXPORT(a);\n#if K3_WARP_SIZE == 64\nK3_EXPORT( b );\n#ifdef X\nK3_EXPORT(c);\n#endif\n#endif\nK3_EXPORT(d);\n";
        let e = kernel_exports(src);
        let names: Vec<(&str, Option<&str>)> = e.iter().map(|e| (e.name.as_str(), e.condition.as_deref())).collect();
        assert_eq!(names, [("a", None), ("b", Some("K3_WARP_SIZE == 64")), ("c", Some("X")), ("d", None)]);
        assert!(export_present(&e[1], true) && !export_present(&e[1], false));
        assert!(!export_present(&e[2], true), "an unknown condition is never assumed");
    }
}
