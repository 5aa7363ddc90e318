//! The hiprtc path with a real hiprtc and no GPU: where one is installed (CI installs Debian's
//! libamdhip64-5, whose libamdhip64.so.5 contains ROCm 5.2's hiprtc), a kernel is compiled for
//! gfx90a (a processor without embedded images), stored in the cache and read back from it, and
//! a compile error comes back as `Error::Driver` carrying the compiler's log. Without hiprtc the
//! tests print `skipped: ...` unless `K3_REQUIRE_HIPRTC=1`.
//!
//! Never for gfx94x here: ROCm 5.2's hiprtc aborts the process on gfx940/gfx942
//! (shared/reference/toolchains.md). The dialect's own sources need a hiprtc newer than 5.2
//! (its LLVM lacks `__builtin_amdgcn_ballot_w64`), so the kernel below is plain HIP.

use k3_backend_rocm::hiprtc::{hiprtc, CacheOutcome, CodeObjectCache, Hiprtc};
use k3_backend_rocm::kernels::is_amdgpu_elf;
use kernel_api::Error;

fn compiler() -> Option<&'static Hiprtc> {
    match hiprtc() {
        Ok(h) => Some(h),
        Err(e) if std::env::var("K3_REQUIRE_HIPRTC").as_deref() != Ok("1") => {
            println!("skipped: {e}");
            None
        }
        Err(e) => panic!("K3_REQUIRE_HIPRTC=1: {e}"),
    }
}

const KERNEL: &str = "extern \"C\" __global__ void k3_hiprtc_probe(int* p) { p[threadIdx.x] = (int)threadIdx.x; }\n";

#[test]
fn a_kernel_compiles_for_gfx90a_and_is_cached() {
    let Some(rtc) = compiler() else { return };
    println!("hiprtc {}.{} from {}", rtc.version().0, rtc.version().1, rtc.location());
    let code = rtc.compile_source("tests/k3_hiprtc_probe.cu", KERNEL, "gfx90a", 64).expect("compile");
    assert!(is_amdgpu_elf(&code), "not an AMDGPU code object ({} bytes)", code.len());

    // Through the cache: compiled and stored once, then read back.
    let dir = std::env::temp_dir().join(format!("k3-hiprtc-cache-{}", std::process::id()));
    let cache = CodeObjectCache::at(&dir);
    let file = "tests/reduce.cu";
    match rtc.code_object(file, "gfx90a", 64, &cache) {
        Ok((first, CacheOutcome::Stored(p))) => {
            let (again, outcome) = rtc.code_object(file, "gfx90a", 64, &cache).expect("second compile");
            assert_eq!(outcome, CacheOutcome::Hit(p));
            assert_eq!(first, again);
        }
        // ROCm 5.2's hiprtc cannot compile the dialect (see the module docs): the error must
        // carry the compiler's log, and nothing is cached.
        Err(Error::Driver { call, why }) => {
            println!("{call}: {}", why.lines().next().unwrap_or(""));
            assert!(call.contains("hiprtcCompileProgram(tests/reduce.cu, gfx90a)"), "{call}");
            assert!(why.contains("error:"), "the compiler's log: {why}");
            assert!(std::fs::read_dir(dir.join("hip")).map_or(true, |mut d| d.next().is_none()));
        }
        other => panic!("unexpected {other:?}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_compile_error_carries_the_log() {
    let Some(rtc) = compiler() else { return };
    let e = rtc.compile_source("tests/broken.cu", "extern \"C\" __global__ void k(int* p) { p[0] = undeclared_name; }\n", "gfx90a", 64);
    match e {
        Err(Error::Driver { call, why }) => {
            assert!(call.contains("hiprtcCompileProgram(tests/broken.cu, gfx90a)"), "{call}");
            assert!(why.contains("undeclared_name"), "{why}");
        }
        other => panic!("expected a Driver error with the log, got {other:?}"),
    }
}
