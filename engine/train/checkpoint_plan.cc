#include "engine/train/checkpoint_plan.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "engine/core/safetensors.h"

namespace switchyard::train {

using json = nlohmann::json;

// ---- Agreement over the world -------------------------------------------------------------

// Every rank's `mine`, in rank order. Collective.
std::vector<std::string> AllGatherStrings(const std::string& mine, dist::Communicator& world) {
  const int n = world.size();
  Tensor len = Tensor::FromVector<int64_t>({static_cast<int64_t>(mine.size())}, {1});
  Tensor lens = Tensor::Empty({n}, DType::kI64);
  world.AllGather(len, lens);
  const std::vector<int64_t> sizes = lens.ToVector<int64_t>();
  const int64_t width = *std::max_element(sizes.begin(), sizes.end());
  std::vector<std::string> out(n);
  if (width == 0) return out;
  Tensor in = Tensor::Zeros({width}, DType::kU8);
  std::memcpy(in.raw_data(), mine.data(), mine.size());
  Tensor all = Tensor::Empty({n * width}, DType::kU8);
  world.AllGather(in, all);
  const char* bytes = static_cast<const char*>(all.raw_data());
  for (int r = 0; r < n; ++r) out[r].assign(bytes + r * width, sizes[r]);
  return out;
}

// The error of the lowest failing rank, on every rank (OK when every rank is OK), so that
// every rank takes the same path afterwards. Collective.
Status AgreeOnStatus(const Status& local, dist::Communicator& world) {
  Tensor code = Tensor::FromVector<int32_t>({static_cast<int32_t>(local.code())}, {1});
  Tensor codes = Tensor::Empty({world.size()}, DType::kI32);
  world.AllGather(code, codes);
  const std::vector<int32_t> all = codes.ToVector<int32_t>();
  for (int r = 0; r < world.size(); ++r) {
    if (all[r] == 0) continue;
    std::string message = world.rank() == r ? std::string(local.message()) : std::string();
    Tensor len = Tensor::FromVector<int64_t>({static_cast<int64_t>(message.size())}, {1});
    world.Broadcast(len, r);
    message.resize(static_cast<size_t>(len.ToVector<int64_t>()[0]));
    if (!message.empty()) {
      Tensor bytes = Tensor::Empty({static_cast<int64_t>(message.size())}, DType::kU8);
      std::memcpy(bytes.raw_data(), message.data(), message.size());
      world.Broadcast(bytes, r);
      std::memcpy(message.data(), bytes.raw_data(), message.size());
    }
    return Status(static_cast<absl::StatusCode>(all[r]), message);
  }
  return OkStatus();
}

// ---- Slices -------------------------------------------------------------------------------

Shape SliceShape(const Shape& global, int dim, int64_t len) {
  Shape s = global;
  if (dim >= 0) s[dim] = len;
  return s;
}

// Copies between `part` (the slice [offset, offset + part.dim(dim)) of `whole` along dim)
// and `whole`: into whole when `paste`, out of it otherwise. Host tensors, any dtype.
void CopySlice(const Tensor& whole, const Tensor& part, int dim, int64_t offset, bool paste) {
  const Shape& g = whole.shape();
  int64_t outer = 1, inner = static_cast<int64_t>(SizeOf(whole.dtype()));
  for (int i = 0; i < dim; ++i) outer *= g[i];
  for (int i = dim + 1; i < static_cast<int>(g.size()); ++i) inner *= g[i];
  const int64_t len = part.dim(dim);
  char* w = static_cast<char*>(whole.raw_data());
  char* p = static_cast<char*>(part.raw_data());
  for (int64_t o = 0; o < outer; ++o) {
    char* wo = w + (o * g[dim] + offset) * inner;
    char* po = p + o * len * inner;
    if (paste) {
      std::memcpy(wo, po, static_cast<size_t>(len * inner));
    } else {
      std::memcpy(po, wo, static_cast<size_t>(len * inner));
    }
  }
}

// ---- Who holds what -----------------------------------------------------------------------

// This rank's slices, model parameters first; index i is what Send/copy use. Checks what
// the registry does not (optimizer entries are not registered).
StatusOr<std::vector<SliceEntry>> LocalSlices(const std::vector<model::Parameter>& params,
                                              const std::vector<model::Parameter>& optimizer) {
  std::vector<SliceEntry> out;
  std::set<std::string> seen[2];
  for (int file : {kModelTensors, kOptimizerTensors}) {
    for (const model::Parameter& p : file == kModelTensors ? params : optimizer) {
      if (!seen[file].insert(p.name).second) {
        return InvalidArgument("checkpoint: '", p.name, "' is listed twice");
      }
      if (!p.value.defined()) return InvalidArgument("checkpoint: '", p.name, "' has no value");
      SliceEntry e{file, p.name, p.value.dtype(), p.global_shape, p.shard_dim, 0, 0};
      if (p.is_sharded()) {
        if (p.shard_dim >= static_cast<int>(p.global_shape.size()) ||
            p.value.ndim() != static_cast<int>(p.global_shape.size())) {
          return InvalidArgument("checkpoint: '", p.name, "': shard_dim ", p.shard_dim, " of ",
                                 ShapeString(p.global_shape));
        }
        e.offset = p.shard_offset;
        e.len = p.value.dim(p.shard_dim);
      }
      if (p.value.shape() != SliceShape(p.global_shape, e.shard_dim, e.len) || e.offset < 0 ||
          (e.shard_dim >= 0 && e.offset + e.len > p.global_shape[e.shard_dim])) {
        return InvalidArgument("checkpoint: '", p.name, "': value ", ShapeString(p.value.shape()),
                               " at offset ", e.offset, " is not a slice of ",
                               ShapeString(p.global_shape), " along dim ", e.shard_dim);
      }
      out.push_back(std::move(e));
    }
  }
  return out;
}

std::string SerializeSlices(const std::vector<SliceEntry>& entries) {
  json j = json::array();
  for (const SliceEntry& e : entries) {
    j.push_back(
        {e.file, e.name, SafetensorsDType(e.dtype), e.global, e.shard_dim, e.offset, e.len});
  }
  return j.dump();
}

std::vector<SliceEntry> DeserializeSlices(const std::string& text) {
  std::vector<SliceEntry> out;
  if (text.empty()) return out;
  json j = json::parse(text);
  for (const json& e : j) {
    out.push_back({e[0].get<int>(), e[1].get<std::string>(),
                   ParseSafetensorsDType(e[2].get<std::string>()).value(), e[3].get<Shape>(),
                   e[4].get<int>(), e[5].get<int64_t>(), e[6].get<int64_t>()});
  }
  return out;
}

// Which rank sends which slice of every tensor: a whole copy from the lowest rank that has
// one, otherwise slices along shard_dim that tile it, lowest rank first. Every rank
// computes the same plan from the same gathered entries (sorted by file, then name).
StatusOr<std::vector<GatherItem>> PlanGather(const std::vector<std::vector<SliceEntry>>& per_rank) {
  struct Holder {
    int rank, index;
    const SliceEntry* e;
  };
  std::map<std::pair<int, std::string>, std::vector<Holder>> holders;
  for (int r = 0; r < static_cast<int>(per_rank.size()); ++r) {
    for (int i = 0; i < static_cast<int>(per_rank[r].size()); ++i) {
      const SliceEntry& e = per_rank[r][i];
      holders[{e.file, e.name}].push_back({r, i, &e});
    }
  }
  std::vector<GatherItem> plan;
  for (const auto& [key, hs] : holders) {
    const SliceEntry& first = *hs[0].e;
    GatherItem t{key.first, key.second, first.dtype, first.global, -1, {}};
    for (const Holder& h : hs) {
      if (h.e->dtype != first.dtype || h.e->global != first.global) {
        return InvalidArgument("checkpoint: '", key.second, "' is ", DTypeName(first.dtype), " ",
                               ShapeString(first.global), " on rank ", hs[0].rank, " but ",
                               DTypeName(h.e->dtype), " ", ShapeString(h.e->global), " on rank ",
                               h.rank);
      }
    }
    auto whole =
        std::find_if(hs.begin(), hs.end(), [](const Holder& h) { return h.e->shard_dim < 0; });
    if (whole != hs.end()) {
      t.pieces.push_back({whole->rank, whole->index, 0, 0});
      plan.push_back(std::move(t));
      continue;
    }
    t.shard_dim = first.shard_dim;
    for (const Holder& h : hs) {
      if (h.e->shard_dim != t.shard_dim) {
        return InvalidArgument("checkpoint: '", key.second, "' is split along dim ", t.shard_dim,
                               " on rank ", hs[0].rank, " but along dim ", h.e->shard_dim,
                               " on rank ", h.rank);
      }
    }
    const int64_t extent = t.global[t.shard_dim];
    for (int64_t cursor = 0; cursor < extent;) {
      auto next = std::find_if(hs.begin(), hs.end(), [&](const Holder& h) {
        return h.e->offset == cursor && h.e->len > 0;
      });
      if (next == hs.end()) {
        return InvalidArgument("checkpoint: the slices of '", key.second, "' ",
                               ShapeString(t.global), " along dim ", t.shard_dim,
                               " leave a gap at index ", cursor);
      }
      t.pieces.push_back({next->rank, next->index, cursor, next->e->len});
      cursor += next->e->len;
    }
    plan.push_back(std::move(t));
  }
  return plan;
}

}  // namespace switchyard::train
