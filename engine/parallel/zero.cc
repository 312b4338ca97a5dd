#include "engine/parallel/zero.h"

#include <algorithm>
#include <sstream>

#include "engine/core/check.h"
#include "engine/dist/ordered_sum.h"

namespace switchyard::parallel {

struct ZeroShards::Bucket {
  GradSync::BucketInfo info;
  std::vector<int64_t> chunks;  // dist::OrderedChunks of the bucket over its group
  int64_t padded = 0;           // chunks[0]: every rank's all-gather piece is this long
  Tensor param_shard;           // stage 3: (padded,), the owned values first
};

// The all-gathers of one part's (or every) bucket, in flight.
struct ZeroShards::Gather {
  struct One {
    int bucket = -1;
    Tensor send, recv;  // (padded,) and (group size * padded,)
    std::unique_ptr<dist::Work> work;
  };
  std::vector<One> ones;
};

namespace {

// `t` views all of its buffer, so freeing or re-tagging the buffer touches t alone.
void CheckOwnsBuffer(const Tensor& t, const Parameter& p, const char* what) {
  SY_CHECK(t.nbytes() == t.buffer().bytes())
      << "ZeRO: " << p.name << "'s " << what << " shares its buffer (" << t.buffer().bytes()
      << " bytes for " << t.nbytes() << "); ZeRO frees and tags whole buffers";
}

Tensor Flat(const Tensor& t) { return t.Reshape({t.numel()}); }

}  // namespace

ZeroShards::ZeroShards(ParameterRegistry& registry, GradSync& sync, int stage,
                       std::vector<int> part_of, std::vector<PartId> part_names,
                       DeviceContext* ctx)
    : registry_(registry),
      sync_(sync),
      stage_(stage),
      ctx_(ctx),
      part_of_(std::move(part_of)),
      part_names_(std::move(part_names)) {
  SY_CHECK(stage_ >= 0 && stage_ <= 3) << "ZeRO stage " << stage_;
  std::vector<Parameter>& params = registry_.params();
  SY_CHECK(part_of_.size() == params.size())
      << "ZeRO: part_of has " << part_of_.size() << " entries for " << params.size() << " parameters";
  where_.assign(params.size(), {-1, 0});
  part_buckets_.resize(part_names_.size());
  gathers_.resize(part_names_.size());
  resident_.assign(part_names_.size(), true);
  for (GradSync::BucketInfo& info : sync_.Buckets()) {
    SY_CHECK((stage_ >= 2) == info.grad_shard.defined())
        << "ZeRO stage " << stage_ << " needs a GradSync with reduce_scatter = " << (stage_ >= 2);
    Bucket b;
    b.chunks = dist::OrderedChunks(info.elements, info.comm->size());
    b.padded = b.chunks[0];
    b.info = std::move(info);
    const int id = static_cast<int>(buckets_.size());
    int part = -1;
    for (size_t j = 0; j < b.info.params.size(); ++j) {
      const size_t i = b.info.params[j];
      where_[i] = {id, b.info.offsets[j]};
      SY_CHECK(stage_ < 3 || part < 0 || part == part_of_[i])
          << "ZeRO-3: a bucket spans two parts (build the GradSync with part_of)";
      part = part_of_[i];
    }
    if (part >= 0) part_buckets_[part].push_back(id);
    buckets_.push_back(std::move(b));
  }
  // Owned ranges and memory tags.
  for (size_t i = 0; i < params.size(); ++i) {
    Parameter& p = params[i];
    CheckOwnsBuffer(p.value, p, "value");
    const bool bucketed = where_[i].first >= 0;
    p.value.buffer().SetKind(stage_ >= 3 && bucketed ? MemoryKind::kWorkspace
                                                     : MemoryKind::kParameters);
    if (!p.trainable) continue;
    CheckOwnsBuffer(p.grad, p, "gradient");
    p.grad.buffer().SetKind(stage_ >= 2 && bucketed ? MemoryKind::kWorkspace
                                                    : MemoryKind::kGradients);
    if (stage_ == 0 || !bucketed) continue;
    const Bucket& b = buckets_[where_[i].first];
    const int64_t at = where_[i].second, n = p.value.numel();
    const int64_t lo = std::clamp(b.info.chunk_begin - at, int64_t{0}, n);
    const int64_t hi = std::clamp(b.info.chunk_begin + b.info.chunk_elements - at, int64_t{0}, n);
    p.flat_begin = lo;
    p.flat_end = std::max(lo, hi);
  }
  if (stage_ < 3) return;
  // Stage 3: the owned chunk of every bucket moves into its shard; the whole parameters go.
  for (Bucket& b : buckets_) {
    b.param_shard = Tensor::Zeros({b.padded}, DType::kF32, b.info.comm->device(), ctx_);
    b.param_shard.buffer().SetKind(MemoryKind::kParameters);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (where_[i].first < 0) continue;
    Tensor owned = OwnedValue(i);
    if (owned.numel() > 0) {
      owned.CopyFrom(Flat(params[i].value).View({owned.numel()}, params[i].flat_begin), ctx_);
    }
  }
  for (int part = 0; part < static_cast<int>(part_names_.size()); ++part) Release(part_names_[part]);
}

ZeroShards::~ZeroShards() {
  for (auto& g : gathers_)
    if (g)
      for (auto& one : g->ones) one.work->Wait();
}

Tensor ZeroShards::OwnedValue(size_t index) const {
  const Parameter& p = registry_.params()[index];
  const auto [bucket, at] = where_[index];
  if (bucket < 0 || stage_ == 0) return Flat(p.value);
  const int64_t n = p.FlatEnd() - p.flat_begin;
  if (stage_ < 3) return Flat(p.value).View({n}, p.flat_begin);
  const Bucket& b = buckets_[bucket];
  return b.param_shard.View({n}, n == 0 ? 0 : at + p.flat_begin - b.info.chunk_begin);
}

Tensor ZeroShards::OwnedGrad(size_t index) const {
  const Parameter& p = registry_.params()[index];
  const auto [bucket, at] = where_[index];
  if (bucket < 0 || stage_ == 0) return Flat(p.grad);
  const int64_t n = p.FlatEnd() - p.flat_begin;
  if (stage_ < 2) return Flat(p.grad).View({n}, p.flat_begin);
  const Bucket& b = buckets_[bucket];
  return b.info.grad_shard.View({n}, n == 0 ? 0 : at + p.flat_begin - b.info.chunk_begin);
}

AxisSet ZeroShards::ShardAxes(size_t index) const {
  const int bucket = where_[index].first;
  if (bucket < 0 || stage_ == 0) return AxisSet();
  return buckets_[bucket].info.axes;
}

void ZeroShards::MaterializeGradients() {
  if (stage_ < 2) return;
  for (const Bucket& b : buckets_)
    for (size_t i : b.info.params) registry_.params()[i].grad.buffer().Materialize();
}

void ZeroShards::FreeGradients() {
  if (stage_ < 2) return;
  for (const Bucket& b : buckets_)
    for (size_t i : b.info.params) registry_.params()[i].grad.buffer().Release();
}

int ZeroShards::PartIndex(const PartId& part) const {
  auto it = std::find(part_names_.begin(), part_names_.end(), part);
  return it == part_names_.end() ? -1 : static_cast<int>(it - part_names_.begin());
}

void ZeroShards::Unpack(const Bucket& b, const Tensor& recv,
                        const std::function<Tensor(size_t)>& whole_of) const {
  for (size_t j = 0; j < b.info.params.size(); ++j) {
    Tensor value = Flat(whole_of(b.info.params[j]));
    const int64_t at = b.info.offsets[j], n = value.numel();
    int64_t begin = 0;  // the chunk of rank s covers [begin, begin + chunks[s]) of the bucket
    for (size_t s = 0; s < b.chunks.size(); begin += b.chunks[s], ++s) {
      const int64_t lo = std::max(at, begin), hi = std::min(at + n, begin + b.chunks[s]);
      if (lo >= hi) continue;
      value.View({hi - lo}, lo - at)
          .CopyFrom(recv.View({hi - lo}, static_cast<int64_t>(s) * b.padded + lo - begin), ctx_);
    }
  }
}

void ZeroShards::GatherUpdatedParameters() {
  if (stage_ == 0 || stage_ == 3) return;
  GatherWhole([this](size_t i) { return OwnedValue(i); },
              [this](size_t i) { return registry_.params()[i].value; });
}

void ZeroShards::GatherWhole(const std::function<Tensor(size_t)>& owned_of,
                             const std::function<Tensor(size_t)>& whole_of) const {
  if (stage_ == 0) return;
  // Each bucket's owned chunk, packed in bucket order (the parameters' owned ranges, in
  // packing order, are exactly the chunk), all-gathered with at most two buckets in flight
  // (their receive buffers are a bucket each).
  Gather g;
  size_t done = 0;
  auto complete = [&] {
    Gather::One& one = g.ones[done++];
    one.work->Wait();
    Unpack(buckets_[one.bucket], one.recv, whole_of);
    one = Gather::One();
  };
  for (int id = 0; id < static_cast<int>(buckets_.size()); ++id) {
    if (g.ones.size() - done >= 2) complete();
    const Bucket& b = buckets_[id];
    Gather::One one;
    one.bucket = id;
    one.send = Tensor::Zeros({b.padded}, DType::kF32, b.info.comm->device(), ctx_);
    int64_t at = 0;
    for (size_t i : b.info.params) {
      Tensor owned = owned_of(i);
      if (owned.numel() == 0) continue;
      one.send.View({owned.numel()}, at).CopyFrom(owned, ctx_);
      at += owned.numel();
    }
    SY_CHECK_EQ(at, b.info.chunk_elements) << "ZeRO: owned ranges do not fill the chunk";
    one.recv = Tensor::Empty({b.info.comm->size() * b.padded}, DType::kF32, b.info.comm->device());
    one.work = b.info.comm->AllGatherAsync(one.send, one.recv);
    g.ones.push_back(std::move(one));
  }
  while (done < g.ones.size()) complete();
}

void ZeroShards::StartGather(const PartId& part) {
  const int id = PartIndex(part);
  if (id < 0 || resident_[id] || gathers_[id]) return;
  auto g = std::make_unique<Gather>();
  for (int bucket : part_buckets_[id]) {
    Bucket& b = buckets_[bucket];
    Gather::One one;
    one.bucket = bucket;
    one.send = b.param_shard;
    one.recv = Tensor::Empty({b.info.comm->size() * b.padded}, DType::kF32, b.info.comm->device());
    one.work = b.info.comm->AllGatherAsync(one.send, one.recv);
    g->ones.push_back(std::move(one));
  }
  gathers_[id] = std::move(g);
}

void ZeroShards::FinishGather(const PartId& part) {
  const int id = PartIndex(part);
  if (id < 0 || resident_[id]) return;
  if (!gathers_[id]) StartGather(part);
  std::unique_ptr<Gather> g = std::move(gathers_[id]);
  for (Gather::One& one : g->ones) {
    one.work->Wait();
    Unpack(buckets_[one.bucket], one.recv, [this](size_t i) {
      Tensor& value = registry_.params()[i].value;
      value.buffer().Materialize();
      return value;
    });
  }
  resident_[id] = true;
}

void ZeroShards::Acquire(const PartId& part, const PartId& next) {
  if (stage_ < 3) return;
  FinishGather(part);
  if (next.none() || next == part) return;
  // A streamed gradient bucket in flight completes first: a reduce-scatter and a gather,
  // each a part's size in receive buffers, are never in flight together.
  const int id = PartIndex(next);
  if (id >= 0 && !resident_[id] && !gathers_[id]) sync_.CompleteInFlight();
  StartGather(next);
}

void ZeroShards::Release(const PartId& part) {
  if (stage_ < 3) return;
  const int id = PartIndex(part);
  if (id < 0 || !resident_[id]) return;
  for (int bucket : part_buckets_[id])
    for (size_t i : buckets_[bucket].info.params) registry_.params()[i].value.buffer().Release();
  resident_[id] = false;
}

void ZeroShards::AcquireAll() {
  for (const PartId& part : part_names_) FinishGather(part);
}

void ZeroShards::ReleaseAll() {
  for (const PartId& part : part_names_) Release(part);
}

std::vector<Parameter> ZeroShards::CheckpointParameters() const {
  std::vector<Parameter> out;
  const std::vector<Parameter>& params = registry_.params();
  for (size_t i = 0; i < params.size(); ++i) {
    Parameter p = params[i];
    p.grad = Tensor();
    p.trainable = false;
    if (stage_ == 3 && where_[i].first >= 0) {
      p.box_shape = p.value.shape();
      p.flat_value = true;
      p.value = OwnedValue(i);
    }
    out.push_back(std::move(p));
  }
  return out;
}

std::string ZeroShards::Summary() const {
  std::ostringstream out;
  out << "zero " << stage_ << ": " << buckets_.size() << " bucket" << (buckets_.size() == 1 ? "" : "s");
  std::vector<std::string> groups;
  for (const Bucket& b : buckets_) {
    std::ostringstream g;
    g << (b.info.view == dist::View::kDense ? "dense " : "expert ") << b.info.axes.ToString(b.info.view)
      << " (" << b.info.comm->size() << " ranks)";
    if (std::find(groups.begin(), groups.end(), g.str()) == groups.end()) groups.push_back(g.str());
  }
  for (size_t k = 0; k < groups.size(); ++k) out << (k ? " and " : " over ") << groups[k];
  return out.str();
}

std::vector<HeldGrad> HeldGrads(const ParameterRegistry& registry, const ZeroShards* zero) {
  const bool sharded = zero != nullptr && zero->stage() > 0;
  std::vector<HeldGrad> held;
  const auto& params = registry.params();
  for (size_t i = 0; i < params.size(); ++i) {
    const Parameter& p = params[i];
    if (!p.trainable || !p.grad.defined()) continue;
    Tensor grad = sharded ? zero->OwnedGrad(i) : p.grad;
    if (grad.numel() > 0) held.push_back({i, std::move(grad)});
  }
  return held;
}

}  // namespace switchyard::parallel
