// The benchmark harness; see harness.h.
#include "benchmarks/harness.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <fstream>
#include <map>

#include "engine/core/thread_pool.h"
#include "engine/dist/process.h"
#include "kernels/gemm.h"


namespace switchyard::bench {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

StatusOr<int64_t> ParseBytes(const std::string& text) {
  std::string digits = text;
  int64_t scale = 1;
  if (!digits.empty() && (digits.back() == 'B' || digits.back() == 'b')) digits.pop_back();
  // K, M, G: 2^10, 2^20, 2^30.
  if (const size_t unit = std::string("KMG").find(static_cast<char>(
          std::toupper(static_cast<unsigned char>(digits.empty() ? ' ' : digits.back()))));
      unit != std::string::npos) {
    scale = int64_t{1} << (10 * (unit + 1));
    digits.pop_back();
  }
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos ||
      digits.size() > 12) {
    return InvalidArgument("expected a byte count such as 1048576, 64K, 1M or 1G, got \"", text,
                           "\"");
  }
  return std::stoll(digits) * scale;
}

StatusOr<double> ParseDouble(const std::string& flag, const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (...) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !std::isfinite(v)) {
    return InvalidArgument("--", flag, " expects a number, got \"", text, "\"");
  }
  return v;
}

StatusOr<DType> ParseBenchDType(const std::string& name) {
  static const std::map<std::string, DType> kNames = {
      {"float", DType::kF32}, {"half", DType::kF16}, {"int", DType::kI32},
      {"int8", DType::kU8},   {"char", DType::kU8},  {"uint8", DType::kU8}};
  if (auto it = kNames.find(name); it != kNames.end()) return it->second;
  StatusOr<DType> parsed = ParseDType(name);
  if (!parsed.ok()) {
    return InvalidArgument("--datatype: unknown type \"", name,
                           "\"; use float, bfloat16, half, int32, int64 or uint8");
  }
  return parsed;
}

std::string BenchDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "half";
    case DType::kI32:
      return "int32";
    case DType::kI64:
      return "int64";
    case DType::kU8:
      return "uint8";
    case DType::kF64:
      return "double";
  }
  return "?";
}

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> out;
  for (size_t s = 0; !text.empty() && s != std::string::npos;) {
    const size_t comma = text.find(',', s);
    out.push_back(text.substr(s, comma == std::string::npos ? comma : comma - s));
    s = comma == std::string::npos ? comma : comma + 1;
  }
  return out;
}

ElementSplits ToElementSplits(const std::vector<int64_t>& rows, int64_t row_elements) {
  ElementSplits s;
  int displ = 0;
  for (int64_t r : rows) {
    s.counts.push_back(static_cast<int>(r * row_elements));
    s.displs.push_back(displ);
    displ += s.counts.back();
  }
  return s;
}

// ---- Table ------------------------------------------------------------------------------

Table::Table(std::vector<std::vector<Column>> groups, bool print) : print_(print) {
  for (auto& group : groups) {
    if (group.empty()) continue;
    group_starts_.push_back(columns_.size());
    for (Column& c : group) columns_.push_back(std::move(c));
  }
}

namespace {

// The columns of one header line (names, or units), '#' in the first position.
std::string HeaderLine(const std::vector<Column>& columns, const std::vector<size_t>& starts,
                       bool units) {
  std::string line;
  for (size_t i = 0; i < columns.size(); ++i) {
    if (i > 0 && std::find(starts.begin(), starts.end(), i) != starts.end()) line += "  ";
    const std::string& text = units ? columns[i].unit : columns[i].name;
    line += " ";
    line += std::string(std::max<int>(0, columns[i].width - static_cast<int>(text.size())), ' ');
    line += text;
  }
  line[0] = '#';
  return line;
}

std::string FormatCell(const Cell& cell, const Column& column) {
  char buf[64];
  if (const auto* i = std::get_if<int64_t>(&cell)) {
    std::snprintf(buf, sizeof(buf), "%*lld", column.width, static_cast<long long>(*i));
  } else if (const auto* d = std::get_if<double>(&cell)) {
    if (std::isnan(*d)) {
      std::snprintf(buf, sizeof(buf), "%*s", column.width, "-");
    } else {
      std::snprintf(buf, sizeof(buf), "%*.*f", column.width, column.precision, *d);
    }
  } else {
    std::snprintf(buf, sizeof(buf), "%*s", column.width, std::get<std::string>(cell).c_str());
  }
  return buf;
}

}  // namespace

void Table::PrintHeader() const {
  if (!print_) return;
  std::printf("%s\n%s\n", HeaderLine(columns_, group_starts_, false).c_str(),
              HeaderLine(columns_, group_starts_, true).c_str());
  std::fflush(stdout);
}

