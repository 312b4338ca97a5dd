#include "engine/train/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/core/file.h"
#include "engine/core/step_readback.h"
#include "kernels/moe_routing.h"

namespace switchyard::train {
namespace {

std::string Format(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

}  // namespace

double MaxViolation(const std::vector<int64_t>& counts) {
  if (counts.empty()) return 0;
  double total = 0, hi = 0;
  for (int64_t c : counts) {
    total += c;
    hi = std::max(hi, static_cast<double>(c));
  }
  const double mean = total / counts.size();
  return mean > 0 ? hi / mean - 1 : 0;
}

double LoadCv(const std::vector<int64_t>& counts) {
  if (counts.empty()) return 0;
  double total = 0, sq = 0;
  for (int64_t c : counts) total += c;
  const double mean = total / counts.size();
  for (int64_t c : counts) sq += (c - mean) * (c - mean);
  return mean > 0 ? std::sqrt(sq / counts.size()) / mean : 0;
}

std::string ProgressLine(const StepMetrics& m) {
  std::ostringstream out;
  out << "step " << m.step << " | loss " << Format("%.4f", m.loss) << " (ce "
      << Format("%.4f", m.ce_loss) << " aux " << Format("%.4f", m.aux_loss) << " z "
      << Format("%.4f", m.z_loss) << ") | lr " << Format("%.2e", m.lr) << " | gnorm "
      << Format("%.3f", m.grad_norm) << " | " << Format("%.0f", m.tokens_per_s) << " tok/s";
  if (!m.moe.empty()) {
    double dropped = 0, lo = 1, hi = 0;
    for (const moe::MoEStats& s : m.moe) {
      dropped += s.dropped_fraction();
      lo = std::min(lo, s.min_load_share());
      hi = std::max(hi, s.max_load_share());
    }
    out << " | dropped " << Format("%.1f", 100 * dropped / m.moe.size()) << "% | load min "
        << Format("%.1f", 100 * lo) << "% max " << Format("%.1f", 100 * hi) << "%";
  }
  return out.str();
}

nlohmann::ordered_json MoEStatsJson(int64_t layer, const moe::MoEStats& s, bool with_counts) {
  nlohmann::ordered_json l;
  l["layer"] = layer;
  l["tokens"] = s.tokens;
  l["assignments"] = s.assignments;
  if (with_counts) {
    l["tokens_per_expert"] = s.tokens_per_expert;
    l["tokens_per_expert_kept"] = s.tokens_per_expert_kept;
  }
  l["dropped"] = s.dropped();
  l["dropped_frac"] = s.dropped_fraction();
  l["router_entropy"] = s.router_entropy();
  l["aux"] = s.aux_mean();
  l["z"] = s.z_mean();
  l["router_lse_sq"] = s.router_lse_sq();
  l["min_load"] = s.min_load_share();
  l["max_load"] = s.max_load_share();
  l["max_violation"] = MaxViolation(s.tokens_per_expert);
  l["load_cv"] = LoadCv(s.tokens_per_expert);
  return l;
}

std::string MetricsJson(const StepMetrics& m) {
  nlohmann::ordered_json j;
  j["step"] = m.step;
  j["loss"] = m.loss;
  j["ce_loss"] = m.ce_loss;
  j["aux_loss"] = m.aux_loss;
  j["z_loss"] = m.z_loss;
  j["lr"] = m.lr;
  j["grad_norm"] = m.grad_norm;  // NaN and Inf are written as null
  if (m.nonfinite) {
    j["nonfinite"] = true;
    j["skipped"] = m.skipped;
    j["nonfinite_param"] = m.nonfinite_param;
  }
  if (m.nonfinite_skips > 0) j["nonfinite_skips"] = m.nonfinite_skips;
  j["tokens_per_s"] = m.tokens_per_s;
  j["step_s"] = m.step_s;
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (size_t i = 0; i < m.moe.size(); ++i) layers.push_back(MoEStatsJson(m.moe_layer_ids[i], m.moe[i], /*with_counts=*/false));
  j["moe"] = layers;
  return j.dump();
}

std::string RoutingJson(const StepMetrics& m, const std::vector<std::vector<double>>& expert_bias) {
  nlohmann::ordered_json j;
  j["step"] = m.step;
  j["layers"] = m.moe_layer_ids;
  nlohmann::ordered_json before = nlohmann::ordered_json::array(), kept = before;
  for (const moe::MoEStats& s : m.moe) {
    before.push_back(s.tokens_per_expert);
    kept.push_back(s.tokens_per_expert_kept);
  }
  j["tokens_per_expert"] = before;
  j["tokens_per_expert_kept"] = kept;
  if (!expert_bias.empty()) j["expert_bias"] = expert_bias;
  return j.dump();
}

StatusOr<JsonlWriter> JsonlWriter::Open(const std::string& path, int64_t keep_before_step) {
  std::string kept;
  int64_t dropped = 0;
  if (keep_before_step > 0) {
    std::ifstream in(path, std::ios::binary);
    std::string line;
    while (std::getline(in, line)) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      const bool keep = !in.eof() && j.is_object() && j.contains("step") &&
                        j["step"].is_number_integer() && j["step"].get<int64_t>() < keep_before_step;
      if (keep) {
        kept += line + "\n";
      } else {
        ++dropped;
      }
    }
  }
  // A resumed run's kept records replace the file atomically; a new run empties it.
  if (keep_before_step > 0) SY_RETURN_IF_ERROR(WriteFileAtomically(path, kept));
  JsonlWriter w;
  w.path_ = path;
  w.dropped_ = dropped;
  w.fd_ = ::open(path.c_str(),
                 O_WRONLY | O_APPEND | O_CLOEXEC | (keep_before_step > 0 ? 0 : O_CREAT | O_TRUNC),
                 0644);
  if (w.fd_ < 0) return FailedPrecondition(path, ": cannot open for writing (", std::strerror(errno), ")");
  return w;
}

JsonlWriter::JsonlWriter(JsonlWriter&& other) noexcept
    : path_(std::move(other.path_)), fd_(other.fd_), failed_(other.failed_), dropped_(other.dropped_) {
  other.fd_ = -1;
}

JsonlWriter& JsonlWriter::operator=(JsonlWriter&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = other.fd_;
    failed_ = other.failed_;
    dropped_ = other.dropped_;
    other.fd_ = -1;
  }
  return *this;
}

