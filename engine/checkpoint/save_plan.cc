#include "engine/checkpoint/save_plan.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "engine/core/safetensors.h"

namespace switchyard::checkpoint {

using json = nlohmann::json;


// ---- Boxes --------------------------------------------------------------------------------

// Copies between `part`, the box of `whole` starting at `offset` (part.shape() its size),
// and `whole`: into whole when `paste`, out of it otherwise. Host tensors, any dtype.
void CopyBox(const Tensor& whole, const Tensor& part, const std::vector<int64_t>& offset,
             bool paste) {
  const Piece all = BoxPiece(std::vector<int64_t>(whole.ndim(), 0), whole.shape());
  const Piece box =
      BoxPiece(offset.empty() ? std::vector<int64_t>(whole.ndim(), 0) : offset, part.shape());
  const size_t elem = SizeOf(whole.dtype());
  if (paste) {
    CopyCommon(box, part.raw_data(), all, whole.raw_data(), elem);
  } else {
    CopyCommon(all, whole.raw_data(), box, part.raw_data(), elem);
  }
}

// ---- Who holds what -----------------------------------------------------------------------

const char* CheckpointFileKind(int file) {
  return file == kModelTensors ? "model" : "optimizer";
}

// This rank's pieces, model parameters first; index i is what the writer uses. Checks what
// the registry does not (optimizer entries are not registered).
StatusOr<std::vector<SliceEntry>> LocalSlices(const std::vector<parallel::Parameter>& params,
                                              const std::vector<parallel::Parameter>& optimizer,
                                              SliceUse use) {
  std::vector<SliceEntry> out;
  std::map<std::string, int> seen;  // name -> file
  for (int file : {kModelTensors, kOptimizerTensors}) {
    for (const parallel::Parameter& p : file == kModelTensors ? params : optimizer) {
      auto [it, fresh] = seen.emplace(p.name, file);
      if (!fresh && it->second == file) {
        return InvalidArgument("checkpoint: '", p.name, "' is listed twice");
      }
      if (!fresh) {
        return InvalidArgument("checkpoint: '", p.name,
                               "' is both a model parameter and optimizer state");
      }
      if (!p.value.defined()) return InvalidArgument("checkpoint: '", p.name, "' has no value");
      const int nd = static_cast<int>(p.global_shape.size());
      const Shape& box = p.BoxShape();
      SliceEntry e{file, p.name, p.value.dtype(), p.global_shape, {}};
      e.piece.box = box;
      e.piece.offset.assign(nd, 0);
      bool inside = static_cast<int>(box.size()) == nd &&
                    (p.offset.empty() || static_cast<int>(p.offset.size()) == nd);
      for (int d = 0; inside && d < nd; ++d) {
        e.piece.offset[d] = p.OffsetAt(d);
        inside = e.piece.offset[d] >= 0 && box[d] >= 0 &&
                 e.piece.offset[d] + box[d] <= p.global_shape[d];
      }
      if (!inside) {
        return InvalidArgument("checkpoint: '", p.name, "': ", p.flat_value ? "box " : "value ",
                               ShapeString(box), " is not a box of ", ShapeString(p.global_shape));
      }
      const int64_t n = NumElements(box);
      const int64_t begin = p.flat_begin, end = p.FlatEnd();
      if (begin < 0 || begin > end || end > n) {
        return InvalidArgument("checkpoint: '", p.name, "': elements [", begin, ", ", end,
                               ") are not a range of its box ", ShapeString(box));
      }
      if (p.flat_value && (p.value.ndim() != 1 || p.value.numel() != end - begin)) {
        return InvalidArgument("checkpoint: '", p.name, "': a flat value of elements [", begin,
                               ", ", end, ") must be 1-D of that length, not ",
                               ShapeString(p.value.shape()));
      }
      const bool owned = use == SliceUse::kSave || p.flat_value;
      e.piece.begin = owned ? begin : 0;
      e.piece.end = owned ? end : n;
      out.push_back(std::move(e));
    }
  }
  return out;
}

std::string SerializeSlices(const std::vector<SliceEntry>& entries) {
  json j = json::array();
  for (const SliceEntry& e : entries) {
    j.push_back({e.file, e.name, SafetensorsDType(e.dtype), e.global, e.piece.offset, e.piece.box,
                 e.piece.begin, e.piece.end});
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
                   Piece{e[4].get<std::vector<int64_t>>(), e[5].get<Shape>(), e[6].get<int64_t>(),
                         e[7].get<int64_t>()}});
  }
  return out;
}

