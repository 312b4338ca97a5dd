// Ring attention (dense/ring_attention.h): the ring's schedule, the packed key/value
// buffers and the block loop over kernels/attention.h; the hops themselves are
// engine/parallel/cp_ring.h's.
#include "dense/ring_attention.h"

#include <memory>
#include <utility>

#include "engine/core/check.h"
#include "engine/parallel/cp_ring.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"

namespace switchyard::dense {
namespace {

using kernels::AttentionMask;
using parallel::CpRing;
using parallel::RingBuffers;

// Tags of the two streams of messages around the ring (NCCL ignores tags; every rank posts
// them in the same order, so they match in order there too).
constexpr int kKvTag = 41;
constexpr int kGradTag = 42;

// The local shapes: 2B rows of Sc positions.
struct Dims {
  int64_t b, sc, hq, hkv, hd;
  int64_t kv_elems() const { return b * sc * hkv * hd; }  // one chunk of k (or v)
  Shape q_chunk() const { return {b, sc, hq, hd}; }
  Shape kv_chunk() const { return {b, sc, hkv, hd}; }
  Shape lse_chunk() const { return {b, hq, sc}; }
};

// Global chunk index of cp rank r's half h (0: rows [0, B), 1: rows [B, 2B)) in a ring of
// c ranks (engine/parallel/context_parallel.h's layout).
int Chunk(int c, int r, int h) { return h == 0 ? r : 2 * c - 1 - r; }

enum class BlockKind { kSkip, kDiagonal, kFull };

// Query chunk a against key chunk b.
BlockKind Classify(int a, int b) {
  return b > a ? BlockKind::kSkip : b == a ? BlockKind::kDiagonal : BlockKind::kFull;
}

AttentionMask MaskOf(BlockKind kind) {
  return kind == BlockKind::kDiagonal ? AttentionMask::kCausal : AttentionMask::kFull;
}

// Rows [h B, (h + 1) B) of a local tensor: chunk half h.
Tensor Half(const Tensor& t, int h) {
  const int64_t b = t.dim(0) / 2;
  return t.Slice(h * b, (h + 1) * b);
}

// A packed (k, v) or (dk, dv) block, (2, 2B, Sc, Hkv, hd): k of both halves, then v.
struct KvBlock {
  Tensor t;
  Dims d;

