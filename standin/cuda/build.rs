//! The soname cudarc tries first (`libcuda.so`): once backend-cuda has opened this file by the
//! full path in K3_CUDA_DRIVER_LIBRARY, cudarc's own dlopen("libcuda.so") finds it among the
//! loaded objects instead of searching for a real driver. The file itself is never named
//! libcuda, so nothing finds it by accident.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so");
}
