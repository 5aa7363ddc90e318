//! Device attributes (`hipDeviceGetAttribute`, enum values of HIP 5.2's `hipDeviceAttribute_t`)
//! and `hipDeviceProp_t` in the two layouts HIP has had: the original one (HIP 5, and the
//! unversioned `hipGetDeviceProperties` kept in HIP 6+, 792 bytes, `gcnArchName` at 396) and
//! `hipDeviceProp_tR0600` (HIP 6 and 7, 1472 bytes, `gcnArchName` at 1160). Offsets were
//! measured with `offsetof` on the Debian 5.2 header and on ROCm 6.2's header.

use k3_standin::error::{invalid, Result};
use k3_standin::Personality;
use std::ffi::{c_int, c_void};

/// The value of one attribute.
pub fn attribute(p: &Personality, attr: c_int) -> Result<c_int> {
    let clamp = |v: u64| v.min(i32::MAX as u64) as c_int;
    let gfx_number = p.arch.trim_start_matches("gfx").parse::<c_int>().unwrap_or(0);
    Ok(match attr {
        5 => p.clock_khz as c_int,
        8 => 1,
        16 => 0,
        19 => p.l2_bytes as c_int,
        23 => p.cc.0 as c_int,
        61 => p.cc.1 as c_int,
        25 => p.max_blocks_per_multiprocessor as c_int,
        26..=28 => 1024,
        29 => i32::MAX,
        30 | 31 => 65536,
        56 => p.max_threads_per_block as c_int,
        57 => p.max_threads_per_multiprocessor as c_int,
        59 => p.mem_bus_bits as c_int,
        60 => p.mem_clock_khz as c_int,
        63 | 10015 => p.multiprocessors as c_int,
        71 => p.regs_per_block as c_int,
        72 => p.regs_per_multiprocessor as c_int,
        74 => p.smem_per_block as c_int,
        75 => p.smem_per_block_optin as c_int,
        76 | 10002 => p.smem_per_multiprocessor as c_int,
        83 => i32::MAX,
        84 => clamp(p.total_mem),
        87 => p.warp_size() as c_int,
        10000 => 100_000,
        10003 => gfx_number,
        10012 => 0,
        other => return Err(invalid(format!("device attribute {other} is not emulated by the stand-in"))),
    })
}

/// Which `hipDeviceProp_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    R0000,
    R0600,
}

/// Byte offsets of the fields the stand-in fills.
struct Offsets {
    size: usize,
    total_global_mem: usize,
    shared_mem_per_block: usize,
    regs_per_block: usize,
    warp_size: usize,
    max_threads_per_block: usize,
    max_threads_dim: usize,
    max_grid_size: usize,
    clock_rate: usize,
    memory_clock_rate: usize,
    memory_bus_width: usize,
    major: usize,
    minor: usize,
    multi_processor_count: usize,
    l2_cache_size: usize,
    max_threads_per_multiprocessor: usize,
    concurrent_kernels: usize,
    gcn_arch: Option<usize>,
    gcn_arch_name: usize,
    max_shared_memory_per_multiprocessor: usize,
    shared_mem_per_block_optin: Option<usize>,
    regs_per_multiprocessor: Option<usize>,
}

const R0000: Offsets = Offsets {
    size: 792,
    total_global_mem: 256,
    shared_mem_per_block: 264,
    regs_per_block: 272,
    warp_size: 276,
    max_threads_per_block: 280,
    max_threads_dim: 284,
    max_grid_size: 296,
    clock_rate: 308,
    memory_clock_rate: 312,
    memory_bus_width: 316,
    major: 328,
    minor: 332,
    multi_processor_count: 336,
    l2_cache_size: 340,
    max_threads_per_multiprocessor: 344,
    concurrent_kernels: 360,
    gcn_arch: Some(392),
    gcn_arch_name: 396,
    max_shared_memory_per_multiprocessor: 376,
    shared_mem_per_block_optin: None,
    regs_per_multiprocessor: None,
};

