//! Speed-of-light model, part 2: the GPUs K3 is served on, and the time floor of a [`Cost`] on
//! each.
//!
//! Every number is a vendor peak for **dense** math (no 2:4 structured sparsity) and the
//! vendor's HBM bandwidth; where a vendor prints only sparse figures they are halved (the
//! sparse rate is exactly twice the dense one on every part here). The source of each number
//! and how dense figures were derived are in `BENCHMARKS.md` ("Hardware table") and in
//! [`Hardware::sources`].
//!
//! Floor of one op on one part: `max(bytes / HBM bandwidth, Σ_class FLOPs_class / peak_class)`.
//! Classes are summed (they share the issue slots of one SM/CU), memory and math overlap. A
//! class the part has no units for runs on the path K3 would really take there: fp4 x fp4 on a
//! part without fp4 matrix units (H200, MI300X) is counted at its fp8 rate (every E2M1 value is
//! exact in e4m3), see [`Hardware::peak`].

use crate::cost::{Cost, MathClass};
use crate::error::{Error, Result};

/// One GPU part.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hardware {
    /// `--hardware` spelling: `h200`, `b200`, `b300`, `gb300`, `mi300x`, `mi355x`.
    pub id: &'static str,
    /// Marketing name of the exact SKU the numbers belong to.
    pub name: &'static str,
    /// HBM bandwidth, bytes/s.
    pub hbm_bytes_per_s: f64,
    /// Dense matrix peaks, FLOP/s.
    pub bf16_flops: f64,
    pub fp8_flops: f64,
    /// `None`: no fp4 matrix units (the fp8 path is used).
    pub fp4_flops: Option<f64>,
    /// f32 vector (non-matrix) peak, FLOP/s (an FMA is 2).
    pub f32_vector_flops: f64,
    /// SMs (NVIDIA) or CUs (AMD).
    pub compute_units: u32,
    /// Shared memory per SM / LDS per CU, bytes.
    pub shared_per_unit_bytes: u32,
    /// L2 bytes; `None` where no public source states it.
    pub l2_bytes: Option<u64>,
    /// A last-level cache beyond L2 (AMD Infinity Cache), bytes.
    pub last_level_cache_bytes: Option<u64>,
    /// Lower-case substrings of the driver's device name that identify the part; `excludes`
    /// rules out look-alikes with other clocks (H200 NVL, GB200).
    pub name_contains: &'static str,
    pub name_excludes: &'static [&'static str],
    /// Where the numbers come from, and how dense figures were derived.
    pub sources: &'static str,
}

const KIB: u32 = 1024;
const MB: u64 = 1_000_000;
const MIB: u64 = 1 << 20;