  static KvBlock Empty(const Dims& d, Device device) {
    return {Tensor::Empty({2, 2 * d.b, d.sc, d.hkv, d.hd}, DType::kF32, device), d};
  }
  Tensor k(int h) const { return t.View(d.kv_chunk(), h * d.kv_elems()); }
  Tensor v(int h) const { return t.View(d.kv_chunk(), (2 + h) * d.kv_elems()); }
  // Both halves of k (or v), (2B, Sc, Hkv, hd).
  Tensor k_all() const { return t.View({2 * d.b, d.sc, d.hkv, d.hd}, 0); }
  Tensor v_all() const { return t.View({2 * d.b, d.sc, d.hkv, d.hd}, 2 * d.kv_elems()); }
};

// Pairs one block computes, over the B sequences and Hq query heads.
int64_t Pairs(const Dims& d, BlockKind kind) {
  const int64_t per_head = kind == BlockKind::kFull ? d.sc * d.sc : d.sc * (d.sc + 1) / 2;
  return d.b * d.hq * per_head;
}

// stats += local (stats may be null).
void AddStats(const RingAttentionStats& local, RingAttentionStats* stats) {
  if (stats == nullptr) return;
  stats->pairs += local.pairs;
  stats->bytes_sent += local.bytes_sent;
  stats->blocks_computed += local.blocks_computed;
  stats->blocks_skipped += local.blocks_skipped;
}

// Calls f(qh, kh, kind) for every (query half, key half) pair of ring step t that causality
// does not mask entirely, in a fixed order, and counts the computed and skipped blocks and
// the query-key pairs in `local`.
template <typename F>
void ForEachComputedBlock(const CpRing& ring, int t, const Dims& d, RingAttentionStats& local,
                          F&& f) {
  const int c = ring.size(), src = ring.source(t);
  for (int qh = 0; qh < 2; ++qh) {
    for (int kh = 0; kh < 2; ++kh) {
      const BlockKind kind = Classify(Chunk(c, ring.rank(), qh), Chunk(c, src, kh));
      if (kind == BlockKind::kSkip) {
        ++local.blocks_skipped;
        continue;
      }
      f(qh, kh, kind);
      ++local.blocks_computed;
      local.pairs += Pairs(d, kind);
    }
  }
}

// Checks the local tensors against q's shape and cp's device; returns the dims.
Dims CheckLocal(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                dist::Communicator& cp, DeviceContext* ctx, const char* op) {
  SY_CHECK(q.defined() && k.defined() && v.defined() && lse.defined())
      << op << ": q, k, v or lse is undefined";
  SY_CHECK_EQ(q.ndim(), 4) << op << ": q is (2B, Sc, Hq, hd), got " << ShapeString(q.shape());
  SY_CHECK_EQ(k.ndim(), 4) << op << ": k is (2B, Sc, Hkv, hd), got " << ShapeString(k.shape());
  SY_CHECK(q.dim(0) % 2 == 0) << op << ": q " << ShapeString(q.shape())
                              << " has an odd dim 0; the local layout is 2B rows (two chunks)";
  const Dims d{q.dim(0) / 2, q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  const Shape kv{2 * d.b, d.sc, d.hkv, d.hd}, ls{2 * d.b, d.hq, d.sc};
  SY_CHECK(k.shape() == kv && v.shape() == kv)
      << op << ": k " << ShapeString(k.shape()) << " and v " << ShapeString(v.shape())
      << " must both be " << ShapeString(kv) << " for q " << ShapeString(q.shape());
  SY_CHECK(lse.shape() == ls) << op << ": lse " << ShapeString(lse.shape()) << ", expected "
                              << ShapeString(ls);
  for (const Tensor* t : {&q, &k, &v, &lse}) {
    SY_CHECK(t->device() == cp.device())
        << op << ": tensors are on " << t->device() << " but the cp communicator on "
        << cp.device();
  }
  SY_CHECK(q.device().is_cpu() || ctx == cp.context())
      << op << ": device tensors need the cp communicator's DeviceContext, which orders its ops";
  return d;
}

// The key/value block buffers of a pass: this rank's own k and v packed and in hand, and
// (c > 1) the buffer the next block arrives in.
RingBuffers KvRing(CpRing& ring, const Dims& d, const Tensor& k, const Tensor& v,
                   DeviceContext* ctx) {
  KvBlock own = KvBlock::Empty(d, k.device());
  Tensor arriving = ring.size() > 1 ? KvBlock::Empty(d, k.device()).t : Tensor();
  own.k_all().CopyFrom(k, ctx);
  own.v_all().CopyFrom(v, ctx);
  return RingBuffers(ring, own.t, arriving, kKvTag);
}

}  // namespace

void RingAttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                          Tensor& lse, dist::Communicator& cp, DeviceContext* ctx,
                          RingAttentionStats* stats) {
  constexpr const char* kOp = "RingAttentionForward";
  const Dims d = CheckLocal(q, k, v, lse, cp, ctx, kOp);
  SY_CHECK(out.defined() && out.shape() == q.shape())
      << kOp << ": out must be defined and shaped like q " << ShapeString(q.shape());
  CpRing ring(cp);
  const Device device = q.device();
  RingAttentionStats local;

  // The block in hand and the one arriving.
  RingBuffers kv = KvRing(ring, d, k, v, ctx);
  Tensor out_b, lse_b;  // one block's result before its merge
  bool started[2] = {false, false};

  for (int t = 0; t < ring.size(); ++t) {
    const KvBlock held{kv.held(), d};
    if (t + 1 < ring.size()) kv.PostHop();
    ForEachComputedBlock(ring, t, d, local, [&](int qh, int kh, BlockKind kind) {
      Tensor out_q = Half(out, qh), lse_q = Half(lse, qh);
      if (!started[qh]) {  // the first block of these queries is written in place
        kernels::AttentionForward(Half(q, qh), held.k(kh), held.v(kh), out_q, lse_q, ctx,
                                  MaskOf(kind));
        started[qh] = true;
        return;
      }
      if (!out_b.defined()) {
        out_b = Tensor::Empty(d.q_chunk(), DType::kF32, device);
        lse_b = Tensor::Empty(d.lse_chunk(), DType::kF32, device);
      }
      kernels::AttentionForward(Half(q, qh), held.k(kh), held.v(kh), out_b, lse_b, ctx,
                                MaskOf(kind));
      kernels::AttentionMerge(out_q, lse_q, out_b, lse_b, ctx);
    });
    kv.Wait();
  }
  local.bytes_sent += ring.bytes_sent();
  AddStats(local, stats);
}

namespace {

// A gradient accumulator that is written by its first contribution and added to after:
// no zero fill, and a fixed order of sums.
class Accumulator {
 public:
  Accumulator() = default;
  Accumulator(Tensor target, Tensor* scratch) : target_(std::move(target)), scratch_(scratch) {}

  // Where the next contribution should be written: the target itself the first time, else
  // the scratch tensor that Commit then adds.
  Tensor& Destination() { return written_ ? *scratch_ : target_; }
  void Commit(DeviceContext* ctx) {
    if (written_) kernels::Add(target_, *scratch_, target_, ctx);
    written_ = true;
  }
  // Zero when nothing was contributed.
  void Finish(DeviceContext* ctx) {
    if (!written_) target_.SetZero(ctx);
    written_ = true;
  }

