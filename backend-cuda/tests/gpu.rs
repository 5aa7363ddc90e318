//! On a CUDA device: memory and copies, the kernel sets (embedded and NVRTC paths), launches of
//! the dialect's test kernels, dynamic shared memory above 48 KiB, streams and events, PTX
//! loading, and the cuBLASLt GEMM against an f64 reference. Every test prints a reason and
//! returns when no device answers (`CudaRuntime::new(0)` is `Unavailable`).

use half::bf16;
use k3_backend_cuda::blaslt::{BlasLtArgs, BlasLtGemm, Operand};
use k3_backend_cuda::nvrtc::CubinCache;
use k3_backend_cuda::{CudaBuffer, CudaRuntime, KernelOrigin, KernelSet, KernelSource};
use k3_kernels::{ImageFormat, KernelArgs, LaunchConfig, ModuleImage, Runtime};
use kernel_api::tolerance::{assert_close, Tolerance};
use kernel_api::ops::GemmParams;
use kernel_api::{DType, Error};

fn device() -> Option<CudaRuntime> {
    match CudaRuntime::new(0) {
        Ok(rt) => Some(rt),
        Err(Error::Unavailable { why }) => {
            println!("skipped: no CUDA device: {why}");
            None
        }
        Err(e) => panic!("the probe must answer Ok or Unavailable, got {e}"),
    }
}

fn upload<T: bytemuck::Pod>(rt: &CudaRuntime, v: &[T]) -> CudaBuffer {
    let bytes: &[u8] = bytemuck::cast_slice(v);
    let mut b = rt.alloc(bytes.len()).expect("alloc");
    rt.copy_h2d(bytes, &mut b, 0, rt.default_stream()).expect("h2d");
    b
}

fn download<T: bytemuck::Pod + Default>(rt: &CudaRuntime, b: &CudaBuffer) -> Vec<T> {
    let mut out = vec![T::default(); b.len() / std::mem::size_of::<T>()];
    rt.copy_d2h(b, 0, bytemuck::cast_slice_mut(&mut out), rt.default_stream()).expect("d2h");
    out
}

#[test]
fn device_info_describes_a_cuda_device() {
    let Some(rt) = device() else { return };
    let info = rt.device_info();
    println!("{info:?}, driver {}", rt.driver_version());
    assert_eq!(info.warp_size, 32);
    assert!(info.arch.starts_with("sm_") && info.arch == rt.arch().to_string());
    assert!(info.compute_units > 0 && info.shared_mem_per_block >= 48 * 1024 && info.l2_bytes > 0);
}

#[test]
fn copies_round_trip_with_offsets_and_ranges_are_checked() {
    let Some(rt) = device() else { return };
    let s = rt.default_stream();
    let data: Vec<u8> = (0..=255).collect();
    let src = upload(&rt, &data);
    let mut dst = rt.alloc(300).expect("alloc");
    rt.memset(&mut dst, 0xAB, s).expect("memset");
    rt.copy_d2d(&src, 16, &mut dst, 40, 100, s).expect("d2d");
    let got: Vec<u8> = download(&rt, &dst);
    assert!(got[..40].iter().all(|&b| b == 0xAB) && got[140..].iter().all(|&b| b == 0xAB));
    assert_eq!(&got[40..140], &data[16..116]);
    let mut part = vec![0u8; 10];
    rt.copy_d2h(&src, 250, &mut part[..6], s).expect("tail read");
    assert_eq!(&part[..6], &data[250..]);
    assert!(matches!(rt.copy_d2h(&src, 251, &mut part, s), Err(Error::InvalidInput { .. })));
    assert!(matches!(rt.copy_h2d(&data, &mut dst, 100, s), Err(Error::InvalidInput { .. })));
    assert!(matches!(rt.copy_d2d(&src, 0, &mut dst, 0, 257, s), Err(Error::InvalidInput { .. })));
    let empty = rt.alloc(0).expect("empty alloc");
    assert_eq!(rt.buffer_len(&empty), 0);
    rt.free(empty).expect("free");
    rt.free(dst).expect("free");
}

