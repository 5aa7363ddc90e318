//! One op invocation: its input tensors, its params and the bookkeeping that turns every
//! missing, unknown or ill-typed name into an error naming it.

use super::json::{IntArray, Params};
use super::tensors::{parse_dtype, reinterpret};
use super::OpError;
use kernel_api::conformance::AllOps;
use kernel_api::{BackendExt, DType, DeviceTensor, HostTensor};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

/// What an op returns: its output tensors by name, in a fixed order.
pub type Outputs = Vec<(String, HostTensor)>;

/// Allocations (pure outputs, workspaces) above both this and [`INPUT_FACTOR`] x the input bytes
/// are refused: a mistyped dimension in the params must be an error, not an out-of-memory abort.
pub const MIN_ALLOC_LIMIT: usize = 1 << 30;
pub const INPUT_FACTOR: usize = 16;

pub(crate) struct Call<'a, B: AllOps> {
    pub op: &'static str,
    pub b: &'a B,
    pub p: Params<'a>,
    /// Inputs after the `dtypes` overrides.
    inputs: BTreeMap<String, HostTensor>,
    /// Tensor names the op asked for (present or not).
    queried: RefCell<BTreeSet<String>>,
    /// `out_dtypes` entries, and which of them the op consulted.
    out_dtypes: BTreeMap<String, DType>,
    out_queried: RefCell<BTreeSet<String>>,
    /// The largest allocation this call may make.
    alloc_limit: usize,
}

impl<'a, B: AllOps> Call<'a, B> {
    pub fn new(op: &'static str, b: &'a B, inputs: &BTreeMap<String, HostTensor>, p: Params<'a>) -> Result<Self, OpError> {
        let mut inputs = inputs.clone();
        for (name, s) in p.string_map("dtypes")? {
            let to = parse_dtype(s).ok_or_else(|| p.err(&format!("dtypes.{name}"), format!("unknown dtype \"{s}\"")))?;
            let t = inputs
                .get(&name)
                .ok_or_else(|| p.err(&format!("dtypes.{name}"), format!("names no tensor of the inputs file (`{name}`)")))?;
            let t = reinterpret(op, &name, t, to)?;
            inputs.insert(name, t);
        }
        let mut out_dtypes = BTreeMap::new();
        for (name, s) in p.string_map("out_dtypes")? {
            let d = parse_dtype(s).ok_or_else(|| p.err(&format!("out_dtypes.{name}"), format!("unknown dtype \"{s}\"")))?;
            out_dtypes.insert(name, d);
        }
        let input_bytes = inputs.values().fold(0usize, |a, t| a.saturating_add(t.bytes.len()));
        let alloc_limit = MIN_ALLOC_LIMIT.max(input_bytes.saturating_mul(INPUT_FACTOR));
        Ok(Call { op, b, p, inputs, queried: RefCell::default(), out_dtypes, out_queried: RefCell::default(), alloc_limit })
    }

    pub fn tensor_err(&self, name: &str, why: impl Into<String>) -> OpError {
        OpError::tensor(self.op, name, why)
    }

