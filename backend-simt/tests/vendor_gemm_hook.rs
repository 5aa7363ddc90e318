//! The `Runtime` vendor-GEMM hook (cuBLASLt on CUDA) exercised without a GPU. `HostBlas` wraps
//! the emulator runtime and answers the hook with the CPU reference standing in for the vendor
//! library, so the GEMM launcher's hand-over (operand byte offsets, row strides, bias, output
//! offset, workspace sizing and checking, the fallback to the dialect kernel when the library
//! has no algorithm) is checked by the contract's GEMM conformance tests and the latent MoE
//! composition. What it cannot check is cuBLASLt itself: `backend-cuda/tests/gpu.rs` does that
//! on a device.
use k3_backend_simt::{SimtBuffer, SimtEvent, SimtKernel, SimtModule, SimtRuntime, SimtStream};
use k3_kernels::{DevicePtr, GpuBackend, LaunchConfig, ModuleImage, Runtime, VendorGemmArgs};
use kernel_api::cpu::CpuBackend;
use kernel_api::ops::{Gemm, GemmArgs, GemmParams};
use kernel_api::{Backend, BackendExt, DType, DeviceInfo, Error, Layout, Result, TensorMut, TensorRef};
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Workspace the stand-in library asks for (any non-zero size shows the plumbing).
const WS_BYTES: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Library {
    /// Computes every GEMM it is handed.
    Computes,
    /// Has no algorithm for anything (`Unsupported`), like cuBLASLt for odd alignments.
    NoAlgorithm,
}

struct HostBlas {
    inner: SimtRuntime,
    library: Library,
    calls: AtomicUsize,
}

impl HostBlas {
    fn backend(library: Library) -> GpuBackend<HostBlas> {
        let rt = HostBlas { inner: SimtRuntime::new(32).expect("simt32"), library, calls: AtomicUsize::new(0) };
        GpuBackend::new(rt, &ModuleImage::host_linked("k3-kernels"), "simt32+hostblas").expect("backend")
    }

    /// A whole device buffer as a CPU-backend buffer (after the stream's queued work).
    fn to_cpu(&self, cpu: &CpuBackend, buf: &SimtBuffer, stream: &SimtStream) -> Result<<CpuBackend as Backend>::Buffer> {
        let mut bytes = vec![0u8; self.inner.buffer_len(buf)];
        self.inner.copy_d2h(buf, 0, &mut bytes, stream)?;
        cpu.upload(&bytes)
    }
}

fn layout(dtype: DType, shape: &[usize], row_stride: usize, offset_bytes: usize) -> Layout {
    let strides = if shape.len() == 2 { vec![row_stride, 1] } else { vec![1] };
    Layout { dtype, shape: shape.to_vec(), strides, offset: offset_bytes / dtype.size_bytes() }
}

impl Runtime for HostBlas {
    type Buffer = SimtBuffer;
    type Stream = SimtStream;
    type Event = SimtEvent;
    type Module = SimtModule;
    type Kernel = SimtKernel;