// Which rank writes which piece of every tensor: a whole copy from the lowest rank that
// offers one, otherwise the distinct non-empty pieces (lowest rank first for each), which
// must tile the tensor. Every rank computes the same plan from the same gathered entries.
StatusOr<std::vector<SaveItem>> PlanSave(const std::vector<std::vector<SliceEntry>>& per_rank) {
  struct Holder {
    int rank, index;
    const SliceEntry* e;
  };
  std::map<std::string, std::vector<Holder>> holders;
  for (int r = 0; r < static_cast<int>(per_rank.size()); ++r) {
    for (int i = 0; i < static_cast<int>(per_rank[r].size()); ++i) {
      const SliceEntry& e = per_rank[r][i];
      holders[e.name].push_back({r, i, &e});
    }
  }
  std::vector<SaveItem> plan;
  for (const auto& [name, hs] : holders) {
    const SliceEntry& first = *hs[0].e;
    for (const Holder& h : hs) {
      if (h.e->file != first.file) {
        return InvalidArgument("checkpoint: '", name, "' is ", CheckpointFileKind(first.file),
                               " state on rank ", hs[0].rank, " but ",
                               CheckpointFileKind(h.e->file), " state on rank ", h.rank);
      }
      if (h.e->dtype != first.dtype || h.e->global != first.global) {
        return InvalidArgument("checkpoint: '", name, "' is ", DTypeName(first.dtype), " ",
                               ShapeString(first.global), " on rank ", hs[0].rank, " but ",
                               DTypeName(h.e->dtype), " ", ShapeString(h.e->global), " on rank ",
                               h.rank);
      }
      // LocalSlices checks its own; a list from another rank is checked again here.
      if (!PieceInside(h.e->piece, h.e->global)) {
        return InvalidArgument("checkpoint: rank ", h.rank, "'s piece of '", name, "' (",
                               PieceString(h.e->piece, h.e->global), ") is not inside ",
                               ShapeString(h.e->global));
      }
    }
    SaveItem t{first.file, name, first.dtype, first.global, {}};
    auto whole = std::find_if(hs.begin(), hs.end(), [](const Holder& h) {
      return h.e->piece.box == h.e->global && h.e->piece.whole_box();
    });
    if (whole != hs.end()) {
      t.pieces.push_back({whole->rank, whole->index, whole->e->piece});
      plan.push_back(std::move(t));
      continue;
    }
    std::vector<Piece> distinct;
    for (const Holder& h : hs) {
      if (h.e->piece.numel() == 0) continue;
      if (std::find(distinct.begin(), distinct.end(), h.e->piece) != distinct.end()) continue;
      distinct.push_back(h.e->piece);
      t.pieces.push_back({h.rank, h.index, h.e->piece});
    }
    const TilingProblem problem = CheckTiling(distinct, t.global);
    if (problem.first >= 0) {
      const SavePiece& a = t.pieces[problem.first];
      const SavePiece& b = t.pieces[problem.second];
      return InvalidArgument("checkpoint: the pieces of '", name, "' held by ranks ", a.rank,
                             " and ", b.rank, " overlap without being equal (",
                             PieceString(a.piece, t.global), "; ", PieceString(b.piece, t.global),
                             ")");
    }
    if (problem.covered != NumElements(t.global)) {
      return InvalidArgument("checkpoint: the pieces of '", name, "' ", ShapeString(t.global),
                             " cover ", problem.covered, " of its ", NumElements(t.global),
                             " elements");
    }
    plan.push_back(std::move(t));
  }
  std::stable_sort(plan.begin(), plan.end(),
                   [](const SaveItem& a, const SaveItem& b) { return a.file < b.file; });
  return plan;
}

}  // namespace switchyard::checkpoint