    pub fn kernel(&self) -> impl Fn(kernel_api::Error) -> OpError + '_ {
        move |source| OpError::Kernel { op: self.op.to_string(), source }
    }

    /// An optional input's host copy.
    pub fn opt_host(&self, name: &str) -> Option<&HostTensor> {
        self.queried.borrow_mut().insert(name.to_string());
        self.inputs.get(name)
    }

    /// A required input's host copy.
    pub fn host(&self, name: &str) -> Result<&HostTensor, OpError> {
        self.opt_host(name).ok_or_else(|| self.tensor_err(name, "missing from the inputs file"))
    }

    /// Uploads a required input.
    pub fn upload(&self, name: &str) -> Result<DeviceTensor<B>, OpError> {
        let t = self.host(name)?;
        self.b.upload_tensor(t).map_err(self.kernel())
    }

    /// Uploads an optional input when present.
    pub fn opt_upload(&self, name: &str) -> Result<Option<DeviceTensor<B>>, OpError> {
        match self.opt_host(name) {
            Some(t) => self.b.upload_tensor(t).map(Some).map_err(self.kernel()),
            None => Ok(None),
        }
    }

    /// Dimension `axis` of a required input.
    pub fn shape(&self, name: &str, axis: usize) -> Result<usize, OpError> {
        let t = self.host(name)?;
        t.shape.get(axis).copied().ok_or_else(|| {
            self.tensor_err(name, format!("rank {} (shape {:?}); dimension {axis} is needed", t.shape.len(), t.shape))
        })
    }

    /// The params key `key`, defaulting to dimension `axis` of tensor `name`.
    pub fn dim(&self, key: &str, name: &str, axis: usize) -> Result<usize, OpError> {
        self.p.usize_or(key, || self.shape(name, axis))
    }

    /// The dtype chosen for pure output `name` in `out_dtypes`, else `default`.
    pub fn out_dtype(&self, name: &str, default: DType) -> DType {
        self.opt_out_dtype(name).unwrap_or(default)
    }

    /// The `out_dtypes` entry of pure output `name`, if any.
    pub fn opt_out_dtype(&self, name: &str) -> Option<DType> {
        self.out_queried.borrow_mut().insert(name.to_string());
        self.out_dtypes.get(name).copied()
    }

    /// Host batch metadata `key`: the params array of that name if given, else the values of the
    /// input tensor of the same name (i32 or i64), with its shape.
    pub fn host_ints(&self, key: &str) -> Result<IntArray, OpError> {
        self.opt_host_ints(key)?
            .ok_or_else(|| self.tensor_err(key, "missing from the inputs file (and not given in the params)"))
    }

    pub fn opt_host_ints(&self, key: &str) -> Result<Option<IntArray>, OpError> {
        if let Some(v) = self.p.int_array(key)? {
            return Ok(Some(v));
        }
        match self.opt_host(key) {
            None => Ok(None),
            Some(t) if t.dtype.is_index() => Ok(Some((t.to_i64(), t.shape.clone()))),
            Some(t) => Err(self.tensor_err(key, format!("host metadata must be i32 or i64, got {}", t.dtype))),
        }
    }

    /// As [`Self::host_ints`], narrowed to i32 (an out-of-range value is an error naming it).
    pub fn host_i32(&self, key: &str) -> Result<(Vec<i32>, Vec<usize>), OpError> {
        let (v, shape) = self.host_ints(key)?;
        Ok((narrow(self, key, &v)?, shape))
    }

    pub fn opt_host_i32(&self, key: &str) -> Result<Option<Vec<i32>>, OpError> {
        match self.opt_host_ints(key)? {
            Some((v, _)) => Ok(Some(narrow(self, key, &v)?)),
            None => Ok(None),
        }
    }

    fn check_alloc(&self, what: &str, bytes: Option<usize>) -> Result<(), OpError> {
        match bytes {
            Some(n) if n <= self.alloc_limit => Ok(()),
            _ => Err(self.tensor_err(
                what,
                format!(
                    "would need {} bytes, over the limit of {} (max(1 GiB, {INPUT_FACTOR} x the input bytes)); check the dimensions in the params",
                    bytes.map_or("more than usize::MAX".to_string(), |n| n.to_string()),
                    self.alloc_limit
                ),
            )),
        }
    }

    /// A zero-filled pure output `name`.
    pub fn zeros(&self, name: &str, dtype: DType, shape: &[usize]) -> Result<DeviceTensor<B>, OpError> {
        let bytes = shape.iter().try_fold(dtype.size_bytes(), |a, &d| a.checked_mul(d));
        self.check_alloc(name, bytes)?;
        self.b.zeros(dtype, shape).map_err(self.kernel())
    }

    /// A workspace of `bytes` bytes (`None` when the plan needs none).
    pub fn workspace(&self, bytes: usize) -> Result<Option<B::Buffer>, OpError> {
        if bytes == 0 {
            return Ok(None);
        }
        self.check_alloc("workspace", Some(bytes))?;
        self.b.alloc_zeroed(bytes).map(Some).map_err(self.kernel())
    }

    /// After the op has read everything: every input tensor, params key and `out_dtypes` entry
    /// must have been used. `pure_outputs` are the op's allocated outputs.
    pub fn finish(&self, pure_outputs: &[&str]) -> Result<(), OpError> {
        let queried = self.queried.borrow();
        for name in self.inputs.keys() {
            if pure_outputs.contains(&name.as_str()) {
                return Err(self.tensor_err(
                    name,
                    "is an output of this op, not an input (remove it; choose its dtype with \"out_dtypes\")",
                ));
            }
            if !queried.contains(name) {
                let known: Vec<&str> = queried.iter().map(String::as_str).collect();
                return Err(self.tensor_err(name, format!("is not an argument of `{}` (its inputs: {})", self.op, known.join(", "))));
            }
        }
        let outs = self.out_queried.borrow();
        if let Some(name) = self.out_dtypes.keys().find(|n| !outs.contains(*n)) {
            let known: Vec<&str> = outs.iter().map(String::as_str).collect();
            return Err(self.p.err(
                &format!("out_dtypes.{name}"),
                format!("names no output whose dtype is a choice (choices: {})", if known.is_empty() { "none".into() } else { known.join(", ") }),
            ));
        }
        self.p.check_all_read()
    }

    /// Downloads the outputs after the run.
    pub fn download(&self, outs: Vec<(&str, &DeviceTensor<B>)>) -> Result<Outputs, OpError> {
        self.b.synchronize(self.b.default_stream()).map_err(self.kernel())?;
        outs.into_iter()
            .map(|(name, t)| Ok((name.to_string(), self.b.download_tensor(t).map_err(self.kernel())?)))
            .collect()
    }
}

fn narrow<B: AllOps>(c: &Call<'_, B>, key: &str, v: &[i64]) -> Result<Vec<i32>, OpError> {
    v.iter()
        .enumerate()
        .map(|(i, &x)| i32::try_from(x).map_err(|_| c.tensor_err(key, format!("entry {i} = {x} does not fit i32"))))
        .collect()
}
