//! Thin helpers that plan and run one op on the model's backend, allocating its output. Every
//! call goes through the `kernel-api` traits, so the runner works unchanged on any backend that
//! implements them.

use kernel_api::ops::attn_res::{AttnResMix, AttnResMixArgs, AttnResMixParams};
use kernel_api::ops::elementwise::{
    EmbeddingGather, EmbeddingGatherArgs, EmbeddingGatherParams, SigmoidGate, SigmoidGateArgs, SigmoidGateParams, SituGlu,
};
use kernel_api::ops::gemm::{Gemm, GemmArgs, GemmParams};
use kernel_api::ops::norm::{GatedRmsNorm, GatedRmsNormArgs, GatedRmsNormParams, RmsNorm, RmsNormArgs, RmsNormParams, RmsWeightOrder};
use kernel_api::ops::{
    AddAssign, AddAssignArgs, CausalConv1d, CopyCast, CopyCastArgs, ElementwiseParams, KdaDecode, KdaPrefill, MlaCacheWrite,
    MlaDecode, MlaPrefillAbsorbed, MoeAlign, MoeCombine, MoeGroupedGemm, MoeRouter,
};
use kernel_api::{Backend, BackendExt, DType, DeviceTensor, Layout, Result, TensorMut, TensorRef};

/// Declares a trait alias for a list of op traits: the trait and its blanket impl.
macro_rules! op_set {
    ($(#[$doc:meta])* $name:ident: $($t:path),+ $(,)?) => {
        $(#[$doc])*
        pub trait $name: Backend $(+ $t)+ {}
        impl<T: Backend $(+ $t)+> $name for T {}
    };
}

op_set!(
    /// Every op the model runner uses.
    ModelBackend: Gemm, RmsNorm, GatedRmsNorm, AttnResMix, SituGlu, SigmoidGate, EmbeddingGather, CopyCast, AddAssign,
    CausalConv1d, KdaPrefill, KdaDecode, MlaCacheWrite, MlaPrefillAbsorbed, MlaDecode, MoeRouter, MoeAlign,
    MoeGroupedGemm, MoeCombine,
);

/// A view into a device tensor's buffer with another layout (offset/strides in elements).
pub fn view<'a, B: Backend>(t: &'a DeviceTensor<B>, shape: &[usize], strides: &[usize], offset: usize) -> TensorRef<'a, B> {
    TensorRef::new(&t.buf, Layout { dtype: t.layout.dtype, shape: shape.to_vec(), strides: strides.to_vec(), offset })
}

pub fn view_mut<'a, B: Backend>(t: &'a mut DeviceTensor<B>, shape: &[usize], strides: &[usize], offset: usize) -> TensorMut<'a, B> {
    let dtype = t.layout.dtype;
    TensorMut::new(&mut t.buf, Layout { dtype, shape: shape.to_vec(), strides: strides.to_vec(), offset })
}

/// Row-major strides of a shape.
pub fn strides_of(shape: &[usize]) -> Vec<usize> {
    Layout::contiguous(DType::F32, shape).strides
}

/// A contiguous reshape of a whole tensor.
pub fn reshaped<'a, B: Backend>(t: &'a DeviceTensor<B>, shape: &[usize]) -> TensorRef<'a, B> {
    view(t, shape, &strides_of(shape), t.layout.offset)
}

/// Op runner bound to one backend and the activation dtype.
pub struct Exec<'a, B: ModelBackend> {
    pub b: &'a B,
    pub act: DType,
    /// GEMM workspace (cuBLASLt's 32 MiB on CUDA, none elsewhere), allocated on first need and
    /// reused by every GEMM of this runner.
    gemm_ws: std::cell::RefCell<Option<B::Buffer>>,
}

impl<'a, B: ModelBackend> Exec<'a, B> {
    pub fn new(b: &'a B, act: DType) -> Self {
        Exec { b, act, gemm_ws: std::cell::RefCell::new(None) }
    }
}

