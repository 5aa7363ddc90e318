//! Helpers shared by the integration tests: runtimes, typed uploads/downloads, launches.
#![allow(dead_code)]

use k3_backend_simt::{SimtBuffer, SimtRuntime};
use k3_kernels::{KernelArgs, LaunchConfig, Runtime};
use kernel_api::Result;

/// Both warp sizes the emulator runs.
pub const WARPS: [u32; 2] = [32, 64];

/// A runtime honouring K3_SIMT_SEED (so the whole suite can be rerun under a seed).
pub fn rt(warp: u32) -> SimtRuntime {
    SimtRuntime::new(warp).expect("runtime")
}

pub fn upload<T: bytemuck::Pod>(rt: &SimtRuntime, v: &[T]) -> SimtBuffer {
    let bytes: &[u8] = bytemuck::cast_slice(v);
    let mut b = rt.alloc(bytes.len()).expect("alloc");
    rt.copy_h2d(bytes, &mut b, 0, rt.default_stream()).expect("h2d");
    b
}

/// A buffer of n elements filled with 0xFF bytes (what `alloc` gives).
pub fn alloc<T: bytemuck::Pod>(rt: &SimtRuntime, n: usize) -> SimtBuffer {
    rt.alloc(n * std::mem::size_of::<T>()).expect("alloc")
}

pub fn download<T: bytemuck::Pod + Default + Clone>(rt: &SimtRuntime, b: &SimtBuffer) -> Vec<T> {
    let mut out = vec![T::default(); b.len() / std::mem::size_of::<T>()];
    rt.copy_d2h(b, 0, bytemuck::cast_slice_mut(&mut out), rt.default_stream()).expect("d2h");
    out
}

/// Launches `name` with the given arguments.
pub fn launch(rt: &SimtRuntime, name: &str, cfg: LaunchConfig, args: &mut KernelArgs) -> Result<()> {
    // SAFETY: every test passes arguments matching the kernel's signature in kernels/csrc/tests
    // and buffers large enough for the accesses the launch configuration implies.
    unsafe { rt.launch_args(name, &cfg, args) }
}

/// Line number (1-based) of the line containing `marker` in a test kernel source.
pub fn marker_line(source: &str, marker: &str) -> usize {
    source.lines().position(|l| l.contains(marker)).map(|i| i + 1).expect("marker in source")
}

/// Tiny deterministic generator for test inputs.
pub struct Lcg(pub u64);
impl Lcg {
    pub fn next_u32(&mut self) -> u32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 32) as u32
    }
    /// Uniform in [lo, hi) on a grid of 1/8 (exactly representable, sums stay exact).
    pub fn eighths(&mut self, lo: i32, hi: i32) -> f32 {
        let span = ((hi - lo) * 8) as u32;
        (lo * 8 + (self.next_u32() % span) as i32) as f32 / 8.0
    }
}