JsonlWriter::~JsonlWriter() {
  if (fd_ >= 0) ::close(fd_);
}

bool JsonlWriter::Write(const std::string& line) {
  const std::string record = line + "\n";
  const off_t before = ::lseek(fd_, 0, SEEK_END);
  // A short write (the disk or a file-size limit reached part way) is followed by a write
  // of the rest, whose error is the cause (ENOSPC, EFBIG, ...).
  size_t done = 0;
  int err = 0;
  while (done < record.size() && err == 0) {
    const ssize_t n = ::write(fd_, record.data() + done, record.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) err = errno;
    if (n == 0) err = ENOSPC;
    if (n > 0) done += static_cast<size_t>(n);
  }
  if (done == record.size()) return true;
  // A short write leaves part of the record: cut the file back so no line is torn.
  if (done > 0 && before >= 0 && ::ftruncate(fd_, before) != 0) {
    std::fprintf(stderr, "warning: %s: could not remove a partly written record (%s)\n",
                 path_.c_str(), std::strerror(errno));
  }
  if (failed_++ == 0) {
    std::fprintf(stderr,
                 "warning: %s: a metrics record could not be written (%s); training goes on, "
                 "records that cannot be written are skipped (counted at the end)\n",
                 path_.c_str(), std::strerror(err));
    std::fflush(stderr);
  }
  return false;
}

RoutingByLabel::RoutingByLabel(std::vector<std::string> labels, std::vector<int64_t> layer_ids,
                               int64_t num_experts)
    : labels_(std::move(labels)), layer_ids_(std::move(layer_ids)), num_experts_(num_experts) {
  counts_.assign(layer_ids_.size(), std::vector<int64_t>(labels_.size() * num_experts_, 0));
  pending_first_.assign(layer_ids_.size(), -1);
  pending_values_.assign(layer_ids_.size(), Tensor());
}

void RoutingByLabel::Add(size_t layer, const Tensor& indices, const Tensor& labels) {
  const int64_t t = indices.dim(0), k = indices.dim(1);
  SY_CHECK_EQ(labels.numel(), t) << "one label per routed token";
  const int32_t* ip = indices.data<int32_t>();
  const int32_t* lp = labels.data<int32_t>();
  std::vector<int64_t>& c = counts_[layer];
  for (int64_t i = 0; i < t; ++i) {
    if (lp[i] < 0 || lp[i] >= static_cast<int32_t>(labels_.size())) continue;
    for (int64_t j = 0; j < k; ++j) ++c[lp[i] * num_experts_ + ip[i * k + j]];
  }
}

