//! Resident blocks per SM (NVIDIA) or CU (AMD) for a kernel's resources and a launch's block
//! size and dynamic shared memory, and which resource stops the next block. Per-target limits
//! and their sources are listed in `build-support/README.md` ("Kernel resource report").
//!
//! NVIDIA follows `cuda_occupancy.h` of the CUDA toolkit: registers are allocated per warp in
//! units of 256 and per SM sub-partition (4 per SM), shared memory in units of 128 bytes plus
//! the driver's 1 KiB per block, with the SM's carveout at its maximum (228 KiB). AMD follows
//! LLVM's AMDGPU occupancy rules (`GCNSubtarget`, `llvm-calc-occupancy`): waves per SIMD from the
//! unified VGPR file (512 per lane, granule 8) and from SGPRs, at most 8; a workgroup's waves
//! spread over the CU's 4 SIMDs; LDS in blocks of 512 bytes (gfx942) or 1280 bytes (gfx950); at
//! most 16 multi-wave workgroups per CU (barrier resources).

use super::{KernelResources, Vendor};
use std::fmt;

/// An NVIDIA SM's resources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sm {
    pub regs: u32,
    pub regs_per_block: u32,
    pub reg_granule: u32,
    pub sub_partitions: u32,
    pub max_regs_per_thread: u32,
    pub max_warps: u32,
    pub max_blocks: u32,
    pub shared: u64,
    pub shared_per_block: u64,
    pub shared_granule: u64,
    pub reserved_shared_per_block: u64,
}

/// An AMD CU's resources (wave64).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cu {
    pub simds: u32,
    pub waves_per_simd: u32,
    pub vgprs_per_lane: u32,
    pub vgpr_granule: u32,
    pub lds: u64,
    pub lds_per_block: u64,
    pub lds_granule: u64,
    /// Workgroups of more than one wave per CU.
    pub max_blocks: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Sm(Sm),
    Cu(Cu),
}

/// One compile target with the product the report models it as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetLimits {
    pub target: &'static str,
    pub vendor: Vendor,
    /// The GPU whose SM / CU count the report uses (plans size grids by it).
    pub product: &'static str,
    /// SMs or CUs of that product.
    pub units: u32,
    pub warp_size: u32,
    pub max_block_threads: u32,
    pub unit: Unit,
}

const HOPPER_BLACKWELL_SM: Sm = Sm {
    regs: 65_536,
    regs_per_block: 65_536,
    reg_granule: 256,
    sub_partitions: 4,
    max_regs_per_thread: 255,
    max_warps: 64,
    max_blocks: 32,
    shared: 228 * 1024,
    shared_per_block: 227 * 1024,
    shared_granule: 128,
    reserved_shared_per_block: 1024,
};

const fn cdna_cu(lds: u64, lds_granule: u64) -> Cu {
    Cu {
        simds: 4,
        waves_per_simd: 8,
        vgprs_per_lane: 512,
        vgpr_granule: 8,
        lds,
        lds_per_block: lds,
        lds_granule,
        max_blocks: 16,
    }
}

const fn nvidia(target: &'static str, product: &'static str, units: u32) -> TargetLimits {
    TargetLimits {
        target,
        vendor: Vendor::Nvidia,
        product,
        units,
        warp_size: 32,
        max_block_threads: 1024,
        unit: Unit::Sm(HOPPER_BLACKWELL_SM),
    }
}

const fn amd(target: &'static str, product: &'static str, units: u32, lds: u64, lds_granule: u64) -> TargetLimits {
    TargetLimits {
        target,
        vendor: Vendor::Amd,
        product,
        units,
        warp_size: 64,
        max_block_threads: 1024,
        unit: Unit::Cu(cdna_cu(lds, lds_granule)),
    }
}

/// The five targets of the report, in report order.
pub const TARGETS: [TargetLimits; 5] = [
    nvidia("sm_90a", "H200", 132),
    nvidia("sm_100a", "B200", 148),
    nvidia("sm_103a", "B300", 148),
    // LDS allocation blocks: 128 dwords on GFX7+, 320 dwords on gfx950 (AMDGPUUsage, LDS_SIZE).
    amd("gfx942", "MI300X", 304, 64 * 1024, 512),
    amd("gfx950", "MI355X", 256, 160 * 1024, 1280),
];