/// The parts, in the order reports list them.
pub const HARDWARE: [Hardware; 6] = [
    Hardware {
        id: "h200",
        name: "NVIDIA H200 SXM (141 GB)",
        hbm_bytes_per_s: 4.8e12,
        bf16_flops: 989.5e12,
        fp8_flops: 1979e12,
        fp4_flops: None,
        f32_vector_flops: 67e12,
        compute_units: 132,
        shared_per_unit_bytes: 228 * KIB,
        l2_bytes: Some(50 * MB),
        last_level_cache_bytes: None,
        name_contains: "h200",
        name_excludes: &["nvl"],
        sources: "NVIDIA H200 datasheet, SXM column: BF16 1,979 and FP8 3,958 TFLOPS 'with sparsity' (halved), FP32 67 TFLOPS, 4.8 TB/s; \
                  Hopper whitepaper (GH100 in its H100 SXM5 configuration, which the H200 shares): 132 SMs, 50 MB L2; \
                  CUDA C++ Programming Guide, compute capability 9.0: 228 KB shared memory per SM. No fp4 matrix units on Hopper.",
    },
    Hardware {
        id: "b200",
        name: "NVIDIA B200 (HGX B200)",
        hbm_bytes_per_s: 7.7e12,
        bf16_flops: 2.25e15,
        fp8_flops: 4.5e15,
        fp4_flops: Some(9e15),
        f32_vector_flops: 75e12,
        compute_units: 148,
        shared_per_unit_bytes: 228 * KIB,
        l2_bytes: Some(126 * MIB + MIB / 2),
        last_level_cache_bytes: None,
        name_contains: "b200",
        name_excludes: &["gb200"],
        sources: "NVIDIA HGX B200 datasheet (8 GPUs: FP4 144 PF, FP8 72 PF, BF16 36 PF 'with sparsity', FP32 600 TF), divided by 8 and halved; \
                  bandwidth 7.7 TB/s = NVIDIA's per-GPU figure (a device query gives a 7680-bit bus at 3996 MHz = 7.67 TB/s, pytorch/ao #4002; \
                  the HGX page's 64 TB/s per 8 GPUs is an 'up to' 8 TB/s); 148 SMs and 126.5 MB L2 from the same device query; \
                  Blackwell tuning guide: 228 KB shared memory per SM.",
    },
    Hardware {
        id: "b300",
        name: "NVIDIA B300 (HGX B300, Blackwell Ultra)",
        hbm_bytes_per_s: 7.7e12,
        bf16_flops: 2.25e15,
        fp8_flops: 4.5e15,
        fp4_flops: Some(14e15),
        f32_vector_flops: 75e12,
        compute_units: 148,
        shared_per_unit_bytes: 228 * KIB,
        l2_bytes: None,
        last_level_cache_bytes: None,
        name_contains: "b300",
        name_excludes: &["gb300"],
        sources: "NVIDIA Blackwell Ultra per-GPU table for B300: BF16 2.25, FP8 4.5, FP4 14 PF dense, FP32 75 TF, 7.7 TB/s \
                  (the HGX B300 page's 105 PF dense FP4 per 8 GPUs gives 13.1 PF; 'up to 8 TB/s'); \
                  148 SMs as enabled on HGX B300 parts (NCU on B300, CEverTrying/FlashKDA-on-SM100 roofline analysis; the full die has 160); \
                  CUDA C++ Programming Guide, compute capability 10.3: 228 KB shared memory per SM; L2 size not published.",
    },
    Hardware {
        id: "gb300",
        name: "NVIDIA GB300 (Grace Blackwell Ultra, NVL72)",
        hbm_bytes_per_s: 8.0e12,
        bf16_flops: 2.5e15,
        fp8_flops: 5.0e15,
        fp4_flops: Some(15e15),
        f32_vector_flops: 80e12,
        compute_units: 152,
        shared_per_unit_bytes: 228 * KIB,
        l2_bytes: None,
        last_level_cache_bytes: None,
        name_contains: "gb300",
        name_excludes: &[],
        sources: "NVIDIA GB300 NVL72 datasheet divided by 72 GPUs: 1.08 EF dense FP4 (15 PF), 360 PF dense FP8 (5 PF), 180 PF dense BF16 (2.5 PF), \
                  576 TB/s HBM (8 TB/s); FP32 80 TF from NVIDIA's per-GPU Blackwell Ultra table; \
                  152 SMs as reported on GB300 (flashinfer PR #4571); 228 KB shared memory per SM (CC 10.3); L2 size not published.",
    },
    Hardware {
        id: "mi300x",
        name: "AMD Instinct MI300X",
        hbm_bytes_per_s: 5.3e12,
        bf16_flops: 1307.4e12,
        fp8_flops: 2614.9e12,
        fp4_flops: None,
        f32_vector_flops: 163.4e12,
        compute_units: 304,
        shared_per_unit_bytes: 64 * KIB,
        l2_bytes: Some(32 * MIB),
        last_level_cache_bytes: Some(256 * MIB),
        name_contains: "mi300x",
        name_excludes: &[],
        sources: "AMD Instinct MI300X datasheet: dense peaks printed as such (BF16 1307.4, FP8 2614.9 TFLOPS; the sparse ones are twice these), \
                  FP32 vector 163.4 TFLOPS, 5.3 TB/s; ROCm 'GPU hardware specifications' table: 304 CUs, 64 KiB LDS per CU, \
                  L2 4 MiB per XCD (32 MiB), 256 MiB Infinity Cache. CDNA3 has no fp4/fp6 matrix instructions: MXFP4 weights are \
                  dequantised to bf16 (W4A16) or fp8 (A8W4) there.",
    },
    Hardware {
        id: "mi355x",
        name: "AMD Instinct MI355X",
        hbm_bytes_per_s: 8.0e12,
        bf16_flops: 2516.6e12,
        fp8_flops: 5033.2e12,
        fp4_flops: Some(10066.4e12),
        f32_vector_flops: 157.3e12,
        compute_units: 256,
        shared_per_unit_bytes: 160 * KIB,
        l2_bytes: Some(32 * MIB),
        last_level_cache_bytes: Some(256 * MIB),
        name_contains: "mi355x",
        name_excludes: &[],
        sources: "AMD Instinct MI355X datasheet: dense BF16 2516.6, FP8 5033.2, MXFP4/MXFP6 10066.4 TFLOPS (sparse figures are twice these), \
                  FP32 vector 157.3 TFLOPS, 8 TB/s; ROCm 'GPU hardware specifications' table: 256 CUs, 160 KiB LDS per CU, \
                  L2 4 MiB per XCD (32 MiB), 256 MiB Infinity Cache.",
    },
];