/// block_reduce on every path the runtime has for the test kernels.
#[test]
fn block_reduce_runs_from_embedded_and_nvrtc_kernels() {
    let Some(rt) = device() else { return };
    let n = 1000usize;
    let x: Vec<f32> = (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.25).collect();
    let block = 256u32;
    let blocks = n.div_ceil(block as usize) as u32;
    let mut sources = vec![KernelSource::Jit];
    if k3_backend_cuda::kernels::embedded_covers(rt.compute_capability().0, rt.compute_capability().1) {
        sources.push(KernelSource::Embedded);
    } else {
        println!("note: no embedded cubins for {} in this build; only the NVRTC path is run", rt.arch());
    }
    for source in sources {
        let (module, origins) = match rt.load_kernel_set(KernelSet::Tests, source, &CubinCache::disabled()) {
            Ok(m) => m,
            Err(Error::Unavailable { why }) if source == KernelSource::Jit => {
                println!("skipped the NVRTC path: {why}");
                continue;
            }
            Err(e) => panic!("{source:?}: {e}"),
        };
        assert!(origins.iter().all(|(_, o)| (source == KernelSource::Embedded) == (*o == KernelOrigin::Embedded)), "{origins:?}");
        let k = rt.kernel(&module, "block_reduce").expect("block_reduce");
        let xb = upload(&rt, &x);
        let sums = rt.alloc(blocks as usize * 4).expect("alloc");
        let total = upload(&rt, &[0f32]);
        let positives = upload(&rt, &[0i32]);
        let max_val = upload(&rt, &[i32::MIN]);
        let mut a = KernelArgs::new();
        a.push(rt.device_ptr(&xb)).push(n as i32).push(rt.device_ptr(&sums)).push(rt.device_ptr(&total));
        a.push(rt.device_ptr(&positives)).push(rt.device_ptr(&max_val));
        let params = a.params();
        // SAFETY: block_reduce(const float*, int, float*, float*, int*, int*) with x of n floats,
        // one sum per block, and three scalars.
        unsafe { rt.launch(&k, &LaunchConfig::new(blocks, block, 0), &params, rt.default_stream()) }.expect("launch");
        let got_sums: Vec<f32> = download(&rt, &sums);
        for (b, got) in got_sums.iter().enumerate() {
            let want: f64 = x[b * block as usize..((b + 1) * block as usize).min(n)].iter().map(|&v| v as f64).sum();
            assert!((*got as f64 - want).abs() < 1e-3, "{source:?} block {b}: {got} vs {want}");
        }
        assert_eq!(download::<i32>(&rt, &positives)[0], x.iter().filter(|&&v| v > 0.0).count() as i32);
        assert_eq!(download::<i32>(&rt, &max_val)[0], x.iter().map(|&v| v as i32).max().unwrap_or(0));
        assert!(matches!(rt.kernel(&module, "no_such_kernel"), Err(Error::Unavailable { .. })));
    }
}

