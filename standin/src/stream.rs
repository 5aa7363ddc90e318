//! Streams, events and stream capture.
//!
//! Work runs when it is enqueued, so a stream is finished whenever a call returns and an event's
//! time is the host's monotonic clock at its record call (after everything enqueued before it).
//! A capturing stream instead appends the work to its capture; ending the capture makes a graph
//! (`graph.rs`), which replays the same work in order. Calls that would wait for a capturing
//! stream, or that CUDA/HIP forbid during capture in the capture's mode, fail and invalidate it.

use crate::device::{Device, State};
use crate::error::{Error, Kind, Result};
use crate::graph::Node;
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::Instant;

/// The capture modes of `cuStreamBeginCapture` / `hipStreamBeginCapture` (same numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureMode {
    Global,
    ThreadLocal,
    Relaxed,
}

impl CaptureMode {
    pub fn from_raw(v: u32) -> Result<Self> {
        match v {
            0 => Ok(CaptureMode::Global),
            1 => Ok(CaptureMode::ThreadLocal),
            2 => Ok(CaptureMode::Relaxed),
            other => Err(Error::new(Kind::InvalidValue, format!("capture mode {other} (expected 0, 1 or 2)"))),
        }
    }
}

/// A capture in progress.
pub struct Capture {
    pub mode: CaptureMode,
    pub thread: ThreadId,
    pub nodes: Vec<Node>,
    /// Why the capture can no longer produce a graph.
    pub invalid: Option<String>,
}

impl Capture {
    /// Whether this capture forbids a potentially unsafe call made by thread `t`.
    pub fn forbids(&self, t: ThreadId) -> bool {
        match self.mode {
            CaptureMode::Global => true,
            CaptureMode::ThreadLocal => self.thread == t,
            CaptureMode::Relaxed => false,
        }
    }

    pub fn invalidate(&mut self, why: String) {
        self.invalid.get_or_insert(why);
    }
}

#[derive(Default)]
pub struct Stream {
    pub capture: Option<Capture>,
}

pub struct Event {
    pub timing: bool,
    pub recorded: Option<Instant>,
    /// Last recorded inside a capture (waiting on it or timing it is not allowed).
    pub in_capture: bool,
}

/// Which stream a raw handle names: the legacy/per-thread default streams (0, 1, 2 on CUDA;
/// null on HIP) never capture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamRef {
    Default,
    Owned(u64),
}

impl StreamRef {
    pub fn from_raw(h: u64) -> Self {
        if h <= 2 {
            StreamRef::Default
        } else {
            StreamRef::Owned(h)
        }
    }
}

impl State {
    /// The capture of `s`, if it is capturing (an error for a destroyed or unknown stream).
    fn capture_of(&mut self, s: StreamRef) -> Result<Option<&mut Capture>> {
        match s {
            StreamRef::Default => Ok(None),
            StreamRef::Owned(h) => Ok(self.streams.get_mut(h)?.capture.as_mut()),
        }
    }
}

impl Device {
    pub fn create_stream(&self) -> u64 {
        self.lock().streams.insert(Stream::default())
    }

    pub fn destroy_stream(&self, h: u64) -> Result<()> {
        let mut st = self.lock();
        let s = st.streams.remove(h)?;
        if s.capture.is_some() {
            return Err(Error::new(Kind::CaptureInvalidated, format!("stream {h:#x} was destroyed while capturing (the capture is lost)")));
        }
        Ok(())
    }

    /// Runs `node` on stream `s`, or appends it to the stream's capture.
    pub fn enqueue(&self, s: StreamRef, node: Node) -> Result<()> {
        let mut st = self.lock();
        if let Some(c) = st.capture_of(s)? {
            if let Some(why) = &c.invalid {
                return Err(Error::new(Kind::CaptureInvalidated, format!("the capture of this stream is invalid: {why}")));
            }
            c.nodes.push(node);
            return Ok(());
        }
        node.run(self, &mut st)
    }