/// The limits of a target of [`TARGETS`].
pub fn limits(target: &str) -> Option<&'static TargetLimits> {
    TARGETS.iter().find(|t| t.target == target)
}

/// What stops one more block from becoming resident.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Limiter {
    /// NVIDIA registers, AMD VGPRs (architected + AGPRs).
    Registers,
    /// AMD scalar registers.
    Sgprs,
    /// Shared memory / LDS.
    Shared,
    /// Warps per SM / waves per SIMD.
    Warps,
    /// Resident blocks per SM / workgroups per CU.
    BlockSlots,
    /// The block does not fit at all (more threads than the kernel or the device takes).
    LaunchBounds,
}

impl fmt::Display for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Limiter::Registers => "registers",
            Limiter::Sgprs => "SGPRs",
            Limiter::Shared => "shared",
            Limiter::Warps => "warps",
            Limiter::BlockSlots => "block slots",
            Limiter::LaunchBounds => "launch bounds",
        })
    }
}

/// Resident blocks per SM / CU and the resources that bind at that count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Occupancy {
    pub blocks: u32,
    /// Every resource whose own limit equals `blocks` (sorted).
    pub limiters: Vec<Limiter>,
    /// Warps (NVIDIA) or waves (AMD) of one block.
    pub warps_per_block: u32,
    /// Warps / waves the SM or CU holds at most.
    pub max_warps: u32,
}

impl Occupancy {
    /// Resident warps over the most the SM / CU holds.
    pub fn fraction(&self) -> f64 {
        if self.max_warps == 0 {
            return 0.0;
        }
        f64::from(self.blocks * self.warps_per_block) / f64::from(self.max_warps)
    }

    /// `registers+shared`.
    pub fn limiter_names(&self) -> String {
        self.limiters.iter().map(ToString::to_string).collect::<Vec<_>>().join("+")
    }
}

fn round_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to.max(1)) * to.max(1)
}

fn pick(warps_per_block: u32, max_warps: u32, by: &[(Limiter, u32)]) -> Occupancy {
    let blocks = by.iter().map(|(_, n)| *n).min().unwrap_or(0);
    let mut limiters: Vec<Limiter> = by.iter().filter(|(_, n)| *n == blocks).map(|(l, _)| *l).collect();
    limiters.sort();
    limiters.dedup();
    Occupancy { blocks, limiters, warps_per_block, max_warps }
}

/// LLVM's waves per SIMD for a gfx9 kernel's SGPR count (VCC and the other reserved registers
/// included): `GCNSubtarget::getOccupancyWithNumSGPRs` (800 SGPRs per SIMD).
fn waves_by_sgprs(sgprs: u32) -> u32 {
    match sgprs {
        0..=80 => 10,
        81..=88 => 9,
        89..=100 => 8,
        _ => 7,
    }
}

