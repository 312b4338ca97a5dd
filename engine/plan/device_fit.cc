#include "engine/plan/device_fit.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "engine/model/param_table.h"

namespace switchyard::plan {
namespace {

// Bytes of one converted operand element: 2 (bf16 on a GPU), 4 (rounded f32 on the CPU),
// 0 when the products read their f32 inputs as they are.
double OperandCopyBytes(const config::Config& c) {
  const bool gpu = !c.runtime.device.is_cpu();
  const bool bf16 = c.runtime.precision == config::Precision::kBf16 ||
                    (c.runtime.precision == config::Precision::kAuto && gpu);
  return bf16 ? (gpu ? 2.0 : 4.0) : 0.0;
}

// The operand copies of the rank's matrix products, in bytes. Weights: with bf16 weight
// shadows (bf16 products at ZeRO stage 0, engine/train/train_step.cc) every weight a
// bf16 product reads keeps its bf16 copy for the whole run, 2 bytes an element of each; else
// the largest weight, converted at once by one product. Plus the widest row operand of one
// micro-batch, converted by the product that reads it.
double OperandCopies(const config::Config& c, const dist::Mesh& mesh, int rank) {
  const double bytes = OperandCopyBytes(c);
  if (bytes == 0) return 0;
  const bool shadows = c.parallel.zero_stage == 0;
  const std::shared_ptr<const model::ParamTable> shared = model::ParamTable::Shared(
      c.model, c.moe, {.tp = mesh.tp(), .etp = mesh.etp(), .ep = mesh.ep()});
  const model::ParamTable& table = *shared;
  const int tp_rank = mesh.Coord(rank, dist::View::kDense, dist::Axis::kTp);
  const std::vector<model::Stage> stages = RankStages(c, mesh.Coord(rank, dist::View::kDense, dist::Axis::kPp));
  bool head = false;
  std::vector<bool> layer(c.model.n_layers, false);
  for (const model::Stage& s : stages) {
    head = head || s.head;
    for (int64_t i = s.first_layer; i < s.End(c.model.n_layers); ++i) layer[i] = true;
  }
  double weight = 0, shadowed = 0;
  for (const model::ParamShape& p : table.params()) {
    // The router multiplies in f32 (MODEL.md section 2); norms and biases are added.
    if (p.bias || p.role == model::ParamRole::kNorm || p.role == model::ParamRole::kRouter) continue;
    if (p.role == model::ParamRole::kEmbedding) continue;  // looked up, never multiplied
    // The head piece: the untied head's weight or the tied table's copy (ParamTable::PieceIndex).
    const bool in_head = table.PieceIndex(p) == size_t(c.model.n_layers + 1);
    const bool mine = p.part.kind == parallel::PartId::Kind::kLayer ? layer[p.part.layer] : in_head && head;
    if (!mine) continue;
    const double n = double(table.LocalNumel(p, tp_rank));
    if (shadows) {
      shadowed += n;
    } else {
      weight = std::max(weight, n);
    }
  }
  const double tokens = double(HeadRows(c));
  const double tp = mesh.tp();
  double width = std::max<double>(c.model.d_model, double(c.model.ff_hidden()) / tp);
  bool any_moe = false;
  for (int64_t i = 0; i < c.model.n_layers; ++i) any_moe = any_moe || (layer[i] && c.moe.IsMoELayer(i));
  if (any_moe) width = std::max(width, double(c.moe.top_k) * c.moe.d_expert / mesh.etp());
  double widest = tokens * width;
  // The logits' gradient operand: the head's rows at once (one chunk under head chunking).
  if (head) {
    const double rows = double(c.train.head_rows(int64_t(tokens)));
    widest = std::max(widest, rows * std::ceil(double(c.model.vocab_size) / tp));
  }
  return 2.0 * shadowed + bytes * (weight + widest);
}

}  // namespace

std::vector<int> DistinctRanks(const dist::Mesh& mesh) {
  std::vector<int> ranks;
  for (int r = 0; r < mesh.world(); ++r) {
    if (mesh.Coord(r, dist::View::kDense, dist::Axis::kDp) != 0 ||
        mesh.Coord(r, dist::View::kDense, dist::Axis::kCp) != 0 ||
        mesh.Coord(r, dist::View::kExpert, dist::Axis::kEp) != 0) {
      continue;
    }
    ranks.push_back(r);
  }
  return ranks;
}

double PredictRankPeak(const config::Config& c, const dist::Mesh& mesh, int rank) {
  return PredictRankMemory(c, mesh, rank).total() + OperandCopies(c, mesh, rank);
}

DeviceFit PredictDeviceFit(const config::Config& c, const dist::Mesh& mesh, std::vector<int> ranks) {
  if (ranks.empty()) ranks = DistinctRanks(mesh);
  DeviceFit best;
  best.peak = -1;
  for (int r : ranks) {
    DeviceFit f;
    f.rank = r;
    f.memory = PredictRankMemory(c, mesh, r);
    f.operand_copies = OperandCopies(c, mesh, r);
    f.peak = f.memory.total() + f.operand_copies;
    if (f.peak <= best.peak) continue;
    best = f;
  }
  best.activations = best.memory.activations_peak;
  best.device = double(c.plan.device_memory_gib) * 1024.0 * 1024.0 * 1024.0;
  return best;
}

Status CheckMemoryFits(const config::Config& c, const dist::Mesh& mesh, int rank,
                       int64_t available, const std::string& source) {
  if (available < 0) return OkStatus();
  std::vector<int> sharing = {rank};
  if (c.runtime.device.is_cpu()) {
    sharing.clear();
    const int node = rank / mesh.ranks_per_node();
    for (int r = node * mesh.ranks_per_node(); r < (node + 1) * mesh.ranks_per_node(); ++r) {
      sharing.push_back(r);
    }
  }
  double need = 0;
  for (int r : sharing) need += PredictRankPeak(c, mesh, r);
  if (need <= double(available)) return OkStatus();
  const DeviceFit f = PredictDeviceFit(c, mesh, sharing);
  const RankMemory& m = f.memory;
  std::ostringstream who;
  if (sharing.size() == 1) {
    who << "this rank needs " << FormatBytes(need);
  } else {
    who << "the " << sharing.size() << " ranks on this node need " << FormatBytes(need);
  }
  return FailedPrecondition(
      "runtime.memory_check: ", who.str(), " (the dry-run's peak; the largest, rank ", f.rank,
      ": ", FormatBytes(f.peak), " = model states ",
      FormatBytes(m.parameters + m.gradients + m.optimizer), " + workspace ",
      FormatBytes(m.workspace), " + operand copies ", FormatBytes(f.operand_copies),
      "), more than the ", FormatBytes(double(available)), " ",
      c.runtime.device.is_cpu() ? "the host" : "the GPU", " has available (", source,
      "); lower train.micro_batch_size or model.seq_len, set train.head_chunk_tokens, spread "
      "the model over more ranks (`switchyard train --dry-run --search` lists layouts that "
      "fit), or set runtime.memory_check=false to try anyway");
}

int64_t HeadRows(const config::Config& c) {
  return c.train.micro_batch_size * c.model.seq_len / c.parallel.cp;
}

int64_t SuggestedHeadChunk(const config::Config& c) {
  const int64_t rows = HeadRows(c);
  return rows > 1 ? std::clamp<int64_t>(rows / 4, 1, 4096) : 0;
}

std::string DeviceFitReport(const config::Config& c, const DeviceFit& f) {
  std::ostringstream out;
  const RankMemory& m = f.memory;
  out << "peak / device (largest rank " << f.rank << "): " << FormatBytes(f.peak) << " = parameters "
      << FormatBytes(m.parameters) << " + gradients " << FormatBytes(m.gradients) << " + optimizer "
      << FormatBytes(m.optimizer) << " + workspace " << FormatBytes(m.workspace)
      << " (activations " << FormatBytes(f.activations) << ") + operand copies "
      << FormatBytes(f.operand_copies) << "\n";
  // The head's logits, kept whole from forward to backward: a hint where they weigh.
  const int64_t rows = HeadRows(c);
  const double logits = 4.0 * double(rows) * std::ceil(double(c.model.vocab_size) / c.parallel.tp);
  if (rows > 1 && c.train.head_rows(rows) == rows && logits >= 0.05 * f.peak) {
    out << "  the head" << (c.parallel.pp > 1 ? " (on the last pipeline rank)" : "")
        << " keeps each micro-batch's f32 logits, " << FormatBytes(logits)
        << ", from forward to backward; train.head_chunk_tokens=" << SuggestedHeadChunk(c)
        << " would keep none (docs/config.md)\n";
  }
  if (f.device <= 0) {
    out << "  device memory: not set (plan.device_memory_gib); no fit check\n";
    return out.str();
  }
  char line[256];
  std::snprintf(line, sizeof(line), "  device %s (plan.device_memory_gib %g): margin %s%s (%.1f%%), fits: %s\n",
                FormatBytes(f.device).c_str(), double(c.plan.device_memory_gib),
                f.margin() < 0 ? "-" : "", FormatBytes(std::abs(f.margin())).c_str(),
                100.0 * f.margin() / f.device, f.fits() ? "yes" : "no");
  out << line;
  return out.str();
}

}  // namespace switchyard::plan