#[test]
fn dynamic_shared_memory_above_48k_and_launch_limits() {
    let Some(rt) = device() else { return };
    let module = match rt.kernels(KernelSet::Tests) {
        Ok(m) => m,
        Err(e) => {
            println!("skipped: {e}");
            return;
        }
    };
    let k = rt.kernel(&module, "dynamic_shared_sum").expect("kernel");
    let x: Vec<f32> = (0..2 * 1024).map(|i| (i % 7) as f32).collect();
    let xb = upload(&rt, &x);
    let out = rt.alloc(2 * 4).expect("alloc");
    let mut a = KernelArgs::new();
    a.push(rt.device_ptr(&xb)).push(rt.device_ptr(&out));
    let params = a.params();
    let smem = (rt.device_info().shared_mem_per_block as u32).min(96 * 1024);
    // SAFETY: dynamic_shared_sum(const float*, float*) over 2 blocks of 1024 floats, staging
    // through at least 4 KiB of dynamic shared memory.
    unsafe { rt.launch(&k, &LaunchConfig::new(2, 1024, smem), &params, rt.default_stream()) }.expect("launch");
    let got: Vec<f32> = download(&rt, &out);
    let want: Vec<f32> = (0..2).map(|b| x[b * 1024..(b + 1) * 1024].iter().sum()).collect();
    assert_eq!(got, want);
    for bad in [
        LaunchConfig::new(1, 2048, 0),
        LaunchConfig::new(0, 32, 0),
        LaunchConfig::new(1, 32, rt.device_info().shared_mem_per_block as u32 + 1),
    ] {
        // SAFETY: rejected before reaching the driver.
        let r = unsafe { rt.launch(&k, &bad, &params, rt.default_stream()) };
        assert!(matches!(r, Err(Error::InvalidInput { .. })), "{bad:?}: {r:?}");
    }
}

#[test]
fn streams_order_work_and_events_time_it() {
    let Some(rt) = device() else { return };
    let s2 = rt.create_stream().expect("stream");
    let (start, end) = (rt.create_event().expect("event"), rt.create_event().expect("event"));
    assert!(matches!(rt.elapsed_ms(&start, &end), Err(Error::InvalidInput { .. })));
    let bytes = 64 << 20;
    let src = rt.alloc(bytes).expect("alloc");
    let mut dst = rt.alloc(bytes).expect("alloc");
    rt.record_event(&start, &s2).expect("record");
    for _ in 0..4 {
        rt.copy_d2d(&src, 0, &mut dst, 0, bytes, &s2).expect("d2d");
    }
    rt.record_event(&end, &s2).expect("record");
    rt.synchronize_event(&end).expect("sync");
    let ms = rt.elapsed_ms(&start, &end).expect("elapsed");
    println!("4 x {} MiB device copies: {ms:.3} ms ({:.0} GB/s)", bytes >> 20, 4.0 * 2.0 * bytes as f64 / (ms as f64 * 1e6));
    assert!(ms > 0.0 && ms < 10_000.0, "{ms}");
    rt.synchronize_stream(&s2).expect("sync");
    rt.synchronize().expect("sync all");
}

