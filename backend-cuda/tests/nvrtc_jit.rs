//! The run-time compile path without a GPU: every kernel source of kernels/csrc/{ops,tests},
//! compiled by NVRTC from the sources embedded in this crate, for sm_90a, sm_100a and sm_103a,
//! must give a CUDA ELF holding each kernel the file exports; the cubin cache must store and
//! then serve the same bytes.
//!
//! Skips with a printed reason when NVRTC is not installed (set CUDA_HOME to a toolkit or to the
//! pip wheels' nvidia/cu13 folder); `K3_REQUIRE_DEVICE_COMPILE=1` turns the skip into a failure.

use k3_backend_cuda::kernels::{registered_kernels, source};
use k3_backend_cuda::nvrtc::{is_cuda_elf, nvrtc, CacheOutcome, CubinCache, Nvrtc};
use k3_backend_cuda::{Arch, KernelSet};

const ARCHS: [&str; 3] = ["sm_90a", "sm_100a", "sm_103a"];

fn nvrtc_or_skip() -> Option<&'static Nvrtc> {
    match nvrtc() {
        Ok(n) => Some(n),
        Err(e) => {
            if matches!(std::env::var("K3_REQUIRE_DEVICE_COMPILE").as_deref(), Ok("1") | Ok("true")) {
                panic!("K3_REQUIRE_DEVICE_COMPILE=1 but NVRTC is unavailable: {e}");
            }
            println!("skipped: {e}");
            None
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn every_kernel_source_compiles_to_a_cubin_for_each_target() {
    let Some(nv) = nvrtc_or_skip() else { return };
    println!("NVRTC {}.{} from {}", nv.version().0, nv.version().1, nv.location());
    let files: Vec<&str> = KernelSet::ALL.iter().flat_map(|s| s.files()).collect();
    assert!(!files.is_empty(), "no kernel sources embedded");
    // An NVRTC older than a target (sm_100a needs 12.8, sm_103a 12.9) skips it with a note.
    let archs: Vec<Arch> = ARCHS
        .iter()
        .map(|a| Arch::parse(a).expect("arch"))
        .filter(|a| {
            let ok = nv.supports(a);
            if !ok {
                println!("note: NVRTC {}.{} cannot target {a}; not compiled", nv.version().0, nv.version().1);
            }
            ok
        })
        .collect();
    let jobs: Vec<(&str, Arch)> = files.iter().flat_map(|f| archs.iter().map(move |a| (*f, *a))).collect();
    let start = std::time::Instant::now();
    // Two threads: NVRTC is thread-safe and the machine has two cores.
    let failures: Vec<String> = std::thread::scope(|s| {
        let halves: Vec<_> = jobs
            .chunks(jobs.len().div_ceil(2).max(1))
            .map(|chunk| {
                s.spawn(move || {
                    let mut bad = Vec::new();
                    for (file, arch) in chunk {
                        match nv.compile_cubin(file, arch) {
                            Err(e) => bad.push(format!("{file} for {arch}: {e}")),
                            Ok(cubin) if !is_cuda_elf(&cubin) => bad.push(format!("{file} for {arch}: not a CUDA ELF")),
                            Ok(cubin) => {
                                for k in registered_kernels(source(file).unwrap_or(""), true) {
                                    if !contains(&cubin, k.as_bytes()) {
                                        bad.push(format!("{file} for {arch}: kernel `{k}` missing from the cubin"));
                                    }
                                }
                            }
                        }
                    }
                    bad
                })
            })
            .collect();
        halves.into_iter().flat_map(|h| h.join().expect("compile thread")).collect()
    });
    println!("{} compiles ({} files x {} archs) in {:.1?}", jobs.len(), files.len(), archs.len(), start.elapsed());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn cubin_cache_stores_then_serves_the_same_bytes() {
    let Some(nv) = nvrtc_or_skip() else { return };
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("k3-cubin-cache-{}-{nanos}", std::process::id()));
    let cache = CubinCache::at(&dir);
    let arch = Arch::parse("sm_90a").expect("arch");
    let file = "tests/reduce.cu";
    let (first, o1) = nv.cubin(file, &arch, &cache).expect("compile");
    let (second, o2) = nv.cubin(file, &arch, &cache).expect("cached");
    let _ = std::fs::remove_dir_all(&dir);
    let stored = match o1 {
        CacheOutcome::Stored(p) => p,
        other => panic!("first compile: {other:?}"),
    };
    assert_eq!(o2, CacheOutcome::Hit(stored.clone()), "second compile should hit {stored:?}");
    assert_eq!(first, second);
    // The key depends on the target.
    assert_ne!(nv.cache_key(file, &arch), nv.cache_key(file, &Arch::parse("sm_100a").expect("arch")));
}

#[test]
fn compile_errors_carry_the_file_target_and_log() {
    let Some(nv) = nvrtc_or_skip() else { return };
    let arch = Arch::parse("sm_90a").expect("arch");
    let bad = "#include \"k3/compat.h\"\nK3_KERNEL void broken(float* p) { p[0] = undeclared_name; }\n";
    let err = nv.compile_source("ops/broken.cu", bad, &arch).unwrap_err().to_string();
    assert!(err.contains("ops/broken.cu") && err.contains("sm_90a") && err.contains("undeclared_name"), "{err}");
    // A source outside the embedded set is an input error naming it.
    let missing = nv.compile_cubin("ops/no_such_kernel.cu", &arch).unwrap_err();
    assert_eq!(missing.field(), Some("file"), "{missing}");
    assert!(missing.to_string().contains("ops/no_such_kernel.cu"), "{missing}");
}