    fn device_info(&self) -> &DeviceInfo {
        self.inner.device_info()
    }
    fn alloc(&self, bytes: usize) -> Result<SimtBuffer> {
        self.inner.alloc(bytes)
    }
    fn free(&self, buf: SimtBuffer) -> Result<()> {
        self.inner.free(buf)
    }
    fn buffer_len(&self, buf: &SimtBuffer) -> usize {
        self.inner.buffer_len(buf)
    }
    fn device_ptr(&self, buf: &SimtBuffer) -> DevicePtr {
        self.inner.device_ptr(buf)
    }
    fn memset(&self, buf: &mut SimtBuffer, value: u8, stream: &SimtStream) -> Result<()> {
        self.inner.memset(buf, value, stream)
    }
    fn copy_h2d(&self, src: &[u8], dst: &mut SimtBuffer, dst_offset: usize, stream: &SimtStream) -> Result<()> {
        self.inner.copy_h2d(src, dst, dst_offset, stream)
    }
    fn copy_d2h(&self, src: &SimtBuffer, src_offset: usize, dst: &mut [u8], stream: &SimtStream) -> Result<()> {
        self.inner.copy_d2h(src, src_offset, dst, stream)
    }
    fn copy_d2d(&self, src: &SimtBuffer, so: usize, dst: &mut SimtBuffer, d_o: usize, n: usize, s: &SimtStream) -> Result<()> {
        self.inner.copy_d2d(src, so, dst, d_o, n, s)
    }
    fn load_module(&self, image: &ModuleImage<'_>) -> Result<SimtModule> {
        self.inner.load_module(image)
    }
    fn kernel(&self, module: &SimtModule, name: &str) -> Result<SimtKernel> {
        self.inner.kernel(module, name)
    }
    unsafe fn launch(&self, k: &SimtKernel, cfg: &LaunchConfig, params: &[*mut c_void], s: &SimtStream) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.launch(k, cfg, params, s) }
    }
    fn default_stream(&self) -> &SimtStream {
        self.inner.default_stream()
    }
    fn create_stream(&self) -> Result<SimtStream> {
        self.inner.create_stream()
    }
    fn synchronize_stream(&self, stream: &SimtStream) -> Result<()> {
        self.inner.synchronize_stream(stream)
    }
    fn create_event(&self) -> Result<SimtEvent> {
        self.inner.create_event()
    }
    fn record_event(&self, event: &SimtEvent, stream: &SimtStream) -> Result<()> {
        self.inner.record_event(event, stream)
    }
    fn synchronize_event(&self, event: &SimtEvent) -> Result<()> {
        self.inner.synchronize_event(event)
    }
    fn elapsed_ms(&self, start: &SimtEvent, end: &SimtEvent) -> Result<f32> {
        self.inner.elapsed_ms(start, end)
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }

    fn vendor_gemm_workspace(&self, _params: &GemmParams) -> Option<usize> {
        Some(WS_BYTES)
    }

    fn vendor_gemm(&self, p: &GemmParams, a: VendorGemmArgs<'_, SimtBuffer>, stream: &SimtStream) -> Result<()> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if self.library == Library::NoAlgorithm {
            return Err(Error::unsupported("gemm", "the stand-in library has no algorithm"));
        }
        let have = a.workspace.as_ref().map_or(0, |w| self.inner.buffer_len(w));
        if have < WS_BYTES {
            return Err(Error::invalid("workspace", format!("{have} bytes reached the library")));
        }
        let cpu = CpuBackend::new();
        let x = self.to_cpu(&cpu, a.x.buf, stream)?;
        let w = self.to_cpu(&cpu, a.w.buf, stream)?;
        let bias = a.bias.as_ref().map(|b| self.to_cpu(&cpu, b.buf, stream)).transpose()?;
        let out_bytes = p.m * p.n * p.out_dtype.size_bytes();
        let mut out = cpu.alloc_zeroed(out_bytes)?;
        let args = GemmArgs {
            x: TensorRef::new(&x, layout(p.x_dtype, &[p.m, p.k], a.x.row_stride, a.x.offset_bytes)),
            w: TensorRef::new(&w, layout(p.w_dtype, &[p.n, p.k], a.w.row_stride, a.w.offset_bytes)),
            bias: bias.as_ref().zip(a.bias.as_ref()).zip(p.bias_dtype).map(|((buf, op), dt)| TensorRef::new(buf, layout(dt, &[p.n], 1, op.offset_bytes))),
            out: TensorMut::new(&mut out, Layout::contiguous(p.out_dtype, &[p.m, p.n])),
        };
        let plan = Gemm::plan(&cpu, p)?;
        Gemm::run(&cpu, &plan, args, None, cpu.default_stream())?;
        let mut host = vec![0u8; out_bytes];
        cpu.download(&out, &mut host)?;
        self.inner.copy_h2d(&host, a.out, a.out_offset_bytes, stream)
    }
}

/// Every conformance test of `ops` on `b`.
fn run_conformance(b: &GpuBackend<HostBlas>, ops: &[&str]) -> usize {
    let tests: Vec<_> = kernel_api::conformance::all_tests::<GpuBackend<HostBlas>>().into_iter().filter(|(op, _, _)| ops.contains(op)).collect();
    assert!(!tests.is_empty());
    for (op, name, test) in &tests {
        println!("{op}: {name}");
        test(b);
    }
    tests.len()
}

#[test]
fn gemm_conformance_through_the_vendor_hook() {
    let b = HostBlas::backend(Library::Computes);
    let n = run_conformance(&b, &["gemm", "latent_moe_block"]);
    assert!(n >= 6, "{n} tests");
    let calls = b.runtime().calls.load(Ordering::Relaxed);
    assert!(calls >= 10, "the GEMM tests reached the library {calls} times");
}

#[test]
fn gemm_falls_back_to_the_kernels_when_the_library_has_no_algorithm() {
    let b = HostBlas::backend(Library::NoAlgorithm);
    run_conformance(&b, &["gemm"]);
    assert!(b.runtime().calls.load(Ordering::Relaxed) > 0);
}

#[test]
fn gemm_plans_ask_for_the_library_workspace_and_runs_check_it() {
    let b = HostBlas::backend(Library::Computes);
    let plan = Gemm::plan(&b, &GemmParams::new(4, 8, 16, DType::BF16, DType::BF16, DType::F32)).unwrap();
    assert_eq!(Gemm::workspace_size(&b, &plan), WS_BYTES);
    let x = b.zeros(DType::BF16, &[4, 16]).unwrap();
    let w = b.zeros(DType::BF16, &[8, 16]).unwrap();
    let mut out = b.zeros(DType::F32, &[4, 8]).unwrap();
    let mut small = b.workspace(WS_BYTES - 1).unwrap();
    for ws in [None, small.as_mut()] {
        let args = GemmArgs { x: x.as_ref(), w: w.as_ref(), bias: None, out: out.as_mut() };
        let e = Gemm::run(&b, &plan, args, ws, b.default_stream()).unwrap_err();
        assert_eq!(e.field(), Some("workspace"), "{e}");
    }
    assert_eq!(b.runtime().calls.load(Ordering::Relaxed), 0, "a rejected run must not reach the library");
}
