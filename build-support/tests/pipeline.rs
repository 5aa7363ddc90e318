//! The build-support pipeline without real toolchains: discovery, skip reasons, cargo
//! directives, the content-hash cache, the job cap, failure reporting, the zig `lld` wrapper
//! and the generated image table, all driven through fake compilers (small shell scripts) and
//! fixed environments, so these run on every machine.
#![cfg(unix)]

use k3_build_support::arch::parse_list;
use k3_build_support::{
    compile_cuda, compile_hip, find_hip_clang, write_image_table, ArtifactKind, BuildEnv, ClangKind, Config, HipArch,
    Platform, Skip,
};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("pipeline").join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

fn write_exe(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("dir");
    std::fs::write(path, text).expect("write script");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// A fake nvcc in `root/bin`: `--version` answers like CUDA; a compile appends one line to
/// `root/calls`, records its concurrency in `root/conc`, fails on a source containing
/// `#error`, else writes its arguments and the source's bytes to the `-o` file. Plus a `g++`.
fn fake_cuda(root: &Path) -> PathBuf {
    let nvcc = root.join("bin/nvcc");
    write_exe(
        &nvcc,
        &format!(
            r#"#!/bin/sh
if [ "$1" = "--version" ]; then echo "nvcc: NVIDIA (R) Cuda compiler driver"; echo "Cuda compilation tools, release 99.1, V99.1.0"; exit 0; fi
R='{root}'
echo call >> "$R/calls"
mkdir -p "$R/running"; touch "$R/running/$$"; ls "$R/running" | wc -l >> "$R/conc"; sleep 0.2; rm -f "$R/running/$$"
out=""; src=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; case "$a" in *.cu) src="$a";; esac; prev="$a"; done
if grep -q '#error' "$src"; then echo "$src(1): error: planted failure" >&2; exit 2; fi
{{ echo "$@"; cat "$src"; }} > "$out"
"#,
            root = root.display()
        ),
    );
    write_exe(&root.join("bin/g++"), "#!/bin/sh\nexit 0\n");
    nvcc
}