void RoutingByLabel::AddInStep(size_t layer, const Tensor& indices, const Tensor& labels,
                               DeviceContext* ctx) {
  if (labels_.empty()) return;  // a corpus without labels: nothing to count
  StepReadback* readback = ctx != nullptr ? ctx->step_readback() : nullptr;
  if (readback == nullptr) {
    Add(layer, indices.ToHost("routing_record", ctx), labels);
    return;
  }
  const int64_t n = static_cast<int64_t>(labels_.size()) * num_experts_ + 1;
  const Device device = indices.device();
  if (pending_first_[layer] < 0) {
    // A graph replay's readback reuses the slots after the captured ones: zeroed here.
    StepReadback::Slots slots = readback->Reserve(n, device, ctx);
    slots.values.SetZero(ctx);
    pending_first_[layer] = slots.first;
    pending_values_[layer] = slots.values;
  }
  const Tensor on_device = labels.device() == device ? labels : labels.To(device, ctx);
  kernels::AddLabelAssignmentCounts(indices, on_device, static_cast<int64_t>(labels_.size()),
                                    num_experts_, pending_values_[layer], ctx);
}

void RoutingByLabel::Resolve(std::span<const double> slots) {
  const int64_t cells = static_cast<int64_t>(labels_.size()) * num_experts_;
  for (size_t layer = 0; layer < pending_first_.size(); ++layer) {
    const int64_t first = pending_first_[layer];
    if (first < 0) continue;
    SY_CHECK_LE(first + cells + 1, static_cast<int64_t>(slots.size())) << "RoutingByLabel::Resolve";
    SY_CHECK_EQ(slots[first + cells], 0.0)
        << "routing by label: expert indices outside [0, " << num_experts_ << ")";
    for (int64_t i = 0; i < cells; ++i) counts_[layer][i] += static_cast<int64_t>(slots[first + i]);
    pending_first_[layer] = -1;
    pending_values_[layer] = Tensor();
  }
}

void RoutingByLabel::AllReduce(dist::Communicator& comm) {
  for (std::vector<int64_t>& c : counts_) {
    Tensor t = Tensor::FromVector(c, {static_cast<int64_t>(c.size())});
    comm.AllReduce(t, dist::ReduceOp::kSum);
    c = t.ToVector<int64_t>();
  }
}

std::string RoutingByLabel::Table() const {
  std::ostringstream out;
  for (size_t l = 0; l < layer_ids_.size(); ++l) {
    out << "routing by language, layer " << layer_ids_[l]
        << " (% of each language's assignments per expert)\n  lang  ";
    for (int64_t e = 0; e < num_experts_; ++e) out << Format("%6.0f", double(e));
    out << "   top\n";
    for (size_t lab = 0; lab < labels_.size(); ++lab) {
      const int64_t* row = counts_[l].data() + lab * num_experts_;
      int64_t total = 0, best = 0;
      for (int64_t e = 0; e < num_experts_; ++e) {
        total += row[e];
        if (row[e] > row[best]) best = e;
      }
      if (total == 0) continue;
      char name[16];
      std::snprintf(name, sizeof(name), "  %-5s ", labels_[lab].c_str());
      out << name;
      for (int64_t e = 0; e < num_experts_; ++e) out << Format("%6.1f", 100.0 * row[e] / total);
      out << "   e" << best << "\n";
    }
  }
  return out.str();
}

std::string RoutingByLabel::Json() const {
  nlohmann::ordered_json j;
  j["labels"] = labels_;
  j["layers"] = layer_ids_;
  j["num_experts"] = num_experts_;
  nlohmann::ordered_json counts = nlohmann::ordered_json::array();
  for (const std::vector<int64_t>& c : counts_) {
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (size_t lab = 0; lab < labels_.size(); ++lab) {
      rows.push_back(std::vector<int64_t>(c.begin() + lab * num_experts_,
                                          c.begin() + (lab + 1) * num_experts_));
    }
    counts.push_back(rows);
  }
  j["counts"] = counts;
  return j.dump();
}

std::string LoadBalanceSummary(const std::vector<int64_t>& layer_ids,
                               const std::vector<moe::MoEStats>& stats) {
  std::ostringstream out;
  out << "load balance (whole run, every data-parallel rank)\n"
      << "  layer  dropped  entropy/lnE   min load  max load    cv   tokens per expert (% of kept)\n";
  for (size_t i = 0; i < stats.size(); ++i) {
    const moe::MoEStats& s = stats[i];
    const auto& kept = s.tokens_per_expert_kept;
    double total = 0;
    for (int64_t c : kept) total += c;
    const double cv = LoadCv(kept);
    const double max_entropy = kept.empty() ? 1 : std::log(static_cast<double>(kept.size()));
    out << Format("  %5.0f", double(layer_ids[i])) << Format("  %6.2f%%", 100 * s.dropped_fraction())
        << Format("  %11.3f", s.router_entropy() / max_entropy)
        << Format("   %6.2f%%", 100 * s.min_load_share()) << Format("  %6.2f%%", 100 * s.max_load_share())
        << Format("  %5.2f", cv) << "  ";
    for (int64_t c : kept) out << Format(" %.1f", total > 0 ? 100.0 * c / total : 0.0);
    out << "\n";
  }
  return out.str();
}

}  // namespace switchyard::train