    /// A host <-> device copy: only outside capture (host memory here is pageable, which CUDA and
    /// HIP do not capture), and it completes before returning.
    pub fn copy_host(&self, s: StreamRef, dst: u64, src: u64, len: usize, to_device: bool) -> Result<()> {
        let mut st = self.lock();
        if let Some(c) = st.capture_of(s)? {
            c.invalidate("a host <-> device copy was enqueued".into());
            return Err(Error::new(
                Kind::CaptureUnsupported,
                "a copy between pageable host memory and the device cannot be captured (the capture is now invalid)",
            ));
        }
        if len == 0 {
            return Ok(());
        }
        if to_device {
            st.mem.check_range(dst, len, "copy destination")?;
        } else {
            st.mem.check_range(src, len, "copy source")?;
        }
        if src == 0 || dst == 0 {
            return Err(Error::new(Kind::InvalidValue, "null host pointer"));
        }
        // SAFETY: the device side lies in a live allocation; the host side is the caller's
        // buffer of `len` bytes (the API's contract).
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
        Ok(())
    }

    /// Waits for stream `s` (immediate here); an error on a capturing stream.
    pub fn synchronize_stream(&self, s: StreamRef) -> Result<()> {
        let mut st = self.lock();
        if let Some(c) = st.capture_of(s)? {
            c.invalidate("the stream was synchronised".into());
            return Err(Error::new(Kind::CaptureUnsupported, "synchronising a capturing stream (the capture is now invalid)"));
        }
        Ok(())
    }

    /// Whether stream `s` is done (always, outside capture).
    pub fn query_stream(&self, s: StreamRef) -> Result<()> {
        self.synchronize_stream(s)
    }

    /// Waits for the whole device.
    pub fn synchronize(&self) -> Result<()> {
        self.lock().forbid_during_capture("a device synchronisation")
    }

    // ---- events ----

    pub fn create_event(&self, timing: bool) -> u64 {
        self.lock().events.insert(Event { timing, recorded: None, in_capture: false })
    }

    pub fn destroy_event(&self, h: u64) -> Result<()> {
        self.lock().events.remove(h).map(|_| ())
    }

    pub fn record_event(&self, e: u64, s: StreamRef) -> Result<()> {
        let mut st = self.lock();
        st.events.get(e)?;
        let capturing = st.capture_of(s)?.is_some();
        let ev = st.events.get_mut(e)?;
        if capturing {
            ev.in_capture = true;
        } else {
            ev.recorded = Some(Instant::now());
            ev.in_capture = false;
        }
        Ok(())
    }

    fn check_not_captured(&self, st: &State, e: u64, what: &str) -> Result<()> {
        if st.events.get(e)?.in_capture {
            return Err(Error::new(Kind::CapturedEvent, format!("{what} of an event last recorded in a capturing stream")));
        }
        Ok(())
    }

    pub fn synchronize_event(&self, e: u64) -> Result<()> {
        let st = self.lock();
        self.check_not_captured(&st, e, "synchronisation")
    }

    pub fn query_event(&self, e: u64) -> Result<()> {
        let st = self.lock();
        self.check_not_captured(&st, e, "query")
    }

    /// `end - start` in milliseconds. Both must be timing events recorded outside capture.
    pub fn elapsed_ms(&self, start: u64, end: u64) -> Result<f32> {
        let st = self.lock();
        let mut at = [None; 2];
        for (i, (h, which)) in [(start, "start"), (end, "end")].into_iter().enumerate() {
            self.check_not_captured(&st, h, "timing")?;
            let ev = st.events.get(h)?;
            if !ev.timing {
                return Err(Error::new(Kind::InvalidHandle, format!("the {which} event was created with timing disabled")));
            }
            at[i] = Some(ev.recorded.ok_or_else(|| Error::new(Kind::InvalidHandle, format!("the {which} event was never recorded")))?);
        }
        let (s, e) = (at[0].unwrap_or_else(Instant::now), at[1].unwrap_or_else(Instant::now));
        let ms = if e >= s { e.duration_since(s).as_secs_f64() * 1e3 } else { -(s.duration_since(e).as_secs_f64() * 1e3) };
        Ok(ms as f32)
    }