/// A fake clang (`clang-19`, LLVM 19) and a fake zig (`zig clang`, LLVM 22) in `dir`.
fn fake_clangs(dir: &Path) {
    let body = |major: u32, shift: &str| {
        format!(
            r#"#!/bin/sh
{shift}
if [ "$1" = "--version" ]; then echo "clang version {major}.1.0"; exit 0; fi
if [ "$1" = "--print-targets" ]; then echo "  Registered Targets:"; echo "    amdgcn      - AMD GCN GPUs"; exit 0; fi
out=""; prev=""; for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
echo "$@" > "$out"
"#
        )
    };
    write_exe(&dir.join("clang-19"), &body(19, ""));
    write_exe(&dir.join("zig"), &body(22, r#"[ "$1" = "clang" ] && shift"#));
}

/// A tiny dialect tree: `k3/a.h`, `tests/one.cu`, `tests/two.cu`.
fn tree(dir: &Path) -> (PathBuf, Vec<PathBuf>) {
    let csrc = dir.join("csrc");
    std::fs::create_dir_all(csrc.join("k3")).expect("dir");
    std::fs::create_dir_all(csrc.join("tests")).expect("dir");
    std::fs::write(csrc.join("k3/a.h"), "// header v1\n").expect("write");
    std::fs::write(csrc.join("tests/one.cu"), "#include \"k3/a.h\"\n// one\n").expect("write");
    std::fs::write(csrc.join("tests/two.cu"), "#include \"k3/a.h\"\n// two\n").expect("write");
    let sources = k3_build_support::kernel_sources(&csrc).expect("sources");
    (csrc, sources)
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map(|s| s.lines().count()).unwrap_or(0)
}

#[test]
fn missing_toolchains_skip_every_target_with_the_places_tried() {
    let dir = scratch("missing");
    let empty = dir.join("empty-path");
    std::fs::create_dir_all(&empty).expect("dir");
    let (csrc, sources) = tree(&dir);
    let env = BuildEnv::from_vars([("PATH", empty.as_os_str())]);
    let cfg = Config::from_env(&env, sources, vec![csrc], dir.join("out"));
    let cuda = compile_cuda(&env, &cfg);
    let hip = compile_hip(&env, &cfg);
    assert_eq!(cuda.iter().map(|o| o.target.as_str()).collect::<Vec<_>>(), ["sm_90a", "sm_100a", "sm_103a"]);
    assert_eq!(hip.iter().map(|o| o.target.as_str()).collect::<Vec<_>>(), ["gfx942", "gfx950"]);
    for o in cuda.iter().chain(&hip) {
        let Err(Skip::NoToolchain(nf)) = &o.result else {
            panic!("{}: expected NoToolchain, got {:?}", o.target, o.result)
        };
        let text = nf.to_string();
        match o.platform {
            Platform::Cuda => {
                for part in
                    ["NVCC unset", "K3_CUDA_HOME unset", "CUDA_HOME unset", "CUDA_PATH unset", "no nvcc on PATH"]
                {
                    assert!(text.contains(part), "{text}");
                }
            }
            Platform::Hip => {
                for part in ["K3_HIP_CLANG unset", "no clang-19", "K3_ZIG unset", "no zig on PATH"] {
                    assert!(text.contains(part), "{text}");
                }
                assert_eq!(text.contains("K3_HIP_CLANG_GFX950 unset"), o.target == "gfx950", "{text}");
            }
        }
    }
    let d = env.directives();
    let warnings: Vec<&String> = d.iter().filter(|l| l.starts_with("cargo::warning=")).collect();
    assert_eq!(warnings.len(), 5, "one warning per target: {warnings:#?}");
    assert!(warnings.iter().any(|w| w.contains("CUDA kernels for sm_100a unavailable: nvcc not found")));
    // Every variable that was looked at is reported to cargo.
    let read = env.vars_read();
    for must in [
        "PATH",
        "NVCC",
        "CUDA_HOME",
        "CUDA_PATH",
        "K3_CUDA_HOME",
        "K3_HIP_CLANG",
        "K3_HIP_CLANG_GFX950",
        "K3_ZIG",
        "K3_CUDA_ARCHS",
        "K3_HIP_ARCHS",
        "K3_KERNEL_CACHE_DIR",
        "DOCS_RS",
    ] {
        assert!(read.iter().any(|r| r == must), "{must} not read: {read:?}");
    }
    for name in read {
        assert!(d.contains(&format!("cargo::rerun-if-env-changed={name}")), "no rerun-if-env-changed for {name}");
    }
}

#[test]
fn an_explicit_variable_that_points_nowhere_is_reported_not_bypassed() {
    let dir = scratch("explicit");
    let root = dir.join("cuda");
    fake_cuda(&root);
    let env = BuildEnv::from_vars([
        ("CUDA_HOME", dir.join("nope").into_os_string()),
        ("PATH", root.join("bin").into_os_string()),
    ]);
    let err = k3_build_support::find_nvcc(&env).expect_err("CUDA_HOME is wrong");
    assert!(err.to_string().contains("CUDA_HOME=") && err.to_string().contains("does not exist"), "{err}");
    // The same nvcc on PATH without a host compiler: named as the reason.
    std::fs::remove_file(root.join("bin/g++")).expect("rm");
    let env = BuildEnv::from_vars([("PATH", root.join("bin").into_os_string())]);
    let err = k3_build_support::find_nvcc(&env).expect_err("no g++");
    assert!(err.to_string().contains("host C++ compiler"), "{err}");
}

#[test]
fn cache_hits_skip_the_compiler_and_any_header_define_or_flag_change_misses() {
    let dir = scratch("cache");
    let root = dir.join("cuda");
    let nvcc = fake_cuda(&root);
    let (csrc, sources) = tree(&dir);
    let env = BuildEnv::from_vars([
        ("NVCC", nvcc.into_os_string()),
        ("PATH", root.join("bin").into_os_string()),
        ("K3_CUDA_ARCHS", "90a,100a".into()),
        ("K3_KERNEL_JOBS", "2".into()),
    ]);
    let mut cfg = Config::from_env(&env, sources, vec![csrc.clone()], dir.join("out"));
    assert_eq!(cfg.jobs, 2);
    let calls = root.join("calls");
    let run = |cfg: &Config| {
        let out = compile_cuda(&env, cfg);
        out.into_iter().flat_map(|o| o.result.expect("compiles")).collect::<Vec<_>>()
    };
    let first = run(&cfg);
    assert_eq!(first.len(), 4);
    assert!(first.iter().all(|a| !a.cached && a.kind == ArtifactKind::Cubin && a.path.starts_with(&cfg.cache_dir)));
    let text = std::fs::read_to_string(&first[0].path).expect("output");
    assert!(
        text.contains("-cubin") && text.contains("arch=compute_90a,code=sm_90a") && text.contains("// one"),
        "{text}"
    );
    assert_eq!(lines(&calls), 4);
    assert!(std::fs::read_to_string(root.join("conc"))
        .expect("conc")
        .lines()
        .all(|n| n.trim().parse::<usize>().is_ok_and(|n| n <= 2)));

    let second = run(&cfg);
    assert!(second.iter().all(|a| a.cached), "{second:?}");
    assert_eq!(lines(&calls), 4, "a cache hit must not run the compiler");
    assert_eq!(first.iter().map(|a| &a.path).collect::<Vec<_>>(), second.iter().map(|a| &a.path).collect::<Vec<_>>());

    std::fs::write(csrc.join("k3/a.h"), "// header v2\n").expect("write");
    assert!(run(&cfg).iter().all(|a| !a.cached), "a header change must recompile everything");
    assert_eq!(lines(&calls), 8);
    cfg.defines.push("K3_EXTRA=1".into());
    assert!(run(&cfg).iter().all(|a| !a.cached), "a define change must recompile");
    cfg.nvcc_flags.push("-lineinfo".into());
    assert!(run(&cfg).iter().all(|a| !a.cached), "a flag change must recompile");
    assert_eq!(lines(&calls), 16);
    let d = env.directives();
    for f in ["k3/a.h", "tests/one.cu", "tests/two.cu"] {
        assert!(
            d.iter().any(|l| l.starts_with("cargo::rerun-if-changed=") && l.ends_with(f)),
            "no rerun-if-changed for {f}"
        );
    }
}

#[test]
fn a_failed_compile_is_a_skip_with_the_compiler_output_never_a_panic() {
    let dir = scratch("fail");
    let root = dir.join("cuda");
    let nvcc = fake_cuda(&root);
    let (csrc, sources) = tree(&dir);
    std::fs::write(csrc.join("tests/two.cu"), "#error broken\n").expect("write");
    let env = BuildEnv::from_vars([
        ("NVCC", nvcc.into_os_string()),
        ("PATH", root.join("bin").into_os_string()),
        ("K3_CUDA_ARCHS", "sm_103a".into()),
    ]);
    let cfg = Config::from_env(&env, sources, vec![csrc], dir.join("out"));
    let out = compile_cuda(&env, &cfg);
    assert_eq!(out.len(), 1);
    let Err(Skip::Failed(fails)) = &out[0].result else { panic!("expected Failed: {:?}", out[0].result) };
    assert_eq!(fails.len(), 1);
    assert_eq!(fails[0].name, "tests/two.cu");
    assert!(fails[0].output.contains("planted failure"), "{}", fails[0].output);
    let d = env.directives();
    assert!(d.iter().any(|l| l.starts_with("cargo::warning=") && l.contains("sm_103a unavailable")), "{d:#?}");
    assert!(d.iter().any(|l| l.starts_with("cargo::warning=") && l.contains("planted failure")), "{d:#?}");
    // Nothing half-written is left in the cache.
    let leftovers = k3_build_support::sources::find_files(&cfg.cache_dir, &["cubin"], &[]).unwrap_or_default();
    assert!(leftovers.iter().all(|p| !p.to_string_lossy().contains(".tmp")), "{leftovers:?}");
}

#[test]
fn clang_19_serves_gfx942_and_zig_clang_gfx950_through_a_generated_lld_wrapper() {
    let dir = scratch("clang");
    let bin = dir.join("bin");
    fake_clangs(&bin);
    let (csrc, sources) = tree(&dir);
    let env = BuildEnv::from_vars([("PATH", bin.as_os_str())]);
    let wrap = dir.join("wrap");
    let gfx942 = HipArch::parse("gfx942").expect("arch");
    let gfx950 = HipArch::parse("gfx950").expect("arch");
    let c942 = find_hip_clang(&env, &gfx942, &wrap).expect("clang-19 for gfx942");
    assert_eq!((c942.kind.clone(), c942.major), (ClangKind::Native, 19));
    let c950 = find_hip_clang(&env, &gfx950, &wrap).expect("zig for gfx950");
    assert_eq!(c950.major, 22);
    assert!(matches!(&c950.kind, ClangKind::Zig { lld_dir } if lld_dir == &wrap));
    let lld = std::fs::read_to_string(wrap.join("lld")).expect("wrapper written");
    assert!(
        lld.contains("-flavor") && lld.contains("ld.lld") && lld.contains(&bin.join("zig").display().to_string()),
        "{lld}"
    );
    assert!(std::fs::metadata(wrap.join("lld")).expect("meta").permissions().mode() & 0o111 != 0);

    // K3_HIP_CLANG pointing at LLVM 19 serves gfx942 and is passed over (with the reason) for gfx950.
    let env = BuildEnv::from_vars([("PATH", bin.as_os_str()), ("K3_HIP_CLANG", bin.join("clang-19").as_os_str())]);
    let mut cfg = Config::from_env(&env, sources, vec![csrc], dir.join("out"));
    cfg.hip_archs = parse_list("gfx942,gfx950", HipArch::parse).0;
    let out = compile_hip(&env, &cfg);
    let arts: Vec<_> = out.iter().map(|o| o.result.as_ref().expect("compiled")).collect();
    let args = std::fs::read_to_string(&arts[1][0].path).expect("output");
    for flag in
        ["-x hip", "--offload-arch=gfx950", "--cuda-device-only", "-nogpuinc", "-nogpulib", "-mcode-object-version=5"]
    {
        assert!(args.contains(flag), "{flag} missing: {args}");
    }
    assert!(out[0].compiler.as_deref().is_some_and(|c| c.contains("K3_HIP_CLANG")), "{:?}", out[0].compiler);
    assert!(out[1].compiler.as_deref().is_some_and(|c| c.starts_with("zig clang")), "{:?}", out[1].compiler);
    // Only an explicit gfx950 compiler that is too old is an error.
    let env =
        BuildEnv::from_vars([("PATH", bin.as_os_str()), ("K3_HIP_CLANG_GFX950", bin.join("clang-19").as_os_str())]);
    let err = find_hip_clang(&env, &gfx950, &wrap).expect_err("LLVM 19 cannot do gfx950");
    assert!(err.to_string().contains("LLVM 19 is too old for gfx950"), "{err}");
}

#[test]
fn environment_lists_flags_and_switches() {
    let dir = scratch("env");
    let env = BuildEnv::from_vars([
        ("K3_CUDA_ARCHS", "sm_90a, bogus ;120"),
        ("K3_HIP_ARCHS", "gfx950;gfx942:xnack-"),
        ("K3_KERNEL_JOBS", "0"),
        ("K3_NVCC_FLAGS", "-lineinfo  --use_fast_math"),
        ("K3_KERNEL_CACHE_DIR", "/somewhere/cache"),
    ]);
    let cfg = Config::from_env(&env, Vec::new(), Vec::new(), dir.clone());
    assert_eq!(cfg.cuda_archs.iter().map(|a| a.sm()).collect::<Vec<_>>(), ["sm_90a", "sm_120"]);
    assert_eq!(cfg.hip_archs.iter().map(|a| a.to_string()).collect::<Vec<_>>(), ["gfx950", "gfx942:xnack-"]);
    assert_eq!(cfg.nvcc_flags, ["-lineinfo", "--use_fast_math"]);
    assert_eq!(cfg.cache_dir, PathBuf::from("/somewhere/cache"));
    assert!(cfg.jobs >= 1);
    let warnings: Vec<String> = env.directives().into_iter().filter(|l| l.starts_with("cargo::warning=")).collect();
    assert!(
        warnings.iter().any(|w| w.contains("bogus")) && warnings.iter().any(|w| w.contains("K3_KERNEL_JOBS")),
        "{warnings:?}"
    );

    // CUDA_COMPUTE_CAP is the fallback list; DOCS_RS disables every target with the reason.
    let env = BuildEnv::from_vars([("CUDA_COMPUTE_CAP", "90"), ("DOCS_RS", "1")]);
    let cfg = Config::from_env(&env, Vec::new(), Vec::new(), dir.clone());
    assert_eq!(cfg.cuda_archs.iter().map(|a| a.sm()).collect::<Vec<_>>(), ["sm_90"]);
    let out = compile_cuda(&env, &cfg);
    assert!(matches!(&out[0].result, Err(Skip::Disabled(why)) if why.contains("DOCS_RS")));
    let defaults = Config::new(Vec::new(), Vec::new(), dir.clone());
    assert_eq!(defaults.cache_dir, dir.join("k3-kernel-cache"));
    assert_eq!(defaults.hip_archs.len(), 2);
}

#[test]
fn the_image_table_embeds_images_and_lists_unavailable_targets() {
    let dir = scratch("table");
    let root = dir.join("cuda");
    let nvcc = fake_cuda(&root);
    let (csrc, sources) = tree(&dir);
    let env = BuildEnv::from_vars([
        ("NVCC", nvcc.into_os_string()),
        ("PATH", root.join("bin").into_os_string()),
        ("K3_CUDA_ARCHS", "90a".into()),
    ]);
    let cfg = Config::from_env(&env, sources, vec![csrc], dir.join("out"));
    let mut outcomes = compile_cuda(&env, &cfg);
    outcomes.extend(compile_hip(&env, &cfg)); // no clang on this PATH: two unavailable targets
    k3_build_support::declare_cfgs(&env);
    assert!(k3_build_support::emit_cfg_if_any(&env, Platform::Cuda, &outcomes));
    assert!(!k3_build_support::emit_cfg_if_any(&env, Platform::Hip, &outcomes));
    let d = env.directives();
    assert!(d.contains(&"cargo::rustc-check-cfg=cfg(k3_has_cuda_kernels)".to_string()));
    assert!(d.contains(&"cargo::rustc-check-cfg=cfg(k3_has_hip_kernels)".to_string()));
    assert!(d.contains(&"cargo::rustc-cfg=k3_has_cuda_kernels".to_string()));
    assert!(!d.contains(&"cargo::rustc-cfg=k3_has_hip_kernels".to_string()));
    let table = dir.join("images.rs");
    write_image_table(&table, &outcomes, &[]).expect("written");
    let text = std::fs::read_to_string(&table).expect("read");
    assert_eq!(text.matches("include_bytes!(").count(), 2, "{text}");
    assert!(text.contains("(\"tests/one.cu\", \"sm_90a\", include_bytes!("), "{text}");
    assert!(text.contains("(\"gfx950\", \"clang with AMDGPU support for gfx950 (LLVM >= 20) not found:"), "{text}");
}