/// The part with `--hardware` spelling `id` (case-insensitive); the error names `field`.
pub fn by_id(id: &str, field: &str) -> Result<&'static Hardware> {
    HARDWARE.iter().find(|h| h.id.eq_ignore_ascii_case(id.trim())).ok_or_else(|| {
        Error::invalid(field, format!("unknown hardware `{id}` (known: {})", HARDWARE.map(|h| h.id).join(", ")))
    })
}

/// The part a driver's device name (`NVIDIA H200`, `AMD Instinct MI300X`) denotes, if any. An
/// emulated device (the driver stand-ins name the part they impersonate) denotes none: a floor
/// next to an emulator's timing would read as a GPU figure.
pub fn match_device_name(name: &str) -> Option<&'static Hardware> {
    let n = name.to_ascii_lowercase();
    if n.contains("emulat") || n.contains("stand-in") {
        return None;
    }
    HARDWARE.iter().find(|h| n.contains(h.name_contains) && !h.name_excludes.iter().any(|x| n.contains(x)))
}

/// Which limit sets a floor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    Memory,
    Compute,
}

impl Bound {
    pub const fn name(self) -> &'static str {
        match self {
            Bound::Memory => "memory",
            Bound::Compute => "compute",
        }
    }
}

/// The time floor of a cost on one part.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Floor {
    /// bytes / HBM bandwidth.
    pub memory_s: f64,
    /// Σ over classes of FLOPs / the class's peak.
    pub compute_s: f64,
}

impl Floor {
    pub fn seconds(&self) -> f64 {
        self.memory_s.max(self.compute_s)
    }
    pub fn bound(&self) -> Bound {
        if self.compute_s > self.memory_s {
            Bound::Compute
        } else {
            Bound::Memory
        }
    }
}

impl Hardware {
    /// The peak FLOP/s `class` runs at here and the class whose units provide it: fp4 falls back
    /// to the fp8 units on parts without fp4 matrix units.
    pub fn peak(&self, class: MathClass) -> (MathClass, f64) {
        match class {
            MathClass::Bf16Matrix => (class, self.bf16_flops),
            MathClass::Fp8Matrix => (class, self.fp8_flops),
            MathClass::Fp4Matrix => match self.fp4_flops {
                Some(p) => (class, p),
                None => (MathClass::Fp8Matrix, self.fp8_flops),
            },
            MathClass::Vector => (class, self.f32_vector_flops),
        }
    }