#[test]
fn ptx_and_cubin_images_load() {
    let Some(rt) = device() else { return };
    let nv = match k3_backend_cuda::nvrtc::nvrtc() {
        Ok(n) => n,
        Err(e) => {
            println!("skipped: {e}");
            return;
        }
    };
    let cubin = nv.compile_cubin("tests/warp_semantics.cu", &rt.arch()).expect("cubin");
    let m = rt.load_module(&ModuleImage { name: "warp_semantics", format: ImageFormat::Cubin, bytes: &cubin }).expect("load");
    assert!(rt.kernel(&m, "empty_kernel").is_ok());
    // PTX of a kernel from outside kernels/csrc: a real driver JIT-compiles and runs it; the
    // stand-in loads it but can only run the emulator's builds of the kernels/csrc kernels.
    let standin = rt.device_info().name.starts_with("k3 stand-in");
    let ptx = cudarc::nvrtc::compile_ptx("extern \"C\" __global__ void fill(int* p, int v) { p[threadIdx.x] = v; }").expect("ptx");
    let m = match rt.load_module(&ModuleImage { name: "fill", format: ImageFormat::Ptx, bytes: ptx.to_src().as_bytes() }) {
        Ok(m) => m,
        // PTX from an NVRTC newer than the driver cannot be JIT-compiled by it (the reason
        // this crate ships cubins); that is the driver's answer, not a bug here.
        Err(e) if e.to_string().contains("UNSUPPORTED_PTX_VERSION") => {
            println!("note: the driver cannot JIT this NVRTC's PTX: {e}");
            return;
        }
        Err(e) => panic!("load ptx: {e}"),
    };
    match rt.kernel(&m, "fill") {
        Ok(k) if !standin => {
            let out = rt.alloc(32 * 4).expect("alloc");
            let mut a = KernelArgs::new();
            a.push(rt.device_ptr(&out)).push(7i32);
            let params = a.params();
            // SAFETY: fill(int*, int) writes 32 ints.
            unsafe { rt.launch(&k, &LaunchConfig::new(1, 32, 0), &params, rt.default_stream()) }.expect("launch");
            assert_eq!(download::<i32>(&rt, &out), vec![7; 32]);
        }
        Err(e) if standin => assert!(e.to_string().contains("emulator cannot run it"), "{e}"),
        other => panic!("fill on {}: {other:?}", rt.device_info().name),
    }
    // Hand-written PTX of a kernels/csrc kernel (no parameters), which both can run.
    let version = if rt.compute_capability().0 >= 10 { "8.8" } else { "8.0" };
    let text = format!(".version {version}\n.target {}\n.address_size 64\n\n.visible .entry empty_kernel()\n{{\n\tret;\n}}\n", rt.arch());
    let m = match rt.load_module(&ModuleImage { name: "empty", format: ImageFormat::Ptx, bytes: text.as_bytes() }) {
        Ok(m) => m,
        Err(e) if e.to_string().contains("UNSUPPORTED_PTX_VERSION") => {
            println!("note: the driver cannot JIT PTX {version}: {e}");
            return;
        }
        Err(e) => panic!("load hand-written ptx: {e}"),
    };
    let k = rt.kernel(&m, "empty_kernel").expect("empty_kernel");
    // SAFETY: no parameters.
    unsafe { rt.launch(&k, &LaunchConfig::new(2, 64, 0), &[], rt.default_stream()) }.expect("launch");
    rt.synchronize().expect("sync");
    assert!(rt.load_module(&ModuleImage { name: "junk", format: ImageFormat::Cubin, bytes: b"not a cubin" }).is_err());
}

/// out[m][n] = sum_k x[m][k] * w[n][k] + bias[n], in f64.
fn reference(x: &[f32], w: &[f32], bias: Option<&[f32]>, m: usize, n: usize, k: usize) -> Vec<f32> {
    (0..m * n)
        .map(|i| {
            let (r, c) = (i / n, i % n);
            let dot: f64 = (0..k).map(|j| x[r * k + j] as f64 * w[c * k + j] as f64).sum();
            (dot + bias.map(|b| b[c] as f64).unwrap_or(0.0)) as f32
        })
        .collect()
}