const R0600: Offsets = Offsets {
    size: 1472,
    total_global_mem: 288,
    shared_mem_per_block: 296,
    regs_per_block: 304,
    warp_size: 308,
    max_threads_per_block: 320,
    max_threads_dim: 324,
    max_grid_size: 336,
    clock_rate: 348,
    memory_clock_rate: 608,
    memory_bus_width: 612,
    major: 360,
    minor: 364,
    multi_processor_count: 388,
    l2_cache_size: 616,
    max_threads_per_multiprocessor: 624,
    concurrent_kernels: 576,
    gcn_arch: None,
    gcn_arch_name: 1160,
    max_shared_memory_per_multiprocessor: 1416,
    shared_mem_per_block_optin: Some(696),
    regs_per_multiprocessor: Some(648),
};

/// The size of a layout in bytes.
pub fn size(l: Layout) -> usize {
    match l {
        Layout::R0000 => R0000.size,
        Layout::R0600 => R0600.size,
    }
}

/// Fills the caller's `hipDeviceProp_t` of layout `l` (zeroing what the stand-in does not set).
pub fn write(p: &Personality, l: Layout, out: *mut c_void) -> Result<()> {
    if out.is_null() {
        return Err(invalid("prop is null"));
    }
    let o = match l {
        Layout::R0000 => &R0000,
        Layout::R0600 => &R0600,
    };
    let mut b = vec![0u8; o.size];
    let mut put = |at: usize, bytes: &[u8]| b[at..at + bytes.len()].copy_from_slice(bytes);
    let i = |v: u32| (v as i32).to_ne_bytes();
    let z = |v: u64| (v as usize).to_ne_bytes();
    let name = p.device_name();
    put(0, &name.as_bytes()[..name.len().min(255)]);
    put(o.total_global_mem, &z(p.total_mem));
    put(o.shared_mem_per_block, &z(p.smem_per_block as u64));
    put(o.regs_per_block, &i(p.regs_per_block));
    put(o.warp_size, &i(p.warp_size()));
    put(o.max_threads_per_block, &i(p.max_threads_per_block));
    for (k, v) in [1024u32, 1024, 1024].iter().enumerate() {
        put(o.max_threads_dim + 4 * k, &i(*v));
    }
    for (k, v) in [i32::MAX as u32, 65536, 65536].iter().enumerate() {
        put(o.max_grid_size + 4 * k, &i(*v));
    }
    put(o.clock_rate, &i(p.clock_khz));
    put(o.memory_clock_rate, &i(p.mem_clock_khz));
    put(o.memory_bus_width, &i(p.mem_bus_bits));
    put(o.major, &i(p.cc.0));
    put(o.minor, &i(p.cc.1));
    put(o.multi_processor_count, &i(p.multiprocessors));
    put(o.l2_cache_size, &i(p.l2_bytes));
    put(o.max_threads_per_multiprocessor, &i(p.max_threads_per_multiprocessor));
    put(o.concurrent_kernels, &i(1));
    if let Some(at) = o.gcn_arch {
        put(at, &i(p.arch.trim_start_matches("gfx").parse::<u32>().unwrap_or(0)));
    }
    put(o.gcn_arch_name, &p.gcn_arch_name.as_bytes()[..p.gcn_arch_name.len().min(255)]);
    put(o.max_shared_memory_per_multiprocessor, &z(p.smem_per_multiprocessor as u64));
    if let Some(at) = o.shared_mem_per_block_optin {
        put(at, &z(p.smem_per_block_optin as u64));
    }
    if let Some(at) = o.regs_per_multiprocessor {
        put(at, &i(p.regs_per_multiprocessor));
    }
    // SAFETY: the caller passes a hipDeviceProp_t of this layout (o.size bytes).
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), out as *mut u8, o.size) };
    Ok(())
}
