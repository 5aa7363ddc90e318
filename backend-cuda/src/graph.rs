//! CUDA graphs over [`CudaRuntime`]: capture a sequence of op `run`s issued on one stream, then
//! replay it with one launch. Op `run`s never allocate, sync or upload, so a decode step made of
//! them (with pre-allocated buffers and workspaces) is capturable.
//!
//! Capture uses `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`: a call on this thread that is illegal
//! while capturing (a synchronous copy, a stream sync) fails and invalidates the capture, which
//! `end_capture` then reports; other threads are not affected.

use crate::driver::drv;
use crate::runtime::{CudaRuntime, CudaStream};
use cudarc::driver::{sys, CudaContext};
use kernel_api::{Error, Result};
use std::fmt;
use std::sync::Arc;

/// A captured and instantiated graph (`CUgraph` + `CUgraphExec`), destroyed on drop.
pub struct CudaGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    ctx: Arc<CudaContext>,
}

// SAFETY: graph handles are plain driver handles, usable from any thread once the owning context
// is bound; every use binds it first.
unsafe impl Send for CudaGraph {}
// SAFETY: as above; replay only reads the handles.
unsafe impl Sync for CudaGraph {}

impl fmt::Debug for CudaGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaGraph({:p})", self.exec)
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        // SAFETY: both handles were created by end_capture and are destroyed exactly once here.
        unsafe {
            let _ = sys::cuGraphExecDestroy(self.exec);
            let _ = sys::cuGraphDestroy(self.graph);
        }
    }
}

impl CudaRuntime {
    /// Starts capturing the work issued on `stream` (nothing runs until [`Self::replay`]).
    pub fn begin_capture(&self, stream: &CudaStream) -> Result<()> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: a live stream of this context (CudaStream is never the legacy NULL stream).
        unsafe { sys::cuStreamBeginCapture_v2(stream.cu_stream(), sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) }
            .result()
            .map_err(drv("cuStreamBeginCapture"))
    }

    /// Ends the capture begun on `stream` and instantiates the graph.
    pub fn end_capture(&self, stream: &CudaStream) -> Result<CudaGraph> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the stream is live.
        unsafe { sys::cuStreamEndCapture(stream.cu_stream(), &mut graph) }.result().map_err(drv("cuStreamEndCapture"))?;
        if graph.is_null() {
            return Err(Error::Driver { call: "cuStreamEndCapture".into(), why: "the capture produced no graph".into() });
        }
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: `graph` is the valid graph just captured; flags 0 = default instantiation.
        let rc = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        if let Err(e) = rc.result() {
            // SAFETY: the graph is ours and not referenced elsewhere.
            unsafe {
                let _ = sys::cuGraphDestroy(graph);
            }
            return Err(drv("cuGraphInstantiate")(e));
        }
        Ok(CudaGraph { graph, exec, ctx: self.ctx.clone() })
    }

    /// Launches the instantiated graph on `stream` (asynchronous, in stream order).
    pub fn replay(&self, graph: &CudaGraph, stream: &CudaStream) -> Result<()> {
        if !Arc::ptr_eq(&graph.ctx, &self.ctx) {
            return Err(Error::invalid("graph", "was captured on another device context"));
        }
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: a live executable graph of this context and a live stream.
        unsafe { sys::cuGraphLaunch(graph.exec, stream.cu_stream()) }.result().map_err(drv("cuGraphLaunch"))
    }
}
