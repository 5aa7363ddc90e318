//! Errors of the emulated device, vendor-neutral: each front maps a [`Kind`] to its own code
//! (`CUresult`, `hipError_t`). Errors are logged to stderr, the first of each (call, code) pair
//! in full (callers probe, e.g. a kernel name in every module, so one line per kind of failure
//! keeps stderr readable), and every message is kept per thread and kind for the front's
//! error-string call.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString};
use std::fmt;
use std::sync::Mutex;

/// What went wrong, in the terms both driver APIs share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    InvalidValue,
    /// A stream, event, module, function or graph handle that is not live (never created, or
    /// used after its destroy call).
    InvalidHandle,
    NotFound,
    OutOfMemory,
    NotInitialized,
    NoDevice,
    InvalidDevice,
    /// No current context on the calling thread (CUDA).
    InvalidContext,
    InvalidImage,
    NoBinaryForGpu,
    /// Registers or threads beyond what the kernel can run with.
    LaunchOutOfResources,
    /// A launch configuration beyond the device's limits.
    InvalidConfiguration,
    /// A kernel stopped by one of the emulator's runtime checks.
    LaunchFailed,
    /// A pointer outside every live allocation, or into a freed one.
    IllegalAddress,
    NotReady,
    NotSupported,
    IllegalState,
    CaptureUnsupported,
    CaptureInvalidated,
    CaptureWrongThread,
    CapturedEvent,
}

/// An error with the stand-in's explanation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: Kind,
    pub msg: String,
}

impl Error {
    pub fn new(kind: Kind, msg: impl Into<String>) -> Self {
        Error { kind, msg: msg.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.msg)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// Shorthand constructors.
pub fn invalid(msg: impl Into<String>) -> Error {
    Error::new(Kind::InvalidValue, msg)
}

/// Messages already printed (each once) and the C strings handed out by error-string calls,
/// which must stay valid for the life of the process.
struct Log {
    printed: HashSet<String>,
    interned: HashMap<String, &'static CStr>,
}

static LOG: Mutex<Option<Log>> = Mutex::new(None);
/// Distinct message texts kept for error-string calls; beyond it the plain text is returned.
const MAX_INTERNED: usize = 4096;

thread_local! {
    /// Per thread and kind: the last message, what the front's error string returns.
    static LAST: RefCell<HashMap<Kind, String>> = RefCell::new(HashMap::new());
}

/// Records `e`, returned by `call` of the `front` (`cuda`, `hip`): printed to stderr the first
/// time `call` returns this code, and kept as this thread's last message for its kind.
pub fn report(front: &str, call: &str, code_name: &str, e: &Error) {
    let key = format!("{front} {call} {code_name}");
    if let Ok(mut g) = LOG.lock() {
        let log = g.get_or_insert_with(|| Log { printed: HashSet::new(), interned: HashMap::new() });
        if log.printed.insert(key) {
            eprintln!(
                "k3 stand-in ({front}): {call} -> {code_name}: {} (later {code_name} from {call} are not printed; the error string has each)",
                e.msg
            );
        }
    }
    let text = format!("{call}: {}", e.msg);
    LAST.with(|l| l.borrow_mut().insert(e.kind, text));
}

/// `standard (k3 stand-in: <last message of this kind on this thread>)`, as a C string valid
/// for the life of the process.
pub fn describe(kind: Option<Kind>, standard: &str) -> &'static CStr {
    let detail = kind.and_then(|k| LAST.with(|l| l.borrow().get(&k).cloned()));
    let text = match detail {
        Some(d) => format!("{standard} (k3 stand-in: {d})"),
        None => standard.to_string(),
    };
    intern(text)
}

/// A C string for `text` that lives as long as the process (identical texts share one).
pub fn intern(text: String) -> &'static CStr {
    let Ok(mut g) = LOG.lock() else { return c"k3 stand-in: error log unavailable" };
    let log = g.get_or_insert_with(|| Log { printed: HashSet::new(), interned: HashMap::new() });
    if let Some(s) = log.interned.get(&text) {
        return s;
    }
    if log.interned.len() >= MAX_INTERNED {
        return c"k3 stand-in: too many distinct error messages to keep (see stderr)";
    }
    let c = CString::new(text.replace('\0', " ")).unwrap_or_default();
    let leaked: &'static CStr = Box::leak(c.into_boxed_c_str());
    log.interned.insert(text, leaked);
    leaked
}

/// Runs the body of an exported driver call: a panic becomes an error instead of unwinding into
/// C, and every error is [`report`]ed under `call` with the front's name for its code.
pub fn guard<T>(front: &str, call: &str, code_name: impl Fn(Kind) -> &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let r = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(Error::new(Kind::LaunchFailed, format!("internal error of the stand-in: {msg}")))
        }
    };
    if let Err(e) = &r {
        report(front, call, code_name(e.kind), e);
    }
    r
}
