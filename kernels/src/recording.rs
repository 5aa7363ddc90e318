//! [`RecordingRuntime`]: a [`Runtime`] that runs nothing. Buffers are a length and an address,
//! copies only check their ranges, and every launch is recorded (kernel name, grid, block,
//! dynamic shared bytes). Driving an op's real `plan` / `run` through a [`crate::GpuBackend`]
//! over it shows the launches the GPU backends make at any shape, for any device description,
//! on a machine without a GPU (the kernel resource report's occupancy uses it).

use crate::runtime::{check_range, DevicePtr, LaunchConfig, ModuleImage, Runtime};
use kernel_api::{DeviceInfo, Error, Result};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// First address handed out; 256-byte aligned like the drivers' allocations.
const BASE_ADDRESS: u64 = 0x1000_0000;
const ALIGN: u64 = 256;

/// One launch as the launcher made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedLaunch {
    pub kernel: String,
    pub config: LaunchConfig,
}

/// A buffer with no storage.
#[derive(Debug)]
pub struct RecordedBuffer {
    addr: u64,
    len: usize,
}

/// The runtime's only stream (work is never queued, so one suffices).
#[derive(Debug)]
pub struct RecordingStream;

#[derive(Debug)]
pub struct RecordingEvent;

#[derive(Debug)]
pub struct RecordingModule;

/// See the module documentation.
#[derive(Debug)]
pub struct RecordingRuntime {
    info: DeviceInfo,
    next_addr: AtomicU64,
    launches: Mutex<Vec<RecordedLaunch>>,
    stream: RecordingStream,
}

impl RecordingRuntime {
    /// A runtime that describes itself as `info` (plans size grids and tiles from it).
    pub fn new(info: DeviceInfo) -> Self {
        RecordingRuntime { info, next_addr: AtomicU64::new(BASE_ADDRESS), launches: Mutex::new(Vec::new()), stream: RecordingStream }
    }

    /// The launches recorded since the last call, in order.
    pub fn take_launches(&self) -> Vec<RecordedLaunch> {
        match self.launches.lock() {
            Ok(mut l) => std::mem::take(&mut *l),
            Err(p) => std::mem::take(&mut *p.into_inner()),
        }
    }

    fn nothing_runs(what: &str) -> Error {
        Error::Unavailable { why: format!("the recording runtime runs nothing and holds no data ({what})") }
    }
}

impl Runtime for RecordingRuntime {
    type Buffer = RecordedBuffer;
    type Stream = RecordingStream;
    type Event = RecordingEvent;
    type Module = RecordingModule;
    type Kernel = String;

