//! Which GPU the stand-in claims to be (`K3_STANDIN_ARCH`): the limits launches are checked
//! against and the attributes plans read. Sources of every figure are in the crate README.

/// The vendor API a stand-in library serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    Cuda,
    Hip,
}

impl Vendor {
    /// Threads per warp (wavefront) the emulator runs for this vendor's kernels.
    pub const fn warp_size(self) -> u32 {
        match self {
            Vendor::Cuda => 32,
            Vendor::Hip => 64,
        }
    }
}

/// One emulated GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Personality {
    /// `K3_STANDIN_ARCH` value: `sm_90a`, `sm_100a`, `sm_103a`, `gfx942`, `gfx950`.
    pub arch: &'static str,
    pub vendor: Vendor,
    /// The product it imitates (`NVIDIA H200`).
    pub product: &'static str,
    /// CUDA compute capability; on HIP the `major.minor` hipDeviceGetAttribute reports (9.4, 9.5).
    pub cc: (u32, u32),
    /// SMs (NVIDIA) or CUs (AMD).
    pub multiprocessors: u32,
    /// Shared memory a block gets without opting in (48 KiB on NVIDIA; the whole LDS on AMD).
    pub smem_per_block: u32,
    /// The most shared memory one block may use (static + dynamic) after opting in.
    pub smem_per_block_optin: u32,
    pub smem_per_multiprocessor: u32,
    pub regs_per_block: u32,
    pub regs_per_multiprocessor: u32,
    pub max_threads_per_block: u32,
    pub max_threads_per_multiprocessor: u32,
    pub max_blocks_per_multiprocessor: u32,
    pub l2_bytes: u32,
    pub total_mem: u64,
    /// Peak SM/CU clock in kHz.
    pub clock_khz: u32,
    /// Peak memory clock in kHz and bus width in bits.
    pub mem_clock_khz: u32,
    pub mem_bus_bits: u32,
    /// Full AMD arch name (`gfx942:sramecc+:xnack-`); empty on NVIDIA.
    pub gcn_arch_name: &'static str,
}

impl Personality {
    /// The device name the drivers report: says it is the stand-in, what it imitates and the arch.
    pub fn device_name(&self) -> String {
        format!("k3 stand-in (emulated {}, {})", self.product, self.arch)
    }

    pub fn warp_size(&self) -> u32 {
        self.vendor.warp_size()
    }
}

const KIB: u32 = 1024;
const MIB: u32 = 1024 * 1024;
const GB: u64 = 1_000_000_000;

/// Every personality, in `K3_STANDIN_ARCH` order.
pub fn all() -> Vec<Personality> {
    let nvidia = |arch, product, cc, sms, l2, mem, clock_khz, mem_clock_khz, bus| Personality {
        arch,
        vendor: Vendor::Cuda,
        product,
        cc,
        multiprocessors: sms,
        smem_per_block: 48 * KIB,
        smem_per_block_optin: 227 * KIB,
        smem_per_multiprocessor: 228 * KIB,
        regs_per_block: 64 * KIB,
        regs_per_multiprocessor: 64 * KIB,
        max_threads_per_block: 1024,
        max_threads_per_multiprocessor: 2048,
        max_blocks_per_multiprocessor: 32,
        l2_bytes: l2,
        total_mem: mem,
        clock_khz,
        mem_clock_khz,
        mem_bus_bits: bus,
        gcn_arch_name: "",
    };
    let amd = |arch, product, cc, cus, lds, mem, clock_khz, mem_clock_khz, gcn| Personality {
        arch,
        vendor: Vendor::Hip,
        product,
        cc,
        multiprocessors: cus,
        smem_per_block: lds,
        smem_per_block_optin: lds,
        smem_per_multiprocessor: lds,
        regs_per_block: 512 * KIB / 4,
        regs_per_multiprocessor: 512 * KIB / 4,
        max_threads_per_block: 1024,
        max_threads_per_multiprocessor: 2048,
        max_blocks_per_multiprocessor: 32,
        l2_bytes: 4 * MIB,
        total_mem: mem,
        clock_khz,
        mem_clock_khz,
        mem_bus_bits: 8192,
        gcn_arch_name: gcn,
    };
    vec![
        nvidia("sm_90a", "NVIDIA H200", (9, 0), 132, 50 * MIB, 141 * GB, 1_980_000, 3_201_000, 6144),
        nvidia("sm_100a", "NVIDIA B200", (10, 0), 148, 126 * MIB, 180 * GB, 1_965_000, 3_996_000, 8192),
        nvidia("sm_103a", "NVIDIA B300", (10, 3), 160, 126 * MIB, 288 * GB, 2_032_000, 3_996_000, 8192),
        amd("gfx942", "AMD Instinct MI300X", (9, 4), 304, 64 * KIB, 192 * GB, 2_100_000, 2_600_000, "gfx942:sramecc+:xnack-"),
        amd("gfx950", "AMD Instinct MI355X", (9, 5), 256, 160 * KIB, 288 * GB, 2_400_000, 4_000_000, "gfx950:sramecc+:xnack-"),
    ]
}

/// The personality named by `K3_STANDIN_ARCH` for `vendor`; unset means the vendor's first one
/// (`sm_90a`, `gfx942`). A name of the other vendor, or an unknown name, is an error message.
pub fn from_env(vendor: Vendor) -> Result<Personality, String> {
    let raw = std::env::var("K3_STANDIN_ARCH").unwrap_or_default();
    by_name(vendor, raw.trim())
}

/// See [`from_env`]; `name` empty means the vendor's default.
pub fn by_name(vendor: Vendor, name: &str) -> Result<Personality, String> {
    let all = all();
    let names: Vec<&str> = all.iter().filter(|p| p.vendor == vendor).map(|p| p.arch).collect();
    let found = if name.is_empty() { all.iter().find(|p| p.vendor == vendor) } else { all.iter().find(|p| p.arch == name) };
    match found {
        Some(p) if p.vendor == vendor => Ok(p.clone()),
        Some(p) => Err(format!(
            "K3_STANDIN_ARCH={} is a {:?} personality; this stand-in serves {vendor:?} ({})",
            p.arch,
            p.vendor,
            names.join(", ")
        )),
        None => Err(format!("K3_STANDIN_ARCH={name} is not a personality of this stand-in ({})", names.join(", "))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_per_vendor() {
        assert_eq!(by_name(Vendor::Cuda, "").unwrap().arch, "sm_90a");
        assert_eq!(by_name(Vendor::Hip, "").unwrap().arch, "gfx942");
        let b300 = by_name(Vendor::Cuda, "sm_103a").unwrap();
        assert_eq!((b300.cc, b300.smem_per_block_optin), ((10, 3), 232_448));
        assert!(by_name(Vendor::Cuda, "gfx950").unwrap_err().contains("Hip"));
        assert!(by_name(Vendor::Hip, "sm_91").unwrap_err().contains("gfx942, gfx950"));
        let mi355 = by_name(Vendor::Hip, "gfx950").unwrap();
        assert_eq!((mi355.multiprocessors, mi355.smem_per_block, mi355.warp_size()), (256, 160 * 1024, 64));
        assert!(mi355.device_name().contains("stand-in") && mi355.device_name().contains("gfx950"));
    }
}