    /// Makes `s` wait for `e`: already true outside capture. Joining a capture through an event
    /// recorded in another capturing stream (fork/join capture) is not emulated.
    pub fn wait_event(&self, s: StreamRef, e: u64) -> Result<()> {
        let mut st = self.lock();
        let in_capture = st.events.get(e)?.in_capture;
        let capturing = st.capture_of(s)?.is_some();
        if in_capture && !capturing {
            return Err(Error::new(
                Kind::CaptureUnsupported,
                "waiting on an event recorded in another stream's capture (cross-stream capture) is not emulated by the stand-in",
            ));
        }
        Ok(())
    }

    // ---- capture ----

    pub fn begin_capture(&self, s: StreamRef, mode: CaptureMode) -> Result<()> {
        let StreamRef::Owned(h) = s else {
            return Err(Error::new(Kind::CaptureUnsupported, "the default (legacy) stream cannot be captured"));
        };
        let mut st = self.lock();
        let stream = st.streams.get_mut(h)?;
        if stream.capture.is_some() {
            return Err(Error::new(Kind::IllegalState, format!("stream {h:#x} is already capturing")));
        }
        stream.capture = Some(Capture { mode, thread: std::thread::current().id(), nodes: Vec::new(), invalid: None });
        Ok(())
    }

    /// Ends the capture of `s`: the new graph's handle, or why there is none.
    pub fn end_capture(&self, s: StreamRef) -> Result<u64> {
        let StreamRef::Owned(h) = s else {
            return Err(Error::new(Kind::IllegalState, "the default stream is not capturing"));
        };
        let mut st = self.lock();
        let stream = st.streams.get_mut(h)?;
        let Some(c) = stream.capture.as_ref() else {
            return Err(Error::new(Kind::IllegalState, format!("stream {h:#x} is not capturing")));
        };
        if c.mode != CaptureMode::Relaxed && c.thread != std::thread::current().id() {
            return Err(Error::new(Kind::CaptureWrongThread, "the capture must be ended by the thread that began it"));
        }
        let c = stream.capture.take().ok_or_else(|| Error::new(Kind::IllegalState, "capture vanished"))?;
        if let Some(why) = c.invalid {
            return Err(Error::new(Kind::CaptureInvalidated, format!("the capture was invalidated: {why}")));
        }
        Ok(st.graphs.insert(Arc::new(c.nodes)))
    }

    /// `None` = not capturing, `Some(false)` = capturing, `Some(true)` = capture invalidated.
    pub fn capture_status(&self, s: StreamRef) -> Result<Option<bool>> {
        let mut st = self.lock();
        Ok(st.capture_of(s)?.map(|c| c.invalid.is_some()))
    }

    // ---- graphs ----

    pub fn instantiate(&self, graph: u64) -> Result<u64> {
        let mut st = self.lock();
        let nodes = st.graphs.get(graph)?.clone();
        Ok(st.execs.insert(nodes))
    }

    pub fn destroy_graph(&self, g: u64) -> Result<()> {
        self.lock().graphs.remove(g).map(|_| ())
    }

    pub fn destroy_exec(&self, g: u64) -> Result<()> {
        self.lock().execs.remove(g).map(|_| ())
    }

    /// Replays an executable graph on `s` (or appends it to `s`'s capture).
    pub fn launch_graph(&self, exec: u64, s: StreamRef) -> Result<()> {
        let nodes = self.lock().execs.get(exec)?.clone();
        self.enqueue(s, Node::Graph(nodes))
    }
}
