#include "engine/parallel/grad_sync.h"

#include <algorithm>
#include <sstream>

#include "engine/core/check.h"
#include "engine/dist/ordered_sum.h"
#include "engine/parallel/sync_plan.h"

namespace switchyard::parallel {

using dist::Axis;
using dist::View;

struct GradSync::Bucket {
  std::vector<size_t> params;    // registry indices, packing order
  std::vector<int64_t> offsets;  // element offset of each parameter in flat
  DType dtype = DType::kF32;
  int64_t elements = 0;
  int part = -1;                 // options_.part_of of its parameters, when given
  int64_t chunk_begin = 0, chunk_elements = 0;  // this rank's chunk
  Tensor flat;                   // (elements,) on the communicator's device, while in flight
  Tensor grad_shard;             // reduce_scatter: (chunk_elements,), persistent
  int pending = 0;               // parameters not yet marked this step (micro-batch)
  bool launched = false;
  int rounds = 0;                // streaming: reduce-scatters into grad_shard this step
  std::unique_ptr<dist::Work> work;
};

struct GradSync::Group {
  View view = View::kDense;
  AxisSet axes;
  dist::Communicator* comm = nullptr;
  std::vector<Bucket> buckets;
  size_t next_launch = 0;  // buckets [0, next_launch) are in flight or done this step
};

namespace {

std::string GroupName(View view, AxisSet axes) {
  return StrCat(view == View::kDense ? "dense" : "expert", " over ", axes.ToString(view));
}

}  // namespace

GradSyncOptions GradSyncOptionsFor(const SyncPolicy& policy, int64_t bucket_bytes,
                                   std::vector<int> keys) {
  return {.bucket_bytes = bucket_bytes,
          .reduce_scatter = policy.reduce_scatter,
          .persistent_shard = policy.persistent_shard,
          .part_of = std::move(keys),
          .stream = policy.stream,
          .max_in_flight = policy.max_in_flight};
}

dist::Communicator& GroupOf(const dist::ParallelContext& pc, View view, AxisSet axes) {
  if (view == View::kDense) {
    if (axes == AxisSet{Axis::kDp, Axis::kCp}) return pc.dp_cp();
    if (axes == AxisSet{Axis::kDp, Axis::kCp, Axis::kTp}) return pc.dp_cp_tp();
    if (axes == AxisSet{Axis::kTp}) return pc.tp();
  } else {
    if (axes == AxisSet{Axis::kDp}) return pc.edp();
    if (axes == AxisSet{Axis::kDp, Axis::kTp}) return pc.edp_etp();
    if (axes == AxisSet{Axis::kTp}) return pc.etp();
  }
  SY_CHECK(false) << "no communicator for the " << (view == View::kDense ? "dense" : "expert")
                  << " axes " << axes.ToString(view);
  return pc.world();
}

GradSync::GradSync(ParameterRegistry& registry, const dist::ParallelContext& pc,
                   int64_t bucket_bytes, DeviceContext* ctx)
    : GradSync(
          registry, [&pc](View view, AxisSet axes) -> dist::Communicator& {
            return parallel::GroupOf(pc, view, axes);
          },
          bucket_bytes, ctx) {}

GradSync::GradSync(ParameterRegistry& registry, const GroupResolver& group_of, int64_t bucket_bytes,
                   DeviceContext* ctx)
    : GradSync(registry, group_of, [bucket_bytes] {
        GradSyncOptions o;
        o.bucket_bytes = bucket_bytes;
        return o;
      }(), ctx) {}

GradSync::GradSync(ParameterRegistry& registry, const GroupResolver& group_of,
                   const GradSyncOptions& options, DeviceContext* ctx)
    : registry_(registry), ctx_(ctx), options_(options) {
  SY_CHECK(options_.bucket_bytes > 0) << "GradSync: bucket_bytes " << options_.bucket_bytes;
  SY_CHECK(options_.max_in_flight >= 1) << "GradSync: max_in_flight " << options_.max_in_flight;
  SY_CHECK(!options_.stream || (options_.reduce_scatter && options_.persistent_shard &&
                                !options_.part_of.empty()))
      << "GradSync: streaming needs reduce_scatter, persistent_shard and part_of";
  SY_CHECK(options_.part_of.empty() || options_.part_of.size() == registry.params().size())
      << "GradSync: part_of has " << options_.part_of.size() << " entries for "
      << registry.params().size() << " parameters";
  const std::vector<Parameter>& params = registry_.params();
  where_.assign(params.size(), {-1, -1});
  marked_.assign(params.size(), false);
  // The buckets as the sync plan packs them (sync_plan.h), the groups' communicators
  // resolved once each.
  std::vector<SyncParam> specs;
  for (const Parameter& p : params) specs.push_back(SyncParamOf(p, -1));
  std::vector<std::pair<std::pair<View, AxisSet>, dist::Communicator*>> comms;
  auto comm_of = [&](View view, AxisSet axes) -> dist::Communicator* {
    for (auto& [kind, comm] : comms)
      if (kind == std::pair{view, axes}) return comm;
    comms.push_back({{view, axes}, &group_of(view, axes)});
    return comms.back().second;
  };
  const std::vector<SyncGroup> plan = PackBuckets(
      specs, options_.part_of, options_.bucket_bytes,
      [&](View view, AxisSet axes) { return comm_of(view, axes)->size(); });
  for (const SyncGroup& planned : plan) {
    auto group = std::make_unique<Group>();
    group->view = planned.view;
    group->axes = planned.axes;
    group->comm = comm_of(planned.view, planned.axes);
    const int slot = static_cast<int>(groups_.size());
    for (const SyncBucket& pb : planned.buckets) {
      Bucket& b = group->buckets.emplace_back();
      b.params = pb.params;
      b.offsets = pb.offsets;
      b.dtype = pb.dtype;
      b.elements = pb.elements;
      b.part = pb.key;
      for (size_t i : b.params) {
        SY_CHECK(params[i].grad.device() == group->comm->device())
            << "GradSync: " << params[i].name << "'s gradient is on " << params[i].grad.device()
            << ", the " << GroupName(group->view, group->axes) << " communicator on "
            << group->comm->device();
        where_[i] = {slot, static_cast<int>(group->buckets.size() - 1)};
      }
      PlaceChunk(b, *group->comm);
    }
    groups_.push_back(std::move(group));
  }
}

void GradSync::PlaceChunk(Bucket& b, const dist::Communicator& comm) {
  b.pending = static_cast<int>(b.params.size());
  const std::vector<int64_t> chunks = dist::OrderedChunks(b.elements, comm.size());
  for (int r = 0; r < comm.rank(); ++r) b.chunk_begin += chunks[r];
  b.chunk_elements = chunks[comm.rank()];
  if (options_.reduce_scatter && options_.persistent_shard) {
    b.grad_shard = Tensor::Zeros({b.chunk_elements}, b.dtype, comm.device(), ctx_);
    b.grad_shard.buffer().SetKind(MemoryKind::kGradients);
  }
}

GradSync::~GradSync() {
  // Complete anything still in flight before the buffers go away.
  for (Bucket* b : in_flight_) b->work->Wait();
}

void GradSync::Pack(Bucket& b) {
  std::vector<Parameter>& params = registry_.params();
  b.flat = Tensor::Empty({b.elements}, b.dtype, params[b.params[0]].grad.device());
  if (options_.reduce_scatter && !options_.persistent_shard) {
    b.grad_shard = Tensor::Empty({b.chunk_elements}, b.dtype, b.flat.device());
  }
  for (size_t j = 0; j < b.params.size(); ++j) {
    const Tensor& grad = params[b.params[j]].grad;
    Tensor into = b.flat.View({grad.numel()}, b.offsets[j]);
    // Streaming: a gradient never begun this micro-batch is zero.
    if (grad.buffer().resident()) {
      into.CopyFrom(grad, ctx_);
    } else {
      into.SetZero(ctx_);
    }
    if (options_.stream) grad.buffer().Release();  // the packed copy is all that is left
  }
}

void GradSync::Launch(Group& g, Bucket& b) {
  // A bucket launched again (streaming: the next micro-batch) first completes its last
  // round; then at most max_in_flight - 1 others stay in flight.
  // Only reduce-scatters are completed early: their Wait is local (the all-to-all was
  // started in bucket order), while an all-reduce's ends with a blocking all-gather, which
  // ranks marking parameters in different orders would reach in different orders.
  if (options_.reduce_scatter) {
    while (std::find(in_flight_.begin(), in_flight_.end(), &b) != in_flight_.end()) Complete();
    while (static_cast<int>(in_flight_.size()) >= options_.max_in_flight) Complete();
  }
  if (step_done_) launches_.clear();
  step_done_ = false;
  for (size_t slot = 0; slot < groups_.size(); ++slot) {
    if (groups_[slot].get() == &g) launches_.emplace_back(int(slot), int(&b - g.buckets.data()));
  }
  Pack(b);
  b.work = Reduce(g, b);
  b.launched = true;
  ++b.rounds;
  in_flight_.push_back(&b);
}

void GradSync::Complete() { Complete(*in_flight_.front()); }

void GradSync::Complete(Bucket& b) {
  in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), &b));
  b.work->Wait();
  b.work.reset();
  Unpack(b);
}