    /// The floor of `cost` on this part.
    pub fn floor(&self, cost: &Cost) -> Floor {
        let compute_s = MathClass::ALL.iter().map(|&c| cost.flops(c) as f64 / self.peak(c).1).sum();
        Floor { memory_s: cost.bytes as f64 / self.hbm_bytes_per_s, compute_s }
    }

    /// Dense bf16 FLOPs per byte of HBM traffic at which an op turns compute-bound.
    pub fn bf16_balance(&self) -> f64 {
        self.bf16_flops / self.hbm_bytes_per_s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::CostBuilder;

    #[test]
    fn device_names_match_one_part_and_look_alikes_none() {
        let id = |n: &str| match_device_name(n).map(|h| h.id);
        assert_eq!(id("NVIDIA H200"), Some("h200"));
        assert_eq!(id("NVIDIA H200 NVL"), None, "lower clocks: not the SXM numbers");
        assert_eq!(id("NVIDIA B200"), Some("b200"));
        assert_eq!(id("NVIDIA GB200"), None);
        assert_eq!(id("NVIDIA B300 SXM6 AC"), Some("b300"));
        assert_eq!(id("NVIDIA GB300"), Some("gb300"));
        assert_eq!(id("AMD Instinct MI300X"), Some("mi300x"));
        assert_eq!(id("AMD Instinct MI355X"), Some("mi355x"));
        assert_eq!(id("simt32 emulator"), None);
        assert_eq!(id("k3 stand-in (emulated NVIDIA H200, sm_90a)"), None);
        assert_eq!(by_id("B300", "--hardware").unwrap().id, "b300");
        assert_eq!(by_id("a100", "--hardware").unwrap_err().field(), Some("--hardware"));
    }

    #[test]
    fn table_is_dense_and_consistent() {
        for h in &HARDWARE {
            assert!(h.fp8_flops > h.bf16_flops && h.bf16_flops > h.f32_vector_flops, "{}", h.id);
            if let Some(f4) = h.fp4_flops {
                assert!(f4 > h.fp8_flops, "{}", h.id);
            }
            assert!(h.hbm_bytes_per_s > 1e12 && h.compute_units > 100, "{}", h.id);
            assert_eq!(by_id(h.id, "x").unwrap().id, h.id);
        }
    }

    #[test]
    fn floor_takes_the_larger_limit_and_fp4_falls_back_to_fp8_without_fp4_units() {
        let h200 = by_id("h200", "x").unwrap();
        let mem = CostBuilder::new("t").bytes(&[4_800_000_000]).build().unwrap();
        let f = h200.floor(&mem);
        assert!((f.seconds() - 1e-3).abs() < 1e-12 && f.bound() == Bound::Memory);
        let fp4 = CostBuilder::new("t").flops(MathClass::Fp4Matrix, &[1_979_000_000_000]).build().unwrap();
        let f = h200.floor(&fp4);
        assert!((f.seconds() - 1e-3).abs() < 1e-9 && f.bound() == Bound::Compute, "fp8 rate on H200: {f:?}");
        assert_eq!(h200.peak(MathClass::Fp4Matrix).0, MathClass::Fp8Matrix);
        let mi355 = by_id("mi355x", "x").unwrap();
        assert_eq!(mi355.peak(MathClass::Fp4Matrix), (MathClass::Fp4Matrix, 10066.4e12));
        // Classes add up.
        let mixed = CostBuilder::new("t").flops(MathClass::Bf16Matrix, &[989_500_000_000]).flops(MathClass::Vector, &[67_000_000_000]).build().unwrap();
        assert!((h200.floor(&mixed).compute_s - 2e-3).abs() < 1e-9);
    }
}