#[test]
fn blaslt_gemm_matches_the_reference() {
    let Some(rt) = device() else { return };
    if let Err(e) = rt.blaslt_version() {
        println!("skipped: {e}");
        return;
    }
    let mut ws = rt.alloc(k3_backend_cuda::BLASLT_WORKSPACE_BYTES).expect("workspace");
    let cases = [
        (DType::BF16, DType::BF16, None, 5, 7, 64),
        (DType::BF16, DType::F32, Some(DType::F32), 33, 130, 96),
        (DType::BF16, DType::BF16, Some(DType::BF16), 1, 256, 512),
        (DType::F32, DType::F32, Some(DType::F32), 17, 40, 72),
    ];
    for (in_dt, out_dt, bias_dt, m, n, k) in cases {
        let val = |i: usize, s: usize| (((i * s + 13) % 29) as f32 - 14.0) / 16.0;
        // Inputs exactly representable in the input dtype, so the reference sees what the GPU sees.
        let round = |v: f32| if in_dt == DType::BF16 { bf16::from_f32(v).to_f32() } else { v };
        let x: Vec<f32> = (0..m * k).map(|i| round(val(i, 7))).collect();
        let w: Vec<f32> = (0..n * k).map(|i| round(val(i, 11))).collect();
        let bias: Vec<f32> = (0..n).map(|i| round(val(i, 3))).collect();
        let to_dev = |v: &[f32], dt: DType| match dt {
            DType::BF16 => upload(&rt, &v.iter().map(|&f| bf16::from_f32(f)).collect::<Vec<_>>()),
            _ => upload(&rt, v),
        };
        let (xb, wb) = (to_dev(&x, in_dt), to_dev(&w, in_dt));
        let bb = bias_dt.map(|dt| to_dev(&bias, dt));
        let mut out = rt.alloc(m * n * out_dt.size_bytes()).expect("alloc");
        let g = BlasLtGemm::from_params(&GemmParams { bias_dtype: bias_dt, ..GemmParams::new(m, n, k, in_dt, in_dt, out_dt) });
        let args = BlasLtArgs {
            x: Operand { buf: &xb, offset_bytes: 0 },
            w: Operand { buf: &wb, offset_bytes: 0 },
            bias: bb.as_ref().map(|b| Operand { buf: b, offset_bytes: 0 }),
            out: &mut out,
            out_offset_bytes: 0,
            // Both with the recommended workspace and with none.
            workspace: if m % 2 == 1 { Some(&mut ws) } else { None },
        };
        rt.gemm_blaslt(&g, args, rt.default_stream()).unwrap_or_else(|e| panic!("{g:?}: {e}"));
        let got: Vec<f32> = match out_dt {
            DType::BF16 => download::<bf16>(&rt, &out).iter().map(|v| v.to_f32()).collect(),
            _ => download::<f32>(&rt, &out),
        };
        let want = reference(&x, &w, bias_dt.map(|_| bias.as_slice()), m, n, k);
        // f32 accumulation of exact products: F32_ALGO for f32 outputs (summation order differs),
        // BF16 for a bf16 output (one rounding of the result).
        let tol = if out_dt == DType::BF16 { Tolerance::BF16 } else { Tolerance::F32_ALGO };
        assert_close(&format!("{g:?}"), &got, &want, tol);
    }
    // Shape checks happen before cuBLASLt is called.
    let small = rt.alloc(16).expect("alloc");
    let mut out = rt.alloc(16).expect("alloc");
    let g = BlasLtGemm::from_params(&GemmParams::new(4, 4, 4, DType::F32, DType::F32, DType::F32));
    let args = BlasLtArgs { x: Operand { buf: &small, offset_bytes: 0 }, w: Operand { buf: &small, offset_bytes: 0 }, bias: None, out: &mut out, out_offset_bytes: 0, workspace: None };
    assert!(matches!(rt.gemm_blaslt(&g, args, rt.default_stream()), Err(Error::InvalidInput { .. })));
}

/// The contract's `Gemm` on the CUDA backend under both routes: cuBLASLt (through the runtime's
/// vendor-GEMM hook, with the plan's workspace) and the dialect's kernels, each through the
/// GEMM conformance tests.
#[test]
fn gemm_conformance_on_both_routes() {
    use k3_backend_cuda::{cuda_backend, CudaBackend, GemmRoute};
    use kernel_api::ops::Gemm;
    let Some(_) = device() else { return };
    let b = cuda_backend(0).expect("backend");
    let rt = b.runtime();
    let plan = Gemm::plan(&b, &GemmParams::new(64, 128, 256, DType::BF16, DType::BF16, DType::BF16)).expect("plan");
    let tests: Vec<_> = kernel_api::conformance::all_tests::<CudaBackend>().into_iter().filter(|(op, _, _)| *op == "gemm").collect();
    for route in [GemmRoute::BlasLt, GemmRoute::Kernels] {
        if route == GemmRoute::BlasLt {
            if let Err(e) = rt.blaslt_version() {
                println!("skipped the cuBLASLt route: {e}");
                continue;
            }
        }
        rt.set_gemm_route(route);
        let want_ws = if route == GemmRoute::BlasLt { k3_kernels::vendor_gemm::lt_workspace_bytes(&plan.params) } else { 0 };
        assert_eq!(Gemm::workspace_size(&b, &plan), want_ws, "{route:?}");
        for (_, name, test) in &tests {
            println!("{route:?}: {name}");
            test(&b);
        }
    }
}