void GradSync::CompleteInFlight() {
  // Every group's buckets in bucket order: the same order on every rank.
  for (auto& g : groups_)
    for (Bucket& b : g->buckets)
      if (b.work) Complete(b);
}

void GradSync::Unpack(Bucket& b) {
  std::vector<Parameter>& params = registry_.params();
  if (!options_.reduce_scatter) {
    for (size_t j = 0; j < b.params.size(); ++j) {
      Tensor& grad = params[b.params[j]].grad;
      grad.CopyFrom(b.flat.View(grad.shape(), b.offsets[j]), ctx_);
    }
  } else if (!options_.persistent_shard) {
    // Stage 1: the summed chunk goes back into the elements of the grads it covers.
    const int64_t lo = b.chunk_begin, hi = b.chunk_begin + b.chunk_elements;
    for (size_t j = 0; j < b.params.size(); ++j) {
      Tensor grad = params[b.params[j]].grad;
      const int64_t at = b.offsets[j];
      const int64_t from = std::max(lo, at), to = std::min(hi, at + grad.numel());
      if (from >= to) continue;
      grad.Reshape({grad.numel()}).View({to - from}, from - at)
          .CopyFrom(b.grad_shard.View({to - from}, from - lo), ctx_);
    }
    b.grad_shard = Tensor();
  }
  b.flat = Tensor();  // the bucket is workspace: only in flight
}

