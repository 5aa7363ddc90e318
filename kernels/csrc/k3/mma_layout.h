// Warp-level matrix fragment layouts: which lane and register slot holds which matrix element.
//
// One place for the formulas, used by the dialect's fragment loads/stores on every target and by
// the SIMT emulator's mma rendezvous (which gathers and scatters through exactly these maps).
// Sources and worked checks: shared/reference/matrix-fragments.md (PTX ISA fragment figures for
// mma.m16n8k16; AMD matrix instruction calculator / CK / IREE for the MFMA template).
//
// Conventions: A is MxK, B is KxN, C and D are MxN, every coordinate is {row, col} of that
// operand's own matrix (so for B, row = k and col = n). A "slot" is the position of an element
// in the lane's operand list, packed low bits first into 32-bit registers.
#ifndef K3_MMA_LAYOUT_H
#define K3_MMA_LAYOUT_H

#include "k3/detail/qualifiers.h"

namespace k3 {
namespace layout {

struct RC {
  int row;
  int col;
};

// ---- NVIDIA mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, warp 32 ----
// g = lane >> 2 (PTX groupID), t = lane & 3 (threadID_in_group).
K3_HOST_DEVICE constexpr RC m16n8k16_a(int lane, int i) {
  return RC{(lane >> 2) + 8 * ((i >> 1) & 1), 2 * (lane & 3) + (i & 1) + 8 * (i >> 2)};
}
K3_HOST_DEVICE constexpr RC m16n8k16_b(int lane, int i) {
  return RC{2 * (lane & 3) + (i & 1) + 8 * (i >> 1), lane >> 2};
}
K3_HOST_DEVICE constexpr RC m16n8k16_c(int lane, int i) {
  return RC{(lane >> 2) + 8 * (i >> 1), 2 * (lane & 3) + (i & 1)};
}

// ---- AMD MFMA, wave64, single block (cbsz = abid = blgp = 0) ----
// kpl = M*K/64 elements of A (or B) per lane, contiguous in k. D is transposed relative to A:
// the lane gives the column, each register a row, rows in runs of 4 per lane group.
template <int M, int K>
K3_HOST_DEVICE constexpr RC mfma_a(int lane, int s) {
  return RC{lane % M, (M * K / 64) * (lane / M) + s};
}
template <int N, int K>
K3_HOST_DEVICE constexpr RC mfma_b(int lane, int s) {
  return RC{(N * K / 64) * (lane / N) + s, lane % N};
}
template <int M>
K3_HOST_DEVICE constexpr RC mfma_c(int lane, int r) {
  return M == 32 ? RC{8 * (r / 4) + 4 * (lane / 32) + (r % 4), lane % 32}
                 : RC{4 * (lane / 16) + r, lane % 16};
}

// ---- Shapes: bf16 inputs, f32 accumulators ----
// kId is the shape's number in the SIMT runtime ABI (simt_abi.h, simt_mma_layout).
struct M16N8K16 {  // NVIDIA mma.sync m16n8k16, warp 32
  static constexpr int kId = 0, M = 16, N = 8, K = 16, kWarp = 32;
  static constexpr int kASlots = 8, kBSlots = 4, kCSlots = 4;
  K3_HOST_DEVICE static constexpr RC a(int lane, int s) { return m16n8k16_a(lane, s); }
  K3_HOST_DEVICE static constexpr RC b(int lane, int s) { return m16n8k16_b(lane, s); }
  K3_HOST_DEVICE static constexpr RC c(int lane, int s) { return m16n8k16_c(lane, s); }
};
struct M32N32K8 {  // AMD v_mfma_f32_32x32x8_bf16 (builtin ..._32x32x8bf16_1k), wave64
  static constexpr int kId = 1, M = 32, N = 32, K = 8, kWarp = 64;
  static constexpr int kASlots = 4, kBSlots = 4, kCSlots = 16;
  K3_HOST_DEVICE static constexpr RC a(int lane, int s) { return mfma_a<32, 8>(lane, s); }
  K3_HOST_DEVICE static constexpr RC b(int lane, int s) { return mfma_b<32, 8>(lane, s); }
  K3_HOST_DEVICE static constexpr RC c(int lane, int s) { return mfma_c<32>(lane, s); }
};
struct M16N16K16 {  // AMD v_mfma_f32_16x16x16_bf16 (builtin ..._16x16x16bf16_1k), wave64
  static constexpr int kId = 2, M = 16, N = 16, K = 16, kWarp = 64;
  static constexpr int kASlots = 4, kBSlots = 4, kCSlots = 4;
  K3_HOST_DEVICE static constexpr RC a(int lane, int s) { return mfma_a<16, 16>(lane, s); }
  K3_HOST_DEVICE static constexpr RC b(int lane, int s) { return mfma_b<16, 16>(lane, s); }
  K3_HOST_DEVICE static constexpr RC c(int lane, int s) { return mfma_c<16>(lane, s); }
};

}  // namespace layout
}  // namespace k3

#endif  // K3_MMA_LAYOUT_H
