//! The C API of the C++ runtime (src/cpp/pool.cc).

use std::ffi::{c_char, c_int, c_void};

pub const SIMT_OK: c_int = 0;
pub const SIMT_INVALID: c_int = 1;
pub const SIMT_KERNEL_ERROR: c_int = 2;
pub const SIMT_NOT_FOUND: c_int = 3;
pub const SIMT_DUPLICATE: c_int = 4;

extern "C" {
    pub fn simt_get_function(name: *const c_char, warp_size: c_int, out: *mut *const c_void) -> c_int;
    pub fn simt_kernel_count() -> usize;
    pub fn simt_kernel_info(
        i: usize,
        name: *mut *const c_char,
        warp_size: *mut c_int,
        nparams: *mut c_int,
        file: *mut *const c_char,
    ) -> c_int;
    pub fn simt_kernel_params(f: *const c_void, descs: *mut *const u8, nparams: *mut c_int) -> c_int;
    pub fn simt_launch_kernel(
        f: *const c_void,
        grid: *const u32,
        block: *const u32,
        shared_bytes: u32,
        params: *const *mut c_void,
        nparams: usize,
        seed: u64,
        shared_limit: u64,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub fn simt_mma_layout(shape: c_int, operand: c_int, lane: c_int, slot: c_int, row: *mut c_int, col: *mut c_int)
        -> c_int;
    pub fn simt_asan_enabled() -> c_int;
    pub fn simt_context_backend() -> *const c_char;
    pub fn simt_worker_count() -> c_int;
}