std::unique_ptr<dist::Work> GradSync::Reduce(Group& g, Bucket& b) {
  // The sums are ordered on the communicator's own context, as before ZeRO. Streaming adds
  // every micro-batch after the step's first into the shard.
  if (options_.reduce_scatter) {
    return dist::OrderedReduceScatterAsync(*g.comm, b.flat, b.grad_shard, nullptr,
                                           /*accumulate=*/options_.stream && b.rounds > 0);
  }
  return dist::OrderedAllReduceAsync(*g.comm, b.flat);
}

void GradSync::LaunchReady(Group& g) {
  while (g.next_launch < g.buckets.size() && g.buckets[g.next_launch].pending == 0) {
    Bucket& b = g.buckets[g.next_launch++];
    Launch(g, b);
  }
  if (!options_.stream || g.next_launch < g.buckets.size()) return;
  // Streaming: the micro-batch's round is complete; the next one marks the parts again.
  g.next_launch = 0;
  for (Bucket& b : g.buckets) {
    b.pending = static_cast<int>(b.params.size());
    b.launched = false;
    for (size_t i : b.params) marked_[i] = false;
  }
}

void GradSync::MarkReady(size_t index) {
  SY_CHECK(index < where_.size()) << "GradSync::MarkReady(" << index << "): the registry had "
                                  << where_.size() << " parameters";
  // Streaming marks every micro-batch's backward; a parameter with no bucket (a group of
  // size 1) has nothing to send and no round to reset.
  if (options_.stream && where_[index].first < 0) return;
  SY_CHECK(!marked_[index]) << "GradSync::MarkReady: " << registry_.params()[index].name
                            << " marked twice in one step";
  marked_[index] = true;
  in_step_ = true;
  const auto [slot, bucket] = where_[index];
  if (slot < 0) return;
  Group& g = *groups_[slot];
  Bucket& b = g.buckets[bucket];
  SY_CHECK(!b.launched) << "GradSync::MarkReady: " << registry_.params()[index].name
                        << "'s bucket was already launched";
  if (--b.pending == 0) LaunchReady(g);
}