 private:
  Tensor target_;
  Tensor* scratch_ = nullptr;
  bool written_ = false;
};

// The dk, dv partial sums travelling behind the k, v blocks. The dk, dv of the block held
// at step t >= 1 are summed in sum(t) (this rank's share, plus the partial sum received
// from rank-1) and sent on to rank+1; after the last step the other ranks' sum for this
// rank's own block arrives.
class TravellingGrads {
 public:
  TravellingGrads(CpRing& ring, const Dims& d, Device device) : ring_(ring) {
    if (ring.size() == 1) return;
    sums_[0] = KvBlock::Empty(d, device);
    sums_[1] = KvBlock::Empty(d, device);
    incoming_ = KvBlock::Empty(d, device);
  }

  // Where step t >= 1 sums the held block's dk, dv.
  KvBlock& sum(int t) { return sums_[t % 2]; }

  // After step t >= 1: adds the partial sum of the ranks before this one (received since
  // step 2) to sum(t), sends it on, and posts the receipt of the next partial sum (or, after
  // the last step, this rank's own block's).
  void PassOn(int t, DeviceContext* ctx) {
    KvBlock& s = sum(t);
    if (hop_) {
      hop_->Wait();
      kernels::Add(s.t, incoming_.t, s.t, ctx);
    }
    hop_ = ring_.PostHop(s.t, incoming_.t, kGradTag);
  }

  // At the end: adds the other ranks' shares of this rank's own block to dk, dv.
  void AddHome(Tensor& dk, Tensor& dv, DeviceContext* ctx) {
    if (!hop_) return;
    hop_->Wait();
    kernels::Add(dk, incoming_.k_all(), dk, ctx);
    kernels::Add(dv, incoming_.v_all(), dv, ctx);
  }

 private:
  CpRing& ring_;
  KvBlock sums_[2], incoming_;
  std::unique_ptr<dist::Work> hop_;
};

}  // namespace

void RingAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                           const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                           Tensor& dv, dist::Communicator& cp, DeviceContext* ctx,
                           RingAttentionStats* stats) {
  constexpr const char* kOp = "RingAttentionBackward";
  const Dims d = CheckLocal(q, k, v, lse, cp, ctx, kOp);
  for (const Tensor* t : {&out, &dout, static_cast<const Tensor*>(&dq)}) {
    SY_CHECK(t->defined() && t->shape() == q.shape())
        << kOp << ": out, dout and dq must be shaped like q " << ShapeString(q.shape());
  }
  SY_CHECK(dk.defined() && dv.defined() && dk.shape() == k.shape() && dv.shape() == k.shape())
      << kOp << ": dk and dv must be shaped like k " << ShapeString(k.shape());
  CpRing ring(cp);
  const Device device = q.device();
  RingAttentionStats local;

  // delta of the whole softmax, (2B, Hq, Sc), once for every block.
  Tensor delta = Tensor::Empty(lse.shape(), DType::kF32, device);
  kernels::AttentionBackwardDelta(out, dout, delta, ctx);

  // k, v travel as in the forward; their dk, dv behind them.
  RingBuffers kv = KvRing(ring, d, k, v, ctx);
  TravellingGrads grads(ring, d, device);
  Tensor dq_b = Tensor::Empty(d.q_chunk(), DType::kF32, device);
  Tensor dk_b = Tensor::Empty(d.kv_chunk(), DType::kF32, device);
  Tensor dv_b = Tensor::Empty(d.kv_chunk(), DType::kF32, device);
  Accumulator dq_acc[2] = {{Half(dq, 0), &dq_b}, {Half(dq, 1), &dq_b}};

  for (int t = 0; t < ring.size(); ++t) {
    kv.Wait();
    const KvBlock held{kv.held(), d};
    if (t + 1 < ring.size()) kv.PostHop();

    // This step's dk, dv: into this rank's own dk, dv at step 0, else into grads.sum(t).
    Accumulator dk_acc[2], dv_acc[2];
    for (int h = 0; h < 2; ++h) {
      dk_acc[h] = Accumulator(t == 0 ? Half(dk, h) : grads.sum(t).k(h), &dk_b);
      dv_acc[h] = Accumulator(t == 0 ? Half(dv, h) : grads.sum(t).v(h), &dv_b);
    }
    ForEachComputedBlock(ring, t, d, local, [&](int qh, int kh, BlockKind kind) {
      kernels::AttentionBackward(Half(q, qh), held.k(kh), held.v(kh), Half(lse, qh),
                                 Half(dout, qh), dq_acc[qh].Destination(),
                                 dk_acc[kh].Destination(), dv_acc[kh].Destination(), ctx,
                                 MaskOf(kind), Half(delta, qh));
      dq_acc[qh].Commit(ctx);
      dk_acc[kh].Commit(ctx);
      dv_acc[kh].Commit(ctx);
    });
    for (int h = 0; h < 2; ++h) {
      dk_acc[h].Finish(ctx);
      dv_acc[h].Finish(ctx);
    }
    if (t > 0) grads.PassOn(t, ctx);
  }
  for (int h = 0; h < 2; ++h) dq_acc[h].Finish(ctx);
  grads.AddHome(dk, dv, ctx);
  local.bytes_sent += ring.bytes_sent();
  AddStats(local, stats);
}

}  // namespace switchyard::dense
