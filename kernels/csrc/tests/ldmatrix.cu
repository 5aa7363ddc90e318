// k3::mma::ldmatrix and the *_ldsm fragment loads (warp 32 only: ldmatrix is an NVIDIA
// instruction). One warp stages a 16 x 24 tile of 16-bit values into shared memory at a 48-byte
// pitch and writes, per lane, 32 words to out[lane * 32 ..]:
//   0-3 x4, 4-7 x4.trans, 8-9 x2, 10-11 x2.trans, 12 x1, 13 x1.trans: lane l gives the row
//       address &tile[(5 l + 3) % 16][8 ((l >> 3) & 1)] (any row order, two column bases);
//   14-17 load_a, 18-21 load_a_ldsm (A = the tile's columns 8..23 as a 16x16 matrix);
//   22-23 load_b, 24-25 load_b_ldsm (B = rows 0..15, columns 8..15 as a row-major 16x8 matrix);
//   26-27 load_b_transposed, 28-29 load_b_transposed_ldsm (B^T = rows 0..7, columns 8..23);
//   30-31 zero. Fragment slots are packed in pairs, the even slot in the low half.
// mode 1: the first ldmatrix is given row addresses 2 bytes off a 16-byte boundary (the
// emulator must trap, as the GPU faults).
#include "k3/compat.h"

#if K3_WARP_SIZE == 32
namespace {

constexpr int kRows = 16, kCols = 24;

template <int kSlots>
K3_DEVICE void put_slots(uint32_t* out, const uint16_t (&x)[kSlots]) {
  for (int i = 0; i < kSlots / 2; ++i) out[i] = x[2 * i] | (static_cast<uint32_t>(x[2 * i + 1]) << 16);
}

}  // namespace

K3_KERNEL void ldmatrix_fragments(const uint16_t* tile, uint32_t* out, int mode) {
  using namespace k3::mma;
  K3_SHARED(uint16_t, sm, [kRows][kCols]);  // 16-byte aligned on every target
  const int l = static_cast<int>(k3::lane_id());
  for (int i = l; i < kRows * kCols; i += k3::kWarpSize) sm[i / kCols][i % kCols] = tile[i];
  k3::sync_threads();

  uint32_t* o = out + l * 32;
  const uint16_t* row = &sm[(5 * l + 3) % kRows][8 * ((l >> 3) & 1)];
  if (mode == 1) row += 1;
  uint32_t r4[4], r2[2], r1[1];
  ldmatrix<4, false>(r4, row);
  for (int i = 0; i < 4; ++i) o[i] = r4[i];
  ldmatrix<4, true>(r4, row);
  for (int i = 0; i < 4; ++i) o[4 + i] = r4[i];
  ldmatrix<2, false>(r2, row);
  o[8] = r2[0];
  o[9] = r2[1];
  ldmatrix<2, true>(r2, row);
  o[10] = r2[0];
  o[11] = r2[1];
  ldmatrix<1, false>(r1, row);
  o[12] = r1[0];
  ldmatrix<1, true>(r1, row);
  o[13] = r1[0];

  typedef M16N8K16 S;
  const k3::bf16* base = reinterpret_cast<const k3::bf16*>(&sm[0][8]);
  FragA<S> a;
  load_a(a, base, kCols);
  put_slots(o + 14, a.x);
  load_a_ldsm(a, base, kCols);
  put_slots(o + 18, a.x);
  FragB<S> b;
  load_b(b, base, kCols);
  put_slots(o + 22, b.x);
  load_b_ldsm(b, base, kCols);
  put_slots(o + 24, b.x);
  load_b_transposed(b, base, kCols);
  put_slots(o + 26, b.x);
  load_b_transposed_ldsm(b, base, kCols);
  put_slots(o + 28, b.x);
  o[30] = 0;
  o[31] = 0;
}
K3_EXPORT(ldmatrix_fragments);
#endif
