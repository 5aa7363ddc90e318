// f32 operands on the bf16 matrix units as three bf16 planes, x = hi + mid + lo exactly: hi the
// top 16 bits of x, mid those of x - hi, lo the rest (each remainder is exact in f32 and has at
// most 16, then 8 significant bits). A product with a bf16 operand (bf16 weights, MXFP4 decoded
// to bf16) is then three exact bf16 products, so an f32 operand is never rounded to bf16. Used
// by the router's f32 x (moe_router.cu) and the MoE GEMMs' f32 activations (moe_gemm.cu).
#ifndef K3_OPS_MMA_F32_PLANES_CUH
#define K3_OPS_MMA_F32_PLANES_CUH

namespace f32planes {

// 4 f32 as the three planes, packed as bf16 pairs (values 0, 1 and 2, 3). An infinity stays in hi
// with mid = lo = 0; a NaN gives NaN remainders (x - hi is NaN), so a NaN whose payload the
// truncation drops (hi an infinity) still makes the products NaN, as in f32. Below f32's normal
// range lo drops the tail that bf16's subnormals cannot hold.
K3_DEVICE K3_AMD_INLINE void split3(const k3::u32x4& x, uint32_t (&hi)[2], uint32_t (&mid)[2], uint32_t (&lo)[2]) {
  float h[4], m[4], l[4];
  K3_UNROLL
  for (int i = 0; i < 4; ++i) {
    const uint32_t b = x.v[i];
    const float hf = k3::uint_as_float(b & 0xffff0000u);
    const float r = (b & 0x7fffffffu) == 0x7f800000u ? 0.0f : k3::uint_as_float(b) - hf;  // exact
    const float mf = k3::uint_as_float(k3::float_as_uint(r) & 0xffff0000u);
    h[i] = hf;
    m[i] = mf;
    l[i] = r - mf;  // exact, and at most 8 significant bits: a bf16
  }
  K3_UNROLL
  for (int p = 0; p < 2; ++p) {
    hi[p] = k3::byte_perm(k3::float_as_uint(h[2 * p]), k3::float_as_uint(h[2 * p + 1]), 0x7632);
    mid[p] = k3::byte_perm(k3::float_as_uint(m[2 * p]), k3::float_as_uint(m[2 * p + 1]), 0x7632);
    lo[p] = k3::byte_perm(k3::float_as_uint(l[2 * p]), k3::float_as_uint(l[2 * p + 1]), 0x7632);
  }
}

// The A fragments of the three planes of an f32 tile (row-major, lda floats, rows and lda 16-byte
// multiples) with its columns read through k3::mma::k_perm: one 16-byte load per slot group
// (k3::mma::a_group_slot), split in registers.
template <class S>
K3_DEVICE K3_AMD_INLINE void load_a_split3(k3::mma::FragA<S> (&f)[3], const float* a, int lda) {
  K3_UNROLL
  for (int g = 0; g < k3::mma::a_groups<S>(); ++g) {
    const k3::layout::RC rc = k3::mma::a_coord<S>(k3::mma::a_group_slot<S>(g, 0));
    uint32_t p[3][2];
    split3(k3::load_16b(a + rc.row * lda + k3::mma::k_perm<S>(rc.col)), p[0], p[1], p[2]);
    K3_UNROLL
    for (int pl = 0; pl < 3; ++pl) {
      K3_UNROLL
      for (int i = 0; i < 4; ++i) {
        f[pl].x[k3::mma::a_group_slot<S>(g, i)] = static_cast<uint16_t>((i & 1) != 0 ? p[pl][i / 2] >> 16 : p[pl][i / 2]);
      }
    }
  }
}

}  // namespace f32planes

#endif  // K3_OPS_MMA_F32_PLANES_CUH