void GradSync::BeginGradients(const std::vector<size_t>& indices) {
  if (!options_.stream) return;
  std::vector<Parameter>& params = registry_.params();
  for (size_t i : indices) {
    SY_CHECK(i < params.size()) << "GradSync::BeginGradients(" << i << ")";
    if (where_[i].first < 0) continue;
    Tensor& grad = params[i].grad;
    if (grad.buffer().resident()) continue;
    grad.buffer().Materialize();
    grad.SetZero(ctx_);
  }
}

void GradSync::Finish() {
  for (auto& g : groups_) {
    // What was not launched goes now: the rest of a started round, or (streaming) a bucket
    // with no round this step.
    for (size_t i = 0; i < g->buckets.size(); ++i) {
      Bucket& b = g->buckets[i];
      const bool partial = !options_.stream || g->next_launch > 0;
      if (i >= g->next_launch && (partial || b.rounds == 0)) b.pending = 0;
    }
    LaunchReady(*g);
  }
  CompleteInFlight();
  for (auto& g : groups_) {
    for (Bucket& b : g->buckets) {
      b.launched = false;
      b.rounds = 0;
      b.pending = static_cast<int>(b.params.size());
    }
    g->next_launch = 0;
  }
  marked_.assign(marked_.size(), false);
  in_step_ = false;
  step_done_ = true;
}

void GradSync::SyncAll() {
  SY_CHECK(!in_step_) << "GradSync::SyncAll between MarkReady and Finish";
  for (auto& g : groups_) {
    for (Bucket& b : g->buckets) {
      Launch(*g, b);
      if (!options_.reduce_scatter) Complete(b);  // one all-reduce at a time
    }
  }
  CompleteInFlight();
  for (auto& g : groups_) {
    for (Bucket& b : g->buckets) {
      b.launched = false;
      b.rounds = 0;
    }
  }
  step_done_ = true;
}

std::vector<GradSync::BucketInfo> GradSync::Buckets() const {
  std::vector<BucketInfo> out;
  for (const auto& g : groups_) {
    for (const Bucket& b : g->buckets) {
      out.push_back({.view = g->view,
                     .axes = g->axes,
                     .comm = g->comm,
                     .params = b.params,
                     .offsets = b.offsets,
                     .elements = b.elements,
                     .bytes = b.elements * static_cast<int64_t>(SizeOf(b.dtype)),
                     .chunk_begin = b.chunk_begin,
                     .chunk_elements = b.chunk_elements,
                     .grad_shard = b.grad_shard});
    }
  }
  return out;
}

std::string GradSync::Summary() const {
  std::ostringstream out;
  int64_t bytes = 0, count = 0;
  std::ostringstream parts;
  for (const auto& g : groups_) {
    if (&g != &groups_.front()) parts << ", ";
    parts << GroupName(g->view, g->axes) << ": " << g->buckets.size() << " on "
          << g->comm->size() << " ranks";
    count += static_cast<int64_t>(g->buckets.size());
    for (const Bucket& b : g->buckets) bytes += b.elements * static_cast<int64_t>(SizeOf(b.dtype));
  }
  out.precision(3);
  out << "grad sync: " << count << " bucket" << (count == 1 ? "" : "s");
  if (!groups_.empty()) out << " (" << parts.str() << ")";
  out << ", " << static_cast<double>(bytes) / (1024.0 * 1024.0) << " MiB";
  return out.str();
}

}  // namespace switchyard::parallel
