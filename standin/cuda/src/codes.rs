//! CUresult codes, names and texts (values as in CUDA's `cuda.h`), and the call wrapper that
//! logs and maps the stand-in's errors.

use k3_standin::error::{self, Kind, Result};
use std::ffi::{c_char, CStr};

pub type CuResult = i32;
pub const SUCCESS: CuResult = 0;
pub const INVALID_VALUE: CuResult = 1;
pub const NOT_READY: CuResult = 600;

/// (code, name, text) of every code the stand-in returns.
const TABLE: &[(CuResult, &str, &str)] = &[
    (0, "CUDA_SUCCESS", "no error"),
    (1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"),
    (3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"),
    (100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"),
    (101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"),
    (200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"),
    (201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"),
    (209, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"),
    (400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"),
    (401, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"),
    (500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"),
    (600, "CUDA_ERROR_NOT_READY", "device not ready"),
    (700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"),
    (701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"),
    (719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"),
    (801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"),
    (900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"),
    (901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"),
    (907, "CUDA_ERROR_CAPTURED_EVENT", "operation not permitted on an event last recorded in a capturing stream"),
    (908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "attempt to terminate a thread-local capture sequence from another thread"),
    (999, "CUDA_ERROR_UNKNOWN", "unknown error"),
];

pub fn code(kind: Kind) -> CuResult {
    match kind {
        Kind::InvalidValue | Kind::InvalidConfiguration => 1,
        Kind::OutOfMemory => 2,
        Kind::NotInitialized => 3,
        Kind::NoDevice => 100,
        Kind::InvalidDevice => 101,
        Kind::InvalidImage => 200,
        Kind::InvalidContext => 201,
        Kind::NoBinaryForGpu => 209,
        Kind::InvalidHandle => 400,
        Kind::IllegalState => 401,
        Kind::NotFound => 500,
        Kind::NotReady => 600,
        Kind::IllegalAddress => 700,
        Kind::LaunchOutOfResources => 701,
        Kind::LaunchFailed => 719,
        Kind::NotSupported => 801,
        Kind::CaptureUnsupported => 900,
        Kind::CaptureInvalidated => 901,
        Kind::CapturedEvent => 907,
        Kind::CaptureWrongThread => 908,
    }
}

fn entry(c: CuResult) -> Option<&'static (CuResult, &'static str, &'static str)> {
    TABLE.iter().find(|(v, _, _)| *v == c)
}

pub fn name_of(kind: Kind) -> &'static str {
    entry(code(kind)).map(|e| e.1).unwrap_or("CUDA_ERROR_UNKNOWN")
}

/// The kind whose code is `c` (the first, when several share it).
fn kind_of(c: CuResult) -> Option<Kind> {
    use Kind::*;
    [
        InvalidValue, OutOfMemory, NotInitialized, NoDevice, InvalidDevice, InvalidImage, InvalidContext, NoBinaryForGpu,
        InvalidHandle, IllegalState, NotFound, NotReady, IllegalAddress, LaunchOutOfResources, LaunchFailed, NotSupported,
        CaptureUnsupported, CaptureInvalidated, CapturedEvent, CaptureWrongThread,
    ]
    .into_iter()
    .find(|k| code(*k) == c)
}

/// `cuGetErrorName`'s text, or None for a code the stand-in does not know.
pub fn name(c: CuResult) -> Option<*const c_char> {
    entry(c).map(|e| error::intern(e.1.to_string()).as_ptr())
}

/// `cuGetErrorString`'s text: the standard one, with this thread's last message of that kind.
pub fn string(c: CuResult) -> Option<*const c_char> {
    let (_, _, text) = entry(c)?;
    let s: &'static CStr = error::describe(kind_of(c), text);
    Some(s.as_ptr())
}

/// Runs one exported call: errors are logged once and mapped to their CUresult.
pub fn run(call: &str, f: impl FnOnce() -> Result<()>) -> CuResult {
    match error::guard("cuda", call, name_of, f) {
        Ok(()) => SUCCESS,
        Err(e) => code(e.kind),
    }
}
