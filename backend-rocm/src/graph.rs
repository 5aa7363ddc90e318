//! HIP graphs over [`RocmRuntime`]: capture a sequence of op `run`s issued on one stream, then
//! replay it with one launch. Op `run`s never allocate, sync or upload, so a decode step made of
//! them (with pre-allocated buffers and workspaces) is capturable.
//!
//! Capture uses `hipStreamCaptureModeThreadLocal`: a call on this thread that is illegal while
//! capturing (a synchronous copy, a stream sync) fails and invalidates the capture, which
//! `end_capture` then reports; other threads are not affected.

use crate::runtime::{Device, RocmRuntime, RocmStream};
use crate::sys;
use kernel_api::{Error, Result};
use std::fmt;
use std::sync::Arc;

/// A captured and instantiated graph (`hipGraph_t` + `hipGraphExec_t`), destroyed on drop.
pub struct RocmGraph {
    graph: sys::hipGraph_t,
    exec: sys::hipGraphExec_t,
    dev: Arc<Device>,
}

// SAFETY: graph handles are plain runtime handles, usable from any thread with the device
// current; every use binds it first.
unsafe impl Send for RocmGraph {}
// SAFETY: as above; replay only reads the handles.
unsafe impl Sync for RocmGraph {}

impl fmt::Debug for RocmGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RocmGraph({:p})", self.exec)
    }
}

impl Drop for RocmGraph {
    fn drop(&mut self) {
        if self.dev.bind().is_err() {
            return;
        }
        // SAFETY: both handles were created by end_capture and are destroyed exactly once here.
        unsafe {
            let _ = (self.dev.hip.fns.hipGraphExecDestroy)(self.exec);
            let _ = (self.dev.hip.fns.hipGraphDestroy)(self.graph);
        }
    }
}

impl RocmRuntime {
    /// Starts capturing the work issued on `stream` (nothing runs until [`Self::replay`]).
    pub fn begin_capture(&self, stream: &RocmStream) -> Result<()> {
        self.bind()?;
        // SAFETY: a live stream of this device (never the null stream).
        let rc = unsafe { (self.hip.fns.hipStreamBeginCapture)(stream.raw(), sys::hipStreamCaptureModeThreadLocal) };
        self.dev.check("hipStreamBeginCapture", rc)
    }

    /// Whether `stream` is capturing now.
    pub fn is_capturing(&self, stream: &RocmStream) -> Result<bool> {
        self.bind()?;
        let mut st: sys::hipStreamCaptureStatus = sys::hipStreamCaptureStatusNone;
        // SAFETY: a live stream; valid out-pointer.
        self.dev.check("hipStreamIsCapturing", unsafe { (self.hip.fns.hipStreamIsCapturing)(stream.raw(), &mut st) })?;
        Ok(st != sys::hipStreamCaptureStatusNone)
    }

    /// Ends the capture begun on `stream` and instantiates the graph.
    pub fn end_capture(&self, stream: &RocmStream) -> Result<RocmGraph> {
        self.bind()?;
        let mut graph: sys::hipGraph_t = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the stream is live.
        self.dev.check("hipStreamEndCapture", unsafe { (self.hip.fns.hipStreamEndCapture)(stream.raw(), &mut graph) })?;
        if graph.is_null() {
            return Err(Error::Driver { call: "hipStreamEndCapture".into(), why: "the capture produced no graph".into() });
        }
        let mut exec: sys::hipGraphExec_t = std::ptr::null_mut();
        // SAFETY: `graph` is the valid graph just captured; no error node or log requested.
        let rc = unsafe { (self.hip.fns.hipGraphInstantiate)(&mut exec, graph, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        if let Err(e) = self.dev.check("hipGraphInstantiate", rc) {
            // SAFETY: the graph is ours and not referenced elsewhere.
            unsafe {
                let _ = (self.hip.fns.hipGraphDestroy)(graph);
            }
            return Err(e);
        }
        Ok(RocmGraph { graph, exec, dev: self.dev.clone() })
    }

    /// Launches the instantiated graph on `stream` (asynchronous, in stream order).
    pub fn replay(&self, graph: &RocmGraph, stream: &RocmStream) -> Result<()> {
        if graph.dev.ordinal != self.dev.ordinal {
            return Err(Error::invalid("graph", "was captured on another device"));
        }
        self.bind()?;
        // SAFETY: a live executable graph of this device and a live stream.
        self.dev.check("hipGraphLaunch", unsafe { (self.hip.fns.hipGraphLaunch)(graph.exec, stream.raw()) })
    }
}