void Table::AddRow(std::vector<Cell> cells) {
  SY_CHECK_EQ(cells.size(), columns_.size()) << "one cell per column";
  if (print_) {
    std::string line;
    for (size_t i = 0; i < cells.size(); ++i) {
      if (i > 0 &&
          std::find(group_starts_.begin(), group_starts_.end(), i) != group_starts_.end()) {
        line += "  ";
      }
      line += ' ';
      line += FormatCell(cells[i], columns_[i]);
    }
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
  rows_.push_back(std::move(cells));
}

double Table::Mean(const std::string& column) const {
  size_t index = columns_.size();
  for (size_t i = 0; i < columns_.size(); ++i) {
    if (columns_[i].name == column) index = i;
  }
  if (index == columns_.size() || rows_.empty()) return 0;
  double sum = 0;
  int n = 0;
  for (const auto& row : rows_) {
    if (const auto* d = std::get_if<double>(&row[index]); d && !std::isnan(*d)) sum += *d, ++n;
  }
  return n ? sum / n : 0;
}

nlohmann::json Table::Rows() const {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : rows_) {
    nlohmann::json r = nlohmann::json::object();
    for (size_t i = 0; i < columns_.size(); ++i) {
      std::visit(
          [&](const auto& v) {
            using T = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<T, double>) {
              r[columns_[i].name] = std::isnan(v) ? nlohmann::json() : nlohmann::json(v);
            } else {
              r[columns_[i].name] = v;
            }
          },
          row[i]);
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

// ---- Harness ----------------------------------------------------------------------------

Harness::Harness(std::string program, std::string summary, Features features)
    : program_(std::move(program)),
      summary_(std::move(summary)),
      features_(features),
      flags_(std::make_unique<cli::FlagSet>(program_, summary_)) {
  if (features_.sweep) {
    flags_->AddString("minbytes", &min_text_,
                      "-b: smallest size in bytes (K, M, G suffixes; default 1M)");
    flags_->AddString("maxbytes", &max_text_, "-e: largest size in bytes (default 64M)");
    flags_->AddInt("stepfactor", &options_.step_factor,
                   "-f: multiply the size by this (default 2)");
  }
  flags_->AddInt("iters", &options_.iters, "-n: timed iterations per measurement (default 20)");
  flags_->AddInt("warmup_iters", &options_.warmup, "-w: untimed warm-up iterations (default 5)");
  if (features_.dtype) {
    flags_->AddString("datatype", &dtype_text_,
                      "-d: float, bfloat16, half, int32, int64, uint8 (default float)");
  }
  flags_->AddInt("check", &options_.check,
                 "-c: 1 checks every output value and counts #wrong, 0 skips it (default 1)");
  flags_->AddString("json", &options_.json, "write the results as JSON to this file (rank 0)");
  flags_->AddString("device", &options_.device,
                    "cpu (host buffers, MPI) or cuda (device buffers, NCCL)");
  flags_->AddInt("threads", &options_.threads,
                 "compute threads per rank (default: SWITCHYARD_THREADS, OPENBLAS_NUM_THREADS, else the cores)");
}

Harness::~Harness() {
  world_.reset();
  if (started_) dist::FinalizeProcess();
}

std::optional<int> Harness::Start(int argc, char** argv) {
  started_ = true;
  if (Status s = dist::InitProcess(&argc, &argv); !s.ok()) {
    return cli::UsageError(program_, Message(s));
  }
  const bool print = dist::WorldRank() == 0;
  // nccl-tests' short flags, spelled as our long ones.
  static const std::map<std::string, std::string> kShort = {
      {"-b", "--minbytes"},     {"-e", "--maxbytes"}, {"-f", "--stepfactor"}, {"-n", "--iters"},
      {"-w", "--warmup_iters"}, {"-d", "--datatype"}, {"-c", "--check"}};
  std::vector<std::string> args;
  command_line_ = argv[0];
  for (int i = 1; i < argc; ++i) {
    command_line_ += std::string(" ") + argv[i];
    auto it = kShort.find(argv[i]);
    args.push_back(it != kShort.end() ? it->second : argv[i]);
  }
  auto usage_error = [&](const std::string& message) {
    return print ? cli::UsageError(program_, message) : cli::kExitUsage;
  };
  if (Status s = flags_->Parse(args); !s.ok()) return usage_error(Message(s));
  if (flags_->help_requested()) {
    if (print) std::printf("%s", flags_->Usage().c_str());
    return cli::kExitOk;
  }
  if (features_.sweep) {
    StatusOr<int64_t> lo = ParseBytes(min_text_), hi = ParseBytes(max_text_);
    if (!lo.ok()) return usage_error("--minbytes: " + Message(lo.status()));
    if (!hi.ok()) return usage_error("--maxbytes: " + Message(hi.status()));
    options_.min_bytes = *lo;
    options_.max_bytes = *hi;
    if (*lo <= 0 || *hi < *lo) {
      return usage_error(
          StrCat("--minbytes=", *lo, " and --maxbytes=", *hi, " need 0 < minbytes <= maxbytes"));
    }
    if (options_.step_factor < 1) {
      return usage_error(StrCat("--stepfactor=", options_.step_factor, " must be >= 1"));
    }
  }
  if (features_.dtype) {
    StatusOr<DType> dtype = ParseBenchDType(dtype_text_);
    if (!dtype.ok()) return usage_error(Message(dtype.status()));
    options_.dtype = *dtype;
  }
  if (options_.iters < 1) return usage_error(StrCat("--iters=", options_.iters, " must be >= 1"));
  if (options_.warmup < 0) {
    return usage_error(StrCat("--warmup_iters=", options_.warmup, " must be >= 0"));
  }
  if (options_.check != 0 && options_.check != 1) {
    return usage_error(StrCat("--check=", options_.check, " must be 0 or 1"));
  }
  if (options_.device == "cuda") {
    return usage_error(
        "--device cuda needs the CUDA backend and a GPU, which this build "
        "does not have yet; use --device cpu (host buffers over MPI)");
  }
  if (options_.device != "cpu") {
    return usage_error("--device must be cpu or cuda, got \"" + options_.device + "\"");
  }
  if (options_.threads < 0) {
    return usage_error(StrCat("--threads=", options_.threads, " must be >= 0"));
  }
  if (options_.threads > 0) SetComputeThreads(options_.threads);
  world_ = dist::WorldCommunicator();
  if (print) {
    std::printf(
        "# %s: %d rank(s), %d OpenBLAS thread(s) per rank, iters %d, warmup %d, "
        "check %d\n# command: %s\n#\n",
        program_.c_str(), world_->size(), ComputeThreads(), options_.iters, options_.warmup,
        options_.check, command_line_.c_str());
    std::fflush(stdout);
  }
  return std::nullopt;
}

int Harness::Fail(const std::string& message) {
  return printing() ? cli::UsageError(program_, message) : cli::kExitUsage;
}

void Harness::Printf(const char* format, ...) {
  if (!printing()) return;
  va_list args;
  va_start(args, format);
  std::vprintf(format, args);
  va_end(args);
  std::fflush(stdout);
}

std::vector<int64_t> Harness::Sizes() const {
  std::vector<int64_t> sizes;
  for (int64_t s = options_.min_bytes; s <= options_.max_bytes; s *= options_.step_factor) {
    sizes.push_back(s);
    if (options_.step_factor <= 1) break;
  }
  return sizes;
}

Table Harness::StandardTable(std::vector<Column> left, std::vector<Column> right) const {
  std::vector<Column> head = {
      {"size", "(B)", 12, 0}, {"count", "(elements)", 12, 0}, {"type", "", 8, 0}};
  for (Column& c : left) head.push_back(std::move(c));
  std::vector<Column> timing = {{"time", "(us)", 10, 1},
                                {"algbw", "(GB/s)", 7, 2},
                                {"busbw", "(GB/s)", 7, 2},
                                {"#wrong", "", 6, 0}};
  return Table({std::move(head), std::move(timing), std::move(right)}, printing());
}

std::vector<double> Harness::TimeInterleaved(const std::vector<std::function<void()>>& ops,
                                             int blocks) {
  const int iters = options_.iters;
  blocks = std::clamp(blocks, 1, iters);
  for (const auto& op : ops) {
    for (int i = 0; i < options_.warmup; ++i) op();
  }
  // (op, block) mean seconds per call on this rank, then the slowest rank's.
  const int64_t nops = static_cast<int64_t>(ops.size());
  Tensor per_block = Tensor::Zeros({nops * blocks}, DType::kF32);
  float* s = per_block.data<float>();
  for (int b = 0; b < blocks; ++b) {
    // Block b runs iterations [b * iters / blocks, (b + 1) * iters / blocks).
    const int n = (b + 1) * iters / blocks - b * iters / blocks;
    for (int64_t o = 0; o < nops; ++o) {
      world_->Barrier();
      const double t0 = Now();
      for (int i = 0; i < n; ++i) ops[o]();
      s[o * blocks + b] = static_cast<float>((Now() - t0) / n);
    }
  }
  world_->AllReduce(per_block, dist::ReduceOp::kMax);
  std::vector<double> seconds(nops);
  for (int64_t o = 0; o < nops; ++o) {
    std::vector<float> v(s + o * blocks, s + (o + 1) * blocks);
    std::sort(v.begin(), v.end());
    seconds[o] = blocks % 2 ? v[blocks / 2] : 0.5 * (double(v[blocks / 2 - 1]) + v[blocks / 2]);
  }
  return seconds;
}

double Harness::Time(const std::function<void()>& op) { return TimeInterleaved({op})[0]; }

void Harness::Repeat(const std::function<void(bool timed)>& call) {
  for (int i = 0; i < options_.warmup + options_.iters; ++i) {
    world_->Barrier();
    call(i >= options_.warmup);
  }
}

int64_t Harness::Check(const std::function<int64_t()>& count) {
  return options_.check ? Sum(count()) : 0;
}

double Harness::Max(double v) {
  Tensor t = Tensor::FromVector(std::vector<float>{static_cast<float>(v)}, {1});
  world_->AllReduce(t, dist::ReduceOp::kMax);
  return t.data<float>()[0];
}

double Harness::MedianOfMax(const std::vector<double>& per_iter) {
  SY_CHECK(!per_iter.empty()) << "MedianOfMax of no iterations";
  std::vector<float> v(per_iter.begin(), per_iter.end());
  Tensor t = Tensor::FromVector(v, {static_cast<int64_t>(v.size())});
  world_->AllReduce(t, dist::ReduceOp::kMax);
  v = t.ToVector<float>();
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (double(v[n / 2 - 1]) + v[n / 2]);
}

double Harness::Sum(double v) {
  Tensor t = Tensor::FromVector(std::vector<float>{static_cast<float>(v)}, {1});
  world_->AllReduce(t, dist::ReduceOp::kSum);
  return t.data<float>()[0];
}

int64_t Harness::Sum(int64_t v) {
  Tensor t = Tensor::FromVector(std::vector<int64_t>{v}, {1});
  world_->AllReduce(t, dist::ReduceOp::kSum);
  return t.data<int64_t>()[0];
}

int Harness::Finish(const Table& table, int64_t wrong, nlohmann::json extra) {
  const bool has_busbw = std::any_of(table.columns().begin(), table.columns().end(),
                                     [](const Column& c) { return c.name == "busbw"; });
  const double avg_busbw = has_busbw ? table.Mean("busbw") : 0.0;
  if (printing()) {
    std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(wrong),
                wrong == 0 ? "OK" : "FAILED");
    if (has_busbw) std::printf("# Avg bus bandwidth    : %g \n", avg_busbw);
    std::printf("#\n");
    std::fflush(stdout);
  }
  if (!options_.json.empty() && printing()) {
    nlohmann::json j = {{"benchmark", program_},   {"command", command_line_},
                        {"ranks", ranks()},        {"threads", ComputeThreads()},
                        {"iters", options_.iters}, {"warmup_iters", options_.warmup},
                        {"check", options_.check}, {"device", options_.device}};
    if (features_.sweep) {
      j["minbytes"] = options_.min_bytes;
      j["maxbytes"] = options_.max_bytes;
      j["stepfactor"] = options_.step_factor;
    }
    if (features_.dtype) j["datatype"] = BenchDTypeName(options_.dtype);
    nlohmann::json columns = nlohmann::json::array();
    for (const Column& c : table.columns()) columns.push_back({{"name", c.name}, {"unit", c.unit}});
    j["columns"] = columns;
    j["rows"] = table.Rows();
    if (has_busbw) j["avg_busbw_GBps"] = avg_busbw;
    j["wrong"] = wrong;
    j["ok"] = wrong == 0;
    for (auto& [key, value] : extra.items()) j[key] = value;
    std::ofstream out(options_.json);
    out << j.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "%s: error: cannot write %s\n", program_.c_str(), options_.json.c_str());
      return cli::kExitFailure;
    }
  }
  return wrong == 0 ? cli::kExitOk : cli::kExitFailure;
}

// ---- the sgemm peak -----------------------------------------------------------------------


std::function<void()> MakeSgemmOp(int64_t n) {
  auto buffers = std::make_shared<std::vector<float>>(3 * n * n, 0.0f);
  float* p = buffers->data();
  for (int64_t i = 0; i < 2 * n * n; ++i) p[i] = static_cast<float>((i * 7) % 13) * 0.01f;
  return [buffers, n] {
    float* a = buffers->data();
    kernels::cpu::Sgemm(false, false, n, n, n, 1.0f, a, n, a + n * n, n, 0.0f, a + 2 * n * n, n);
  };
}

}  // namespace switchyard::bench
