//! Work items (what a stream runs and a graph holds) and how they execute: a kernel launch with
//! its parameter values copied at enqueue time (as the drivers copy them), a memset, a
//! device-to-device copy, a BLAS GEMM, or a whole graph. Every pointer is checked against the
//! allocation table when the item runs, so a graph replayed after a free fails instead of
//! touching freed memory.

use crate::device::{Device, State};
use crate::error::{Error, Kind, Result};
use crate::gemm::GemmCall;
use k3_backend_simt::{ParamKind, SimtKernel};
use k3_kernels::{LaunchConfig, Runtime};
use kernel_api::Error as KError;
use std::ffi::c_void;
use std::sync::Arc;

/// One kernel launch, parameters by value.
#[derive(Clone)]
pub struct Launch {
    pub function: u64,
    pub name: Arc<str>,
    pub kernel: SimtKernel,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
    pub params: Vec<ParamKind>,
    /// Each parameter's bytes in its own 8-byte slot.
    pub values: Vec<u64>,
}

/// A unit of stream work.
#[derive(Clone)]
pub enum Node {
    Launch(Launch),
    Memset { dst: u64, value: u8, len: usize },
    Copy { dst: u64, src: u64, len: usize },
    Gemm(Box<GemmCall>),
    Graph(Arc<Vec<Node>>),
}

impl Node {
    /// Runs the item now.
    pub fn run(&self, dev: &Device, st: &mut State) -> Result<()> {
        match self {
            Node::Launch(l) => run_launch(dev, st, l),
            Node::Memset { dst, value, len } => {
                st.mem.check_range(*dst, *len, "memset destination")?;
                // SAFETY: the range lies in a live allocation (checked above).
                unsafe { std::ptr::write_bytes(*dst as *mut u8, *value, *len) };
                Ok(())
            }
            Node::Copy { dst, src, len } => {
                st.mem.check_range(*src, *len, "copy source")?;
                st.mem.check_range(*dst, *len, "copy destination")?;
                // SAFETY: both ranges lie in live allocations; `copy` allows overlap.
                unsafe { std::ptr::copy(*src as *const u8, *dst as *mut u8, *len) };
                Ok(())
            }
            Node::Gemm(g) => g.run(&st.mem),
            Node::Graph(nodes) => nodes.iter().try_for_each(|n| n.run(dev, st)),
        }
    }
}

fn run_launch(dev: &Device, st: &mut State, l: &Launch) -> Result<()> {
    // A function of a module unloaded after the capture.
    st.functions.get(l.function)?;
    for (i, (k, v)) in l.params.iter().zip(&l.values).enumerate() {
        if *k == ParamKind::Pointer {
            st.mem.check_pointer(*v, &format!("kernel `{}` parameter {i}", l.name))?;
        }
    }
    let mut values = l.values.clone();
    let params: Vec<*mut c_void> = values.iter_mut().map(|v| v as *mut u64 as *mut c_void).collect();
    let cfg = LaunchConfig::new((l.grid[0], l.grid[1], l.grid[2]), (l.block[0], l.block[1], l.block[2]), l.shared_bytes);
    // SAFETY: one value per parameter of the kernel's signature (the registry's list); every
    // pointer among them was checked against the live allocations above.
    let r = unsafe { dev.simt.launch(&l.kernel, &cfg, &params, dev.simt.default_stream()) };
    r.map_err(|e| match e {
        KError::InvalidInput { field, why } => Error::new(Kind::InvalidValue, format!("kernel `{}`: {field}: {why}", l.name)),
        other => Error::new(Kind::LaunchFailed, format!("kernel `{}` stopped: {other}", l.name)),
    })
}

impl Device {
    /// Builds a launch of function `f` from cuLaunchKernel-style arguments, checking the
    /// configuration against the kernel and the personality.
    ///
    /// # Safety
    /// `params` must hold one pointer per kernel parameter, each to a value of that parameter's
    /// type (the drivers' contract).
    pub unsafe fn make_launch(
        &self,
        f: u64,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        params: *mut *mut c_void,
    ) -> Result<Node> {
        let func = self.function(f)?;
        let p = &self.personality;
        let threads = block.iter().map(|&b| b as u64).product::<u64>();
        let name = &func.name;
        if block.contains(&0) || block[0] > 1024 || block[1] > 1024 || block[2] > 64 || threads > p.max_threads_per_block as u64 {
            return Err(Error::new(
                Kind::InvalidValue,
                format!("`{name}`: block {block:?} exceeds the device's limits (1024 x 1024 x 64, {} threads)", p.max_threads_per_block),
            ));
        }
        if grid.contains(&0) || grid[0] > i32::MAX as u32 || grid[1] > 65535 || grid[2] > 65535 {
            return Err(Error::new(Kind::InvalidValue, format!("`{name}`: grid {grid:?} exceeds the device's limits (2^31-1 x 65535 x 65535)")));
        }
        if threads > func.max_threads as u64 {
            return Err(Error::new(
                Kind::LaunchOutOfResources,
                format!(
                    "`{name}`: {threads} threads per block, but the kernel can run at most {} ({} registers per thread, {} per block)",
                    func.max_threads,
                    func.regs.map(|r| r.to_string()).unwrap_or_else(|| "unknown".into()),
                    p.regs_per_block
                ),
            ));
        }
        if shared_bytes > func.max_dynamic_smem {
            return Err(Error::new(
                Kind::InvalidValue,
                format!(
                    "`{name}`: {shared_bytes} bytes of dynamic shared memory exceed the kernel's limit of {} (raise it with the max-dynamic-shared-size attribute, up to {} per block)",
                    func.max_dynamic_smem, p.smem_per_block_optin
                ),
            ));
        }
        if func.params.is_empty() {
            return Ok(Node::Launch(Launch { function: f, name: func.name.clone(), kernel: func.kernel, grid, block, shared_bytes, params: func.params, values: Vec::new() }));
        }
        if params.is_null() {
            return Err(Error::new(Kind::InvalidValue, format!("`{name}` takes {} parameters but kernelParams is null", func.params.len())));
        }
        let mut values = Vec::with_capacity(func.params.len());
        for (i, k) in func.params.iter().enumerate() {
            // SAFETY: the caller passes one pointer per parameter.
            let src = unsafe { *params.add(i) } as *const u8;
            if src.is_null() {
                return Err(Error::new(Kind::InvalidValue, format!("`{name}`: kernelParams[{i}] is null")));
            }
            let mut slot = [0u8; 8];
            // SAFETY: the value behind kernelParams[i] has the parameter's size (at most 8).
            unsafe { std::ptr::copy_nonoverlapping(src, slot.as_mut_ptr(), k.size().min(8)) };
            values.push(u64::from_ne_bytes(slot));
        }
        Ok(Node::Launch(Launch { function: f, name: func.name.clone(), kernel: func.kernel, grid, block, shared_bytes, params: func.params, values }))
    }
}