    fn device_info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize) -> Result<RecordedBuffer> {
        let span = (bytes as u64).div_ceil(ALIGN).max(1).checked_mul(ALIGN);
        let addr = span
            .and_then(|span| {
                self.next_addr
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |a| a.checked_add(span))
                    .ok()
            })
            .ok_or_else(|| Error::invalid("bytes", format!("{bytes} bytes exhaust the recording runtime's address space")))?;
        Ok(RecordedBuffer { addr, len: bytes })
    }

    fn free(&self, _buf: RecordedBuffer) -> Result<()> {
        Ok(())
    }

    fn buffer_len(&self, buf: &RecordedBuffer) -> usize {
        buf.len
    }

    fn device_ptr(&self, buf: &RecordedBuffer) -> DevicePtr {
        DevicePtr(buf.addr)
    }

    fn memset(&self, _buf: &mut RecordedBuffer, _value: u8, _stream: &RecordingStream) -> Result<()> {
        Ok(())
    }

    fn copy_h2d(&self, src: &[u8], dst: &mut RecordedBuffer, dst_offset: usize, _stream: &RecordingStream) -> Result<()> {
        check_range("dst_offset", dst_offset, src.len(), dst.len)
    }

    fn copy_d2h(&self, _src: &RecordedBuffer, _off: usize, _dst: &mut [u8], _stream: &RecordingStream) -> Result<()> {
        Err(Self::nothing_runs("copy_d2h"))
    }

    fn copy_d2d(
        &self,
        src: &RecordedBuffer,
        src_offset: usize,
        dst: &mut RecordedBuffer,
        dst_offset: usize,
        bytes: usize,
        _stream: &RecordingStream,
    ) -> Result<()> {
        check_range("src_offset", src_offset, bytes, src.len)?;
        check_range("dst_offset", dst_offset, bytes, dst.len)
    }

    fn load_module(&self, _image: &ModuleImage<'_>) -> Result<RecordingModule> {
        Ok(RecordingModule)
    }

    fn kernel(&self, _module: &RecordingModule, name: &str) -> Result<String> {
        Ok(name.to_string())
    }

    unsafe fn launch(&self, kernel: &String, cfg: &LaunchConfig, _params: &[*mut c_void], _stream: &RecordingStream) -> Result<()> {
        let launch = RecordedLaunch { kernel: kernel.clone(), config: *cfg };
        match self.launches.lock() {
            Ok(mut l) => l.push(launch),
            Err(p) => p.into_inner().push(launch),
        }
        Ok(())
    }

    fn default_stream(&self) -> &RecordingStream {
        &self.stream
    }

    fn create_stream(&self) -> Result<RecordingStream> {
        Ok(RecordingStream)
    }

    fn synchronize_stream(&self, _stream: &RecordingStream) -> Result<()> {
        Ok(())
    }

    fn create_event(&self) -> Result<RecordingEvent> {
        Ok(RecordingEvent)
    }

    fn record_event(&self, _event: &RecordingEvent, _stream: &RecordingStream) -> Result<()> {
        Ok(())
    }

    fn synchronize_event(&self, _event: &RecordingEvent) -> Result<()> {
        Ok(())
    }

    fn elapsed_ms(&self, _start: &RecordingEvent, _end: &RecordingEvent) -> Result<f32> {
        Err(Self::nothing_runs("elapsed_ms"))
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GpuBackend;
    use kernel_api::ops::{RmsNorm, RmsNormArgs, RmsNormParams, RmsWeightOrder};
    use kernel_api::{Backend, BackendExt, BackendKind, DType, Fp8Native};

    fn h200() -> DeviceInfo {
        DeviceInfo {
            kind: BackendKind::Cuda,
            arch: "sm_90a".into(),
            name: "H200 (recorded)".into(),
            warp_size: 32,
            compute_units: 132,
            shared_mem_per_block: 227 * 1024,
            l2_bytes: 0,
            fp8: Fp8Native::Ocp,
        }
    }

    #[test]
    fn buffers_are_aligned_ranges_and_hold_nothing() {
        let rt = RecordingRuntime::new(h200());
        let (mut a, b) = (rt.alloc(10).expect("alloc"), rt.alloc(1 << 40).expect("1 TiB costs nothing"));
        assert_eq!(rt.device_ptr(&a).0 % ALIGN, 0);
        assert_eq!(rt.device_ptr(&b).0, rt.device_ptr(&a).0 + ALIGN, "the next allocation starts past the rounded size");
        assert!(rt.copy_h2d(&[0; 10], &mut a, 0, rt.default_stream()).is_ok());
        assert!(rt.copy_h2d(&[0; 11], &mut a, 0, rt.default_stream()).is_err(), "ranges are still checked");
        assert!(rt.copy_d2h(&a, 0, &mut [0; 4], rt.default_stream()).is_err());
        assert!(rt.alloc(usize::MAX).is_err());
    }

    #[test]
    fn an_ops_run_records_its_launches() {
        let b = GpuBackend::new(RecordingRuntime::new(h200()), &ModuleImage::host_linked("recorded"), "recorded").expect("backend");
        let p = RmsNormParams { m: 64, d: 7168, eps: 1e-5, weight_order: RmsWeightOrder::F32 };
        let plan = RmsNorm::plan(&b, &p).expect("plan");
        let z = |shape: &[usize]| b.zeros(DType::BF16, shape).expect("alloc");
        let (x, w, mut out) = (z(&[64, 7168]), z(&[7168]), z(&[64, 7168]));
        RmsNorm::run(&b, &plan, RmsNormArgs { x: x.as_ref(), w: w.as_ref(), out: out.as_mut() }, None, b.default_stream())
            .expect("run");
        let l = b.runtime().take_launches();
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].kernel, "dense_rms_norm");
        assert_eq!(l[0].config.grid.count(), 64, "one block per row: {:?}", l[0].config);
        assert!(b.runtime().take_launches().is_empty(), "taken");
    }
}