impl<B: ModelBackend> Exec<'_, B> {
    fn stream(&self) -> &B::Stream {
        self.b.default_stream()
    }

    pub fn zeros(&self, dtype: DType, shape: &[usize]) -> Result<DeviceTensor<B>> {
        self.b.zeros(dtype, shape)
    }

    /// y = x W^T for x `[m, k]` (any row stride) and W `[n, k]`.
    pub fn gemm(&self, x: TensorRef<'_, B>, w: &DeviceTensor<B>) -> Result<DeviceTensor<B>> {
        let (m, k) = (x.layout.shape[0], x.layout.shape[1]);
        let n = w.layout.shape[0];
        let p = GemmParams { m, n, k, x_dtype: x.layout.dtype, w_dtype: w.dtype(), out_dtype: self.act, bias_dtype: None };
        let plan = Gemm::plan(self.b, &p)?;
        let mut out = self.zeros(self.act, &[m, n])?;
        let need = Gemm::workspace_size(self.b, &plan);
        let mut ws = self.gemm_ws.borrow_mut();
        if ws.as_ref().map_or(0, |w| self.b.buffer_len(w)) < need {
            *ws = self.b.workspace(need)?;
        }
        Gemm::run(self.b, &plan, GemmArgs { x, w: w.as_ref(), bias: None, out: out.as_mut() }, ws.as_mut(), self.stream())?;
        Ok(out)
    }

    /// Weighted RMSNorm over the last dim of `x` `[m, d]` (fp32 statistics).
    pub fn rms_norm(&self, x: TensorRef<'_, B>, w: &DeviceTensor<B>, eps: f32) -> Result<DeviceTensor<B>> {
        let (m, d) = (x.layout.shape[0], x.layout.shape[1]);
        let p = RmsNormParams { m, d, eps, weight_order: RmsWeightOrder::F32 };
        let plan = RmsNorm::plan(self.b, &p)?;
        let mut out = self.zeros(self.act, &[m, d])?;
        RmsNorm::run(self.b, &plan, RmsNormArgs { x, w: w.as_ref(), out: out.as_mut() }, None, self.stream())?;
        Ok(out)
    }

    /// Gated per-head RMSNorm of `o` `[m, h, dh]` with `gate` of the same shape.
    pub fn gated_rms_norm(&self, o: TensorRef<'_, B>, gate: TensorRef<'_, B>, w: &DeviceTensor<B>, eps: f32) -> Result<DeviceTensor<B>> {
        let (m, h, dh) = (o.layout.shape[0], o.layout.shape[1], o.layout.shape[2]);
        let plan = GatedRmsNorm::plan(self.b, &GatedRmsNormParams { m, heads: h, head_dim: dh, eps })?;
        let mut out = self.zeros(self.act, &[m, h, dh])?;
        GatedRmsNorm::run(self.b, &plan, GatedRmsNormArgs { o, gate, w: w.as_ref(), out: out.as_mut() }, None, self.stream())?;
        Ok(out)
    }

    /// AttnRes mix of `sources` `[s, m, d]` with score vector `w` `[d]`.
    pub fn attn_res_mix(&self, sources: TensorRef<'_, B>, w: &DeviceTensor<B>, eps: f32) -> Result<DeviceTensor<B>> {
        let (s, m, d) = (sources.layout.shape[0], sources.layout.shape[1], sources.layout.shape[2]);
        let plan = AttnResMix::plan(self.b, &AttnResMixParams { sources: s, m, d, eps })?;
        let mut out = self.zeros(self.act, &[m, d])?;
        AttnResMix::run(self.b, &plan, AttnResMixArgs { sources, score_vector: w.as_ref(), out: out.as_mut() }, None, self.stream())?;
        Ok(out)
    }

    /// x * sigmoid(g), both `[m, n]`.
    pub fn sigmoid_gate(&self, x: TensorRef<'_, B>, g: TensorRef<'_, B>) -> Result<DeviceTensor<B>> {
        let (m, n) = (x.layout.shape[0], x.layout.shape[1]);
        let plan = SigmoidGate::plan(self.b, &SigmoidGateParams { m, n })?;
        let mut out = self.zeros(self.act, &[m, n])?;
        SigmoidGate::run(self.b, &plan, SigmoidGateArgs { x, g, out: out.as_mut() }, None, self.stream())?;
        Ok(out)
    }

    pub fn embed(&self, table: &DeviceTensor<B>, ids: &DeviceTensor<B>, host_ids: &[i64]) -> Result<DeviceTensor<B>> {
        let (vocab, d) = (table.layout.shape[0], table.layout.shape[1]);
        let p = EmbeddingGatherParams { vocab, d, m: host_ids.len() };
        let plan = EmbeddingGather::plan(self.b, &p, host_ids)?;
        let mut out = self.zeros(self.act, &[host_ids.len(), d])?;
        EmbeddingGather::run(self.b, &plan, EmbeddingGatherArgs { table: table.as_ref(), ids: ids.as_ref(), out: out.as_mut() }, None, self.stream())?;
        Ok(out)
    }

    /// out = x (shape of `out`), converting dtype.
    pub fn copy(&self, x: TensorRef<'_, B>, out: TensorMut<'_, B>) -> Result<()> {
        let plan = CopyCast::plan(self.b, &ElementwiseParams { shape: out.layout.shape.clone() })?;
        CopyCast::run(self.b, &plan, CopyCastArgs { x, out }, self.stream())
    }

    /// acc += x.
    pub fn add_assign(&self, acc: TensorMut<'_, B>, x: TensorRef<'_, B>) -> Result<()> {
        let plan = AddAssign::plan(self.b, &ElementwiseParams { shape: acc.layout.shape.clone() })?;
        AddAssign::run(self.b, &plan, AddAssignArgs { acc, x }, self.stream())
    }
}
