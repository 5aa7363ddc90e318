//! The soname cudarc tries first for cuBLASLt (`libcublasLt.so`), so that after backend-cuda
//! opened this file by the path in K3_CUBLASLT_LIBRARY, cudarc's dlopen finds it loaded.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcublasLt.so");
}
