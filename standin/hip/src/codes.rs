//! hipError_t codes and texts (values as in HIP's `hip_runtime_api.h`), the per-thread last
//! error, and the HIP version the stand-in imitates (`K3_STANDIN_HIP_VERSION=5|6|7`, default 6).

use k3_standin::error::{self, Kind};
use std::cell::Cell;
use std::ffi::{c_char, CStr};

pub type HipError = i32;
pub const SUCCESS: HipError = 0;
pub const INVALID_VALUE: HipError = 1;
pub const INVALID_MEMCPY_DIRECTION: HipError = 21;
pub const NO_DEVICE: HipError = 100;
pub const INVALID_DEVICE: HipError = 101;
pub const NOT_READY: HipError = 600;

/// (code, name, text) for every code the stand-in returns.
const TABLE: &[(HipError, &str, &str)] = &[
    (0, "hipSuccess", "no error"),
    (1, "hipErrorInvalidValue", "invalid argument"),
    (2, "hipErrorOutOfMemory", "out of memory"),
    (3, "hipErrorNotInitialized", "initialization error"),
    (9, "hipErrorInvalidConfiguration", "invalid configuration argument"),
    (21, "hipErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"),
    (100, "hipErrorNoDevice", "no ROCm-capable device is detected"),
    (101, "hipErrorInvalidDevice", "invalid device ordinal"),
    (200, "hipErrorInvalidImage", "device kernel image is invalid"),
    (201, "hipErrorInvalidContext", "invalid device context"),
    (209, "hipErrorNoBinaryForGpu", "no kernel image is available for execution on the device"),
    (400, "hipErrorInvalidHandle", "invalid resource handle"),
    (401, "hipErrorIllegalState", "the operation cannot be performed in the present state"),
    (500, "hipErrorNotFound", "named symbol not found"),
    (600, "hipErrorNotReady", "device not ready"),
    (700, "hipErrorIllegalAddress", "an illegal memory access was encountered"),
    (701, "hipErrorLaunchOutOfResources", "too many resources requested for launch"),
    (719, "hipErrorLaunchFailure", "unspecified launch failure"),
    (801, "hipErrorNotSupported", "operation not supported"),
    (900, "hipErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"),
    (901, "hipErrorStreamCaptureInvalidated", "operation failed due to a previous error during capture"),
    (907, "hipErrorCapturedEvent", "operation not permitted on an event last recorded in a capturing stream"),
    (908, "hipErrorStreamCaptureWrongThread", "attempt to terminate a thread-local capture sequence from another thread"),
];

pub fn code(kind: Kind) -> HipError {
    match kind {
        Kind::InvalidValue => 1,
        Kind::OutOfMemory => 2,
        Kind::NotInitialized => 3,
        Kind::InvalidConfiguration => 9,
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

fn kind_of(c: HipError) -> Option<Kind> {
    use Kind::*;
    [
        InvalidValue, OutOfMemory, NotInitialized, InvalidConfiguration, NoDevice, InvalidDevice, InvalidImage, InvalidContext, NoBinaryForGpu,
        InvalidHandle, IllegalState, NotFound, NotReady, IllegalAddress, LaunchOutOfResources, LaunchFailed, NotSupported,
        CaptureUnsupported, CaptureInvalidated, CapturedEvent, CaptureWrongThread,
    ]
    .into_iter()
    .find(|k| code(*k) == c)
}

pub fn name(c: HipError) -> &'static str {
    TABLE.iter().find(|(v, _, _)| *v == c).map(|(_, n, _)| *n).unwrap_or("hipErrorUnknown")
}

pub fn name_of(kind: Kind) -> &'static str {
    name(code(kind))
}

/// `hipGetErrorName`.
pub fn name_ptr(c: HipError) -> *const c_char {
    let n = name(c);
    error::intern(n.to_string()).as_ptr()
}

/// `hipGetErrorString`: the standard text, with this thread's last message of that kind.
pub fn string_ptr(c: HipError) -> *const c_char {
    let text = TABLE.iter().find(|(v, _, _)| *v == c).map(|(_, _, t)| *t).unwrap_or("unknown error");
    let s: &'static CStr = error::describe(kind_of(c), text);
    s.as_ptr()
}

/// The HIP major version imitated: 5, 6 (default) or 7.
pub fn hip_version() -> u32 {
    match std::env::var("K3_STANDIN_HIP_VERSION").ok().as_deref().map(str::trim) {
        Some("5") => 5,
        Some("7") => 7,
        _ => 6,
    }
}

/// `HIP_VERSION` as hipRuntimeGetVersion reports it (major * 10^7 + minor * 10^5 + patch).
pub fn runtime_version() -> i32 {
    match hip_version() {
        5 => 50_200_000 + 22_800,
        7 => 70_000_000 + 41_134,
        _ => 60_400_000 + 43_482,
    }
}

thread_local! {
    static LAST: Cell<HipError> = const { Cell::new(SUCCESS) };
}

/// Records a call's status for hipGetLastError: before HIP 7 the last call's status, from HIP 7
/// the last error (success does not overwrite it), as HIP 7's changes describe.
pub fn set_last(c: HipError) {
    if c != SUCCESS || hip_version() < 7 {
        LAST.with(|l| l.set(c));
    }
}

pub fn take_last() -> HipError {
    LAST.with(|l| l.replace(SUCCESS))
}

pub fn peek_last() -> HipError {
    LAST.with(|l| l.get())
}
