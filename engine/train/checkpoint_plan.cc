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

// ---- Boxes --------------------------------------------------------------------------------

// Copies between `part`, the box of `whole` starting at `offset` (part.shape() its size),
// and `whole`: into whole when `paste`, out of it otherwise. Host tensors, any dtype; runs
// along the last dim are copied at once.
void CopyBox(const Tensor& whole, const Tensor& part, const std::vector<int64_t>& offset,
             bool paste) {
  const Shape& g = whole.shape();
  const int nd = static_cast<int>(g.size());
  const int64_t elem = static_cast<int64_t>(SizeOf(whole.dtype()));
  if (part.numel() == 0) return;
  if (nd == 0) {
    std::memcpy(paste ? whole.raw_data() : part.raw_data(),
                paste ? part.raw_data() : whole.raw_data(), static_cast<size_t>(elem));
    return;
  }
  auto off = [&](int d) { return offset.empty() ? int64_t{0} : offset[d]; };
  std::vector<int64_t> stride(nd, 1);
  for (int d = nd - 2; d >= 0; --d) stride[d] = stride[d + 1] * g[d + 1];
  const int64_t run = part.dim(nd - 1);
  const int64_t runs = part.numel() / run;
  std::vector<int64_t> idx(nd - 1, 0);
  char* w = static_cast<char*>(whole.raw_data());
  char* p = static_cast<char*>(part.raw_data());
  for (int64_t r = 0; r < runs; ++r) {
    int64_t at = off(nd - 1);
    for (int d = 0; d < nd - 1; ++d) at += (idx[d] + off(d)) * stride[d];
    char* wo = w + at * elem;
    char* po = p + r * run * elem;
    std::memcpy(paste ? wo : po, paste ? po : wo, static_cast<size_t>(run * elem));
    for (int d = nd - 2; d >= 0; --d) {
      if (++idx[d] < part.dim(d)) break;
      idx[d] = 0;
    }
  }
}

// ---- Who holds what -----------------------------------------------------------------------

// This rank's boxes, model parameters first; index i is what Send/copy use. Checks what
// the registry does not (optimizer entries are not registered).
StatusOr<std::vector<SliceEntry>> LocalSlices(const std::vector<parallel::Parameter>& params,
                                              const std::vector<parallel::Parameter>& optimizer) {
  std::vector<SliceEntry> out;
  std::set<std::string> seen[2];
  for (int file : {kModelTensors, kOptimizerTensors}) {
    for (const parallel::Parameter& p : file == kModelTensors ? params : optimizer) {
      if (!seen[file].insert(p.name).second) {
        return InvalidArgument("checkpoint: '", p.name, "' is listed twice");
      }
      if (!p.value.defined()) return InvalidArgument("checkpoint: '", p.name, "' has no value");
      const int nd = static_cast<int>(p.global_shape.size());
      SliceEntry e{file, p.name, p.value.dtype(), p.global_shape, {}, p.value.shape()};
      e.offset.assign(nd, 0);
      bool inside = p.value.ndim() == nd && (p.offset.empty() || static_cast<int>(p.offset.size()) == nd);
      for (int d = 0; inside && d < nd; ++d) {
        e.offset[d] = p.OffsetAt(d);
        inside = e.offset[d] >= 0 && e.offset[d] + e.size[d] <= p.global_shape[d];
      }
      if (!inside) {
        return InvalidArgument("checkpoint: '", p.name, "': value ", ShapeString(p.value.shape()),
                               " is not a box of ", ShapeString(p.global_shape));
      }
      out.push_back(std::move(e));
    }
  }
  return out;
}

std::string SerializeSlices(const std::vector<SliceEntry>& entries) {
  json j = json::array();
  for (const SliceEntry& e : entries) {
    j.push_back({e.file, e.name, SafetensorsDType(e.dtype), e.global, e.offset, e.size});
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
                   e[4].get<std::vector<int64_t>>(), e[5].get<Shape>()});
  }
  return out;
}

// Which rank sends which box of every tensor: a whole copy from the lowest rank that has
// one, otherwise the distinct boxes (lowest rank first for each), which must tile the
// tensor: disjoint, and together as many elements as the whole. Every rank computes the
// same plan from the same gathered entries (sorted by file, then name).
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
  auto overlap = [](const SliceEntry& a, const SliceEntry& b) {
    for (size_t d = 0; d < a.global.size(); ++d) {
      if (a.offset[d] + a.size[d] <= b.offset[d] || b.offset[d] + b.size[d] <= a.offset[d]) {
        return false;
      }
    }
    return true;
  };
  std::vector<GatherItem> plan;
  for (const auto& [key, hs] : holders) {
    // Every box lies inside its tensor (LocalSlices checks its own; a list from another
    // rank is checked again here before anything is copied).
    for (const Holder& h : hs) {
      const SliceEntry& e = *h.e;
      bool inside = e.offset.size() == e.global.size() && e.size.size() == e.global.size();
      for (size_t d = 0; inside && d < e.global.size(); ++d) {
        inside = e.offset[d] >= 0 && e.size[d] >= 0 && e.offset[d] + e.size[d] <= e.global[d];
      }
      if (!inside) {
        return InvalidArgument("checkpoint: rank ", h.rank, "'s box of '", key.second,
                               "' is not inside ", ShapeString(e.global));
      }
    }
    const SliceEntry& first = *hs[0].e;
    GatherItem t{key.first, key.second, first.dtype, first.global, {}};
    for (const Holder& h : hs) {
      if (h.e->dtype != first.dtype || h.e->global != first.global) {
        return InvalidArgument("checkpoint: '", key.second, "' is ", DTypeName(first.dtype), " ",
                               ShapeString(first.global), " on rank ", hs[0].rank, " but ",
                               DTypeName(h.e->dtype), " ", ShapeString(h.e->global), " on rank ",
                               h.rank);
      }
    }
    auto whole =
        std::find_if(hs.begin(), hs.end(), [](const Holder& h) { return h.e->size == h.e->global; });
    if (whole != hs.end()) {
      t.pieces.push_back({whole->rank, whole->index, whole->e->offset, whole->e->size});
      plan.push_back(std::move(t));
      continue;
    }
    std::vector<const Holder*> distinct;
    int64_t covered = 0;
    for (const Holder& h : hs) {
      if (NumElements(h.e->size) == 0) continue;
      bool same = false;
      for (const Holder* d : distinct) {
        if (d->e->offset == h.e->offset && d->e->size == h.e->size) {
          same = true;
          break;
        }
        if (overlap(*d->e, *h.e)) {
          return InvalidArgument("checkpoint: the boxes of '", key.second, "' held by ranks ",
                                 d->rank, " and ", h.rank, " overlap without being equal");
        }
      }
      if (same) continue;
      distinct.push_back(&h);
      covered += NumElements(h.e->size);
      t.pieces.push_back({h.rank, h.index, h.e->offset, h.e->size});
    }
    if (covered != NumElements(t.global)) {
      return InvalidArgument("checkpoint: the boxes of '", key.second, "' ",
                             ShapeString(t.global), " cover ", covered, " of its ",
                             NumElements(t.global), " elements");
    }
    plan.push_back(std::move(t));
  }
  return plan;
}

}  // namespace switchyard::train
