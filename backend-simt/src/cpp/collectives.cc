// Warp collectives: the ABI entry points kernels call and what the last lane to arrive computes
// for the whole group. Semantics follow CUDA's *_sync intrinsics (PTX shfl.sync): a shuffle
// whose source lane is outside the mask returns poison (0xDEADBEEF...).
#include "runtime.h"

namespace k3 {
namespace simt {

namespace {

constexpr uint64_t kPoison = 0xDEADBEEFDEADBEEFull;

struct ShflPayload {
  uint64_t value;
  int arg;
  uint64_t result;
};
struct BallotPayload {
  int pred;
  uint64_t result;
};

Block& cur_block() { return t_worker->block; }

// Source lane of a shuffle (CUDA semantics; width is a power of two <= warp size):
//   idx   base + (src & (width-1))
//   up    lane - delta, unless that leaves the lane's segment (then the lane's own value)
//   down  lane + delta, unless that leaves the segment
//   xor   lane ^ mask, unless that lands in a later segment (earlier segments are allowed)
int source_lane(int kind, int lane, int arg, int width) {
  int base = lane & ~(width - 1);
  switch (kind) {
    case kShflIdx: return base + (arg & (width - 1));
    case kShflUp: return lane - base >= arg ? lane - arg : lane;
    case kShflDown: return lane - base + arg < width ? lane + arg : lane;
    default: {
      int j = lane ^ arg;
      return j < base + width ? j : lane;
    }
  }
}

const char* shfl_name(int kind) {
  switch (kind) {
    case kShflIdx: return "shfl";
    case kShflUp: return "shfl_up";
    case kShflDown: return "shfl_down";
    case kShflXor: return "shfl_xor";
    default: return "shfl(?)";
  }
}

}  // namespace

const char* coll_name(int op, int sub) {
  switch (op) {
    case kCollShfl: return shfl_name(sub);
    case kCollBallot: return "ballot";
    case kCollSyncWarp: return "sync_warp";
    case kCollMma: return "mma_sync";
    default: return "a warp collective";
  }
}

void run_collective(Block& b, Warp& w, const CollGroup& g) {
  switch (g.op) {
    case kCollShfl: {
      for (unsigned l = 0; l < b.warp_size; ++l) {
        if (!(g.mask >> l & 1)) continue;
        ShflPayload* p = static_cast<ShflPayload*>(w.lanes[l]->coll_payload);
        int src = source_lane(g.sub, static_cast<int>(l), p->arg, g.width);
        p->result = (src >= 0 && src < static_cast<int>(b.warp_size) && (g.mask >> src & 1))
                        ? static_cast<ShflPayload*>(w.lanes[src]->coll_payload)->value
                        : kPoison;
      }
      break;
    }
    case kCollBallot: {
      uint64_t bits = 0;
      for (unsigned l = 0; l < b.warp_size; ++l) {
        if ((g.mask >> l & 1) && static_cast<BallotPayload*>(w.lanes[l]->coll_payload)->pred) bits |= uint64_t(1) << l;
      }
      for (unsigned l = 0; l < b.warp_size; ++l) {
        if (g.mask >> l & 1) static_cast<BallotPayload*>(w.lanes[l]->coll_payload)->result = bits;
      }
      break;
    }
    case kCollMma: mma_gather_compute_scatter(b, w, g.sub); break;
    default: break;  // sync_warp: the rendezvous is the whole effect
  }
}

uint64_t warp_shfl(int kind, uint64_t mask, uint64_t value, int arg, int width, const char* file, int line) {
  Block& b = cur_block();
  if (kind < kShflIdx || kind > kShflXor) fail("unknown shuffle kind %d at %s:%d", kind, file, line);
  if (width < 1 || width > static_cast<int>(b.warp_size) || (width & (width - 1)) != 0) {
    fail("%s at %s:%d: width %d is not a power of two in [1, %u] (%s)", shfl_name(kind), file, line, width,
                b.warp_size, thread_name(t_fiber).s);
  }
  if ((kind == kShflUp || kind == kShflDown) && arg < 0) {
    fail("%s at %s:%d: negative delta %d", shfl_name(kind), file, line, arg);
  }
  ShflPayload p{value, arg, 0};
  collective(kCollShfl, kind, width, mask, &p, file, line);
  return p.result;
}

uint64_t warp_ballot(uint64_t mask, int pred, const char* file, int line) {
  BallotPayload p{pred, 0};
  collective(kCollBallot, 0, 0, mask, &p, file, line);
  return p.result;
}

void warp_sync(uint64_t mask, const char* file, int line) { collective(kCollSyncWarp, 0, 0, mask, nullptr, file, line); }

}  // namespace simt
}  // namespace k3