/// Resident blocks of `r` launched with `block_threads` threads and `dynamic_shared` bytes of
/// dynamic shared memory / LDS on one SM or CU of `l`.
pub fn occupancy(l: &TargetLimits, r: &KernelResources, block_threads: u32, dynamic_shared: u64) -> Occupancy {
    let warps = block_threads.div_ceil(l.warp_size).max(1);
    let too_big = block_threads == 0
        || block_threads > l.max_block_threads
        || r.max_block_threads.is_some_and(|m| block_threads > m);
    let shared = r.static_shared_bytes + dynamic_shared;
    match l.unit {
        Unit::Sm(sm) => {
            if too_big {
                return pick(warps, sm.max_warps, &[(Limiter::LaunchBounds, 0)]);
            }
            let by_regs = {
                let per_warp = round_up(u64::from(r.regs) * u64::from(l.warp_size), u64::from(sm.reg_granule));
                let checked = per_warp * round_up(u64::from(warps), u64::from(sm.sub_partitions));
                if r.regs > sm.max_regs_per_thread || checked > u64::from(sm.regs_per_block) {
                    0
                } else {
                    match u64::from(sm.regs / sm.sub_partitions).checked_div(per_warp) {
                        Some(per_partition) => (per_partition * u64::from(sm.sub_partitions) / u64::from(warps)) as u32,
                        None => u32::MAX, // no registers at all
                    }
                }
            };
            let by_shared = if shared > sm.shared_per_block {
                0
            } else {
                (sm.shared / round_up(shared + sm.reserved_shared_per_block, sm.shared_granule)) as u32
            };
            pick(
                warps,
                sm.max_warps,
                &[
                    (Limiter::Registers, by_regs),
                    (Limiter::Shared, by_shared),
                    (Limiter::Warps, sm.max_warps / warps),
                    (Limiter::BlockSlots, sm.max_blocks),
                ],
            )
        }
        Unit::Cu(cu) => {
            let max_waves = cu.simds * cu.waves_per_simd;
            if too_big {
                return pick(warps, max_waves, &[(Limiter::LaunchBounds, 0)]);
            }
            let vgprs = r.regs + r.agprs.unwrap_or(0);
            let by_vgpr_waves = if vgprs == 0 {
                cu.waves_per_simd
            } else {
                cu.vgprs_per_lane / round_up(u64::from(vgprs), u64::from(cu.vgpr_granule)) as u32
            };
            // Uncapped here: the wave slots (`Warps`) are their own limit.
            let per_cu = |waves_per_simd: u32| waves_per_simd * cu.simds / warps;
            let by_lds = if shared > cu.lds_per_block {
                0
            } else if shared == 0 {
                u32::MAX
            } else {
                (cu.lds / round_up(shared, cu.lds_granule)) as u32
            };
            let slots = if warps == 1 { max_waves } else { cu.max_blocks };
            pick(
                warps,
                max_waves,
                &[
                    (Limiter::Registers, per_cu(by_vgpr_waves)),
                    (Limiter::Sgprs, per_cu(waves_by_sgprs(r.sgprs.unwrap_or(0)))),
                    (Limiter::Shared, by_lds),
                    (Limiter::Warps, max_waves / warps),
                    (Limiter::BlockSlots, slots),
                ],
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::CodeStats;

    fn kernel(target: &str, regs: u32, agprs: Option<u32>, sgprs: Option<u32>, shared: u64) -> KernelResources {
        KernelResources {
            kernel: "k".into(),
            source: "k.cu".into(),
            target: target.into(),
            vendor: limits(target).expect("known").vendor,
            regs,
            agprs,
            sgprs,
            vgpr_spills: agprs.map(|_| 0),
            sgpr_spills: agprs.map(|_| 0),
            max_block_threads: agprs.map(|_| 1024),
            static_shared_bytes: shared,
            scratch_bytes: 0,
            code: CodeStats::default(),
            callee_scratch_ops: 0,
            callees: Vec::new(),
        }
    }

    fn occ(target: &str, r: &KernelResources, threads: u32, dynamic: u64) -> (u32, String) {
        let o = occupancy(limits(target).expect("known"), r, threads, dynamic);
        (o.blocks, o.limiter_names())
    }

    #[test]
    fn nvidia_registers_follow_cuda_occupancy_h() {
        // 94 registers (kda_decode_fused_step): 3008 per warp -> 3072; 16384 / 3072 = 5 warps per
        // sub-partition, 20 per SM, 5 blocks of 4 warps.
        let r = kernel("sm_90a", 94, None, None, 48);
        assert_eq!(occ("sm_90a", &r, 128, 17_408), (5, "registers".into()));
        // 255 registers, 256 threads: 8192 per warp, 2 per sub-partition, 8 per SM: 1 block.
        let fat = kernel("sm_100a", 255, None, None, 0);
        assert_eq!(occ("sm_100a", &fat, 256, 0), (1, "registers".into()));
        // 1024 threads at 80 registers: 80 x 32 x 32 warps = 81920 > 65536 per block: no launch.
        let r80 = kernel("sm_103a", 80, None, None, 0);
        assert_eq!(occ("sm_103a", &r80, 1024, 0).0, 0);
        assert_eq!(occ("sm_103a", &r80, 2048, 0), (0, "launch bounds".into()));
    }

    #[test]
    fn nvidia_shared_memory_and_slots() {
        let r = kernel("sm_90a", 16, None, None, 0);
        // 100 KiB dynamic + 1 KiB reserved: 2 blocks in 228 KiB.
        assert_eq!(occ("sm_90a", &r, 128, 100 * 1024), (2, "shared".into()));
        // 227 KiB is the most a block may have; one byte more does not launch.
        assert_eq!(occ("sm_90a", &r, 128, 227 * 1024).0, 1);
        assert_eq!(occ("sm_90a", &r, 128, 227 * 1024 + 1), (0, "shared".into()));
        // Tiny blocks: 32 resident blocks of one warp.
        assert_eq!(occ("sm_90a", &r, 32, 0), (32, "block slots".into()));
        // 64 warps of 32 threads x 2 warps per block = 32 blocks: both bind.
        assert_eq!(occ("sm_90a", &r, 64, 0), (32, "warps+block slots".into()));
    }

    #[test]
    fn amd_waves_match_the_compiler_occupancy() {
        // kda_decode_fused_step on gfx942: 44 VGPRs, 106 SGPRs; LLVM printed `Occupancy: 7`
        // (waves per SIMD), so a 128-thread (2-wave) block: 7 x 4 / 2 = 14 per CU.
        let k = kernel("gfx942", 44, Some(0), Some(106), 32);
        assert_eq!(occ("gfx942", &k, 128, 0), (14, "SGPRs".into()));
        // mla_decode_gluon on gfx942: 256 VGPRs + 171 AGPRs = 427 -> 432: 1 wave per SIMD
        // (LLVM: `Occupancy: 1`); 256 threads = 4 waves: one block per CU.
        let m = kernel("gfx942", 256, Some(171), Some(106), 0);
        assert_eq!(occ("gfx942", &m, 256, 28_096), (1, "registers".into()));
        // The same block with 1024 threads needs 4 waves per SIMD: it cannot launch, and the
        // code object says so too when its max_flat_workgroup_size is 256.
        assert_eq!(occ("gfx942", &m, 1024, 0).0, 0);
        let mut bounded = m.clone();
        bounded.max_block_threads = Some(256);
        assert_eq!(occ("gfx942", &bounded, 512, 0), (0, "launch bounds".into()));
    }

    #[test]
    fn amd_lds_per_cu_differs_between_gfx942_and_gfx950() {
        let k = kernel("gfx942", 32, Some(0), Some(32), 0);
        // 40 KiB of LDS: one per CU on gfx942 (64 KiB), four on gfx950 (160 KiB).
        assert_eq!(occ("gfx942", &k, 256, 40 * 1024), (1, "shared".into()));
        assert_eq!(occ("gfx950", &k, 256, 40 * 1024), (4, "shared".into()));
        // 96 KiB exceeds gfx942's LDS but fits gfx950's (77 blocks of 1280 bytes).
        assert_eq!(occ("gfx942", &k, 256, 96 * 1024).0, 0);
        assert_eq!(occ("gfx950", &k, 256, 96 * 1024).0, 1);
        // No LDS, one-wave blocks: 32 wave slots per CU (4 SIMDs x 8).
        assert_eq!(occ("gfx950", &k, 64, 0), (32, "warps+block slots".into()));
        // Multi-wave blocks: at most 16 workgroups per CU.
        assert_eq!(occ("gfx950", &k, 128, 0), (16, "warps+block slots".into()));
    }

    #[test]
    fn fraction_of_the_unit() {
        let r = kernel("sm_90a", 94, None, None, 48);
        let o = occupancy(limits("sm_90a").expect("known"), &r, 128, 17_408);
        assert_eq!((o.warps_per_block, o.max_warps), (4, 64));
        assert!((o.fraction() - 20.0 / 64.0).abs() < 1e-12);
        assert_eq!(TARGETS.iter().map(|t| t.target).collect::<Vec<_>>(), ["sm_90a", "sm_100a", "sm_103a", "gfx942", "gfx950"]);
    }
}
