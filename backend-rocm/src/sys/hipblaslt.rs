//! hipBLASLt, written from `library/include/hipblaslt.h` of ROCm/hipBLASLt (the ROCm 6.x and 7.x
//! API: `hipDataType` operands and `hipblasComputeType_t`) and `hipblas-common.h`. No Debian
//! package ships these headers, so, unlike `hip_generated.rs`, no CI step regenerates them; the
//! values below were compared with those headers by hand (crate README). hipBLASLt before ROCm
//! 6.0 used other enums (`hipblasDatatype_t`, `hipblasLtComputeType_t` = 300+), which is why the
//! backend uses hipBLASLt only with a HIP runtime of major version 6 or newer.

use super::hip_generated::hipStream_t;
use std::os::raw::{c_int, c_void};

pub type hipblasStatus_t = c_int;
pub const HIPBLAS_STATUS_SUCCESS: hipblasStatus_t = 0;

/// `hipDataType` (hip/library_types.h).
pub type hipDataType = c_int;
pub const HIP_R_32F: hipDataType = 0;
pub const HIP_R_16BF: hipDataType = 14;

/// `hipblasComputeType_t` (hipblas-common.h).
pub type hipblasComputeType_t = c_int;
pub const HIPBLAS_COMPUTE_32F: hipblasComputeType_t = 2;

/// `hipblasOperation_t` (hipblas-common.h): not cuBLAS's 0/1.
pub type hipblasOperation_t = c_int;
pub const HIPBLAS_OP_N: hipblasOperation_t = 111;
pub const HIPBLAS_OP_T: hipblasOperation_t = 112;

pub type hipblasLtEpilogue_t = u32;
pub const HIPBLASLT_EPILOGUE_DEFAULT: hipblasLtEpilogue_t = 1;
pub const HIPBLASLT_EPILOGUE_BIAS: hipblasLtEpilogue_t = 4;

pub type hipblasLtMatmulDescAttributes_t = c_int;
pub const HIPBLASLT_MATMUL_DESC_TRANSA: hipblasLtMatmulDescAttributes_t = 0;
pub const HIPBLASLT_MATMUL_DESC_TRANSB: hipblasLtMatmulDescAttributes_t = 1;
pub const HIPBLASLT_MATMUL_DESC_EPILOGUE: hipblasLtMatmulDescAttributes_t = 2;
pub const HIPBLASLT_MATMUL_DESC_BIAS_POINTER: hipblasLtMatmulDescAttributes_t = 3;
pub const HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: hipblasLtMatmulDescAttributes_t = 4;

pub type hipblasLtMatmulPreferenceAttributes_t = c_int;
pub const HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: hipblasLtMatmulPreferenceAttributes_t = 1;

pub type hipblasLtHandle_t = *mut c_void;
pub type hipblasLtMatmulDesc_t = *mut c_void;
pub type hipblasLtMatrixLayout_t = *mut c_void;
pub type hipblasLtMatmulPreference_t = *mut c_void;

/// `hipblasLtMatmulAlgo_t`: 16 opaque bytes and the workspace the algorithm was chosen for.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct hipblasLtMatmulAlgo_t {
    pub data: [u8; 16],
    pub max_workspace_bytes: usize,
}

/// `hipblasLtMatmulHeuristicResult_t` (56 bytes on LP64).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct hipblasLtMatmulHeuristicResult_t {
    pub algo: hipblasLtMatmulAlgo_t,
    pub workspaceSize: usize,
    pub state: hipblasStatus_t,
    pub wavesCount: f32,
    pub reserved: [c_int; 4],
}

hip_functions! {
    /// The hipBLASLt functions backend-rocm calls.
    HipblasLtFns {
        pub fn hipblasLtCreate(handle: *mut hipblasLtHandle_t) -> hipblasStatus_t;
        pub fn hipblasLtDestroy(handle: hipblasLtHandle_t) -> hipblasStatus_t;
        pub fn hipblasLtMatmulDescCreate(matmulDesc: *mut hipblasLtMatmulDesc_t, computeType: hipblasComputeType_t, scaleType: hipDataType) -> hipblasStatus_t;
        pub fn hipblasLtMatmulDescDestroy(matmulDesc: hipblasLtMatmulDesc_t) -> hipblasStatus_t;
        pub fn hipblasLtMatmulDescSetAttribute(matmulDesc: hipblasLtMatmulDesc_t, attr: hipblasLtMatmulDescAttributes_t, buf: *const c_void, sizeInBytes: usize) -> hipblasStatus_t;
        pub fn hipblasLtMatrixLayoutCreate(matLayout: *mut hipblasLtMatrixLayout_t, type_: hipDataType, rows: u64, cols: u64, ld: i64) -> hipblasStatus_t;
        pub fn hipblasLtMatrixLayoutDestroy(matLayout: hipblasLtMatrixLayout_t) -> hipblasStatus_t;
        pub fn hipblasLtMatmulPreferenceCreate(pref: *mut hipblasLtMatmulPreference_t) -> hipblasStatus_t;
        pub fn hipblasLtMatmulPreferenceDestroy(pref: hipblasLtMatmulPreference_t) -> hipblasStatus_t;
        pub fn hipblasLtMatmulPreferenceSetAttribute(pref: hipblasLtMatmulPreference_t, attr: hipblasLtMatmulPreferenceAttributes_t, buf: *const c_void, sizeInBytes: usize) -> hipblasStatus_t;
        pub fn hipblasLtMatmulAlgoGetHeuristic(handle: hipblasLtHandle_t, matmulDesc: hipblasLtMatmulDesc_t, Adesc: hipblasLtMatrixLayout_t, Bdesc: hipblasLtMatrixLayout_t, Cdesc: hipblasLtMatrixLayout_t, Ddesc: hipblasLtMatrixLayout_t, pref: hipblasLtMatmulPreference_t, requestedAlgoCount: c_int, heuristicResultsArray: *mut hipblasLtMatmulHeuristicResult_t, returnAlgoCount: *mut c_int) -> hipblasStatus_t;
        pub fn hipblasLtMatmul(handle: hipblasLtHandle_t, matmulDesc: hipblasLtMatmulDesc_t, alpha: *const c_void, A: *const c_void, Adesc: hipblasLtMatrixLayout_t, B: *const c_void, Bdesc: hipblasLtMatrixLayout_t, beta: *const c_void, C: *const c_void, Cdesc: hipblasLtMatrixLayout_t, D: *mut c_void, Ddesc: hipblasLtMatrixLayout_t, algo: *const hipblasLtMatmulAlgo_t, workspace: *mut c_void, workspaceSizeInBytes: usize, stream: hipStream_t) -> hipblasStatus_t;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heuristic_result_has_the_headers_size() {
        // data[16] + size_t, size_t, int, float, int[4] = 24 + 8 + 4 + 4 + 16.
        assert_eq!(std::mem::size_of::<hipblasLtMatmulAlgo_t>(), 24);
        assert_eq!(std::mem::size_of::<hipblasLtMatmulHeuristicResult_t>(), 56);
    }
}
