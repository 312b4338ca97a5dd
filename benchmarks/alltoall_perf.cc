// alltoall_perf: all-to-all of host buffers through our MPI Communicator (AllToAll for
// uniform splits, AllToAllV for any), with the raw MPI_Alltoall / MPI_Alltoallv on the
// same buffers timed in the same run as the baseline. Splits are uniform (nccl-tests) or
// MoE-like (benchmarks/routing.h: --skew s, --hot 1): rows of --hidden elements, each a
// token sent to the rank that holds its expert.
//
//   size   bytes this rank sends (every rank sends the same amount; with a skew it
//          receives unevenly), count = size / sizeof(type)
//   algbw  size / time;   busbw = algbw * (n - 1) / n   (nccl-tests' all-to-all factor)
//   ratio  our time / raw MPI time on the same bytes (1.00: no overhead)
//
// The hierarchical column (moe.dispatcher=hierarchical; benchmarks/alltoall_hier.h): the
// same exchange through dist::HierarchicalCommunicator over nodes of --ranks_per_node ranks
// (default: as launched), timed in the same run, and each rank's inter-node bytes and
// messages, flat and hierarchical, measured beside the formula (the largest over ranks);
// a rank whose measured traffic differs from its formula counts in #wrong.
#include <mpi.h>

#include <cstring>

#include "benchmarks/alltoall_hier.h"
#include "benchmarks/benchmark.h"
#include "benchmarks/routing.h"
#include "engine/dist/mpi_check.h"
#include "engine/dist/mpi_communicator.h"

namespace switchyard::bench {
namespace {

MPI_Datatype MpiType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kI64:
      return MPI_INT64_T;
    case DType::kU8:
      return MPI_UINT8_T;
    case DType::kF64:
      return MPI_DOUBLE;
    case DType::kBF16:
    case DType::kF16:
      return MPI_UINT16_T;
  }
  return MPI_DATATYPE_NULL;
}

// The bits of the small integer v (< 256, exact in every dtype) in `dtype`.
uint64_t Encode(DType dtype, int v) {
  const float f = static_cast<float>(v);
  uint32_t u = 0;
  switch (dtype) {
    case DType::kF32:
      std::memcpy(&u, &f, 4);
      return u;
    case DType::kBF16:
      return BFloat16::FromFloat(f);
    case DType::kF16: {  // exact for integers below 2048
      if (v == 0) return 0;
      int e = 0;
      while ((v >> (e + 1)) != 0) ++e;
      return static_cast<uint64_t>((e + 15) << 10 | ((v << (10 - e)) & 0x3ff));
    }
    default:
      return static_cast<uint64_t>(v);
  }
}

// Element i of row j of the block that rank `src` sends rank `dst`.
int Value(int src, int dst, int64_t j, int64_t i) {
  return static_cast<int>((src * 7 + dst * 13 + j * 3 + i) % 251);
}

// Writes (check = false) or counts the mismatches of (check = true) the pattern in t:
// consecutive blocks of rows[p] rows for peers p = 0, 1, ...; `sending` says whether this
// rank is the block's source (input) or destination (output).
template <typename T>
int64_t Pattern(Tensor& t, const std::vector<int64_t>& rows, int me, bool sending, bool check) {
  const DType dtype = t.dtype();
  T lut[251];
  for (int v = 0; v < 251; ++v) lut[v] = static_cast<T>(Encode(dtype, v));
  T* p = static_cast<T*>(t.raw_data());
  const int64_t h = t.row_size();
  int64_t wrong = 0;
  for (size_t peer = 0; peer < rows.size(); ++peer) {
    const int src = sending ? me : static_cast<int>(peer),
              dst = sending ? static_cast<int>(peer) : me;
    for (int64_t j = 0; j < rows[peer]; ++j, p += h) {
      for (int64_t i = 0; i < h; ++i) {
        const T want = lut[Value(src, dst, j, i)];
        if (check) {
          wrong += p[i] != want;
        } else {
          p[i] = want;
        }
      }
    }
  }
  return wrong;
}

int64_t RunPattern(Tensor& t, const std::vector<int64_t>& rows, int me, bool sending, bool check) {
  switch (SizeOf(t.dtype())) {
    case 1:
      return Pattern<uint8_t>(t, rows, me, sending, check);
    case 2:
      return Pattern<uint16_t>(t, rows, me, sending, check);
    case 4:
      return Pattern<uint32_t>(t, rows, me, sending, check);
    default:
      return Pattern<uint64_t>(t, rows, me, sending, check);
  }
}

// One size's exchange: the buffers, the rows to and from every peer, and the raw MPI
// counts and displacements in elements, as a plain MPI program would pass them.
struct Exchange {
  std::vector<int64_t> send, recv;
  Tensor in, out;
  ElementSplits s, r;
  double imbalance = 1;  // most rows any rank receives / the mean
};

class AllToAllPerf final : public Benchmark {
 public:
  void AddFlags(cli::FlagSet& flags) override {
    flags.AddInt("hidden", &hidden_, "elements per row (a token's hidden vector; default 1024)");
    flags.AddString("skew", &skew_text_, "uneven split: expert e gets a share ~ 1/(e+1)^s (Zipf)");
    flags.AddInt("hot", &hot_, "1: expert 0 gets --hot_share of the tokens (uneven split)");
    flags.AddString("hot_share", &hot_share_text_, "the hot expert's share (default 0.75)");
    flags.AddInt("experts", &experts_, "experts, a multiple of the ranks (default: the ranks)");
    flags.AddInt("seed", &seed_, "seed of the uneven splits (default 1)");
    flags.AddString("op", &op_, "all, alltoall (uniform only) or alltoallv (default all)");
    flags.AddInt("async", &async_, "1: our side uses AllToAllVAsync + Wait");
    flags.AddInt("ranks_per_node", &ranks_per_node_,
                 "nodes for the hierarchical column, ranks in blocks (default: as launched)");
  }

  Status Setup(Harness& h) override {
    comm_ = dist::MpiCommunicator::Duplicate(MPI_COMM_WORLD);
    const int n = comm_->size();
    if (experts_ == 0) experts_ = n;
    if (hidden_ < 1) return InvalidArgument("--hidden=", hidden_, " must be >= 1");
    if (experts_ < 1 || experts_ % n != 0) {
      return InvalidArgument("--experts=", experts_, " must be a positive multiple of the ", n,
                             " ranks");
    }
    StatusOr<RoutingSpec> spec =
        RoutingSpecFromFlags(skew_text_, hot_, hot_share_text_, experts_, seed_);
    if (!spec.ok()) return spec.status();
    spec_ = *spec;
    const bool uniform = spec_.kind == RoutingSpec::Kind::kUniform;
    if (op_ != "all" && op_ != "alltoall" && op_ != "alltoallv") {
      return InvalidArgument("--op must be all, alltoall or alltoallv, got \"", op_, "\"");
    }
    if (op_ == "alltoall" && !uniform) return InvalidArgument("--op alltoall needs a uniform split");
    if (uniform && op_ != "alltoallv") ops_.push_back("alltoall");
    if (op_ != "alltoall") ops_.push_back("alltoallv");
    StatusOr<std::unique_ptr<HierarchicalAllToAll>> hier = HierarchicalAllToAll::Create(ranks_per_node_);
    if (!hier.ok()) return hier.status();
    hier_ = *std::move(hier);
    dtype_ = h.options().dtype;
    row_bytes_ = hidden_ * static_cast<int64_t>(SizeOf(dtype_));
    sizes_ = h.Sizes();
    h.Printf(
        "# split %s over %d experts, rows of %d elements; ours = Communicator::%s, "
        "mpi = raw MPI on the same buffers\n#\n",
        spec_.Name().c_str(), experts_, hidden_, async_ ? "AllToAllVAsync" : "AllToAll(V)");
    h.Printf("# hier = the hierarchical all-to-all over %d nodes of %d ranks; inter-node bytes "
             "and messages per rank (max over ranks): measured flat | hier, beside the formula\n#\n",
             hier_->layout().nodes, hier_->layout().per_node);
    return OkStatus();
  }

  Table MakeTable(Harness& h) override {
    return h.StandardTable({{"split", "", 9, 0}, {"op", "", 9, 0}},
                           {{"mpi_time", "(us)", 10, 1},
                            {"mpi_busbw", "(GB/s)", 9, 2},
                            {"ratio", "ours/mpi", 8, 3},
                            {"recv_imb", "max/mean", 8, 2},
                            {"hier_time", "(us)", 10, 1},
                            {"hier_ratio", "hier/ours", 9, 3},
                            {"flat_inter_B", "measured", 12, 0},
                            {"flat_B_formula", "formula", 12, 0},
                            {"hier_inter_B", "measured", 12, 0},
                            {"hier_B_formula", "formula", 12, 0},
                            {"flat_msgs", "measured", 9, 0},
                            {"flat_msgs_f", "formula", 9, 0},
                            {"hier_msgs", "measured", 9, 0},
                            {"hier_msgs_f", "formula", 9, 0}});
  }

  int NumCases() const override { return static_cast<int>(sizes_.size()); }

  // One size: every op of --op, ours beside raw MPI.
  StatusOr<int64_t> RunCase(Harness& h, int index, Table& table) override {
    const int64_t size = sizes_[index];
    int64_t rows = size / row_bytes_;
    if (spec_.kind == RoutingSpec::Kind::kUniform) rows -= rows % comm_->size();
    if (rows == 0) {
      h.Printf("# %lld B: less than one %lld-byte row per rank, skipped\n",
               static_cast<long long>(size), static_cast<long long>(row_bytes_));
      return 0;
    }
    Exchange x = MakeExchange(h, rows);
    int64_t wrong = 0;
    for (const std::string& name : ops_) wrong += Measure(h, x, name, rows, table);
    return wrong;
  }

  nlohmann::json Extra(const Harness& h) const override {
    return {{"split", spec_.Name()},
            {"experts", experts_},
            {"hidden", hidden_},
            {"async", async_},
            {"nodes", hier_->layout().nodes},
            {"ranks_per_node", hier_->layout().per_node},
            {"busbw_factor", "(n-1)/n"}};
  }

 private:
  // The rows this rank sends each peer (drawn), those it receives (exchanged), and the
  // buffers, the input filled with the pattern.
  Exchange MakeExchange(Harness& h, int64_t rows) {
    const int n = comm_->size(), me = comm_->rank();
    Exchange x;
    x.send = PerRank(DrawRowsPerExpert(spec_, rows, me), n);
    Tensor send_t = Tensor::FromVector(x.send, {n, 1}), recv_t = Tensor::Empty({n, 1}, DType::kI64);
    comm_->AllToAll(send_t, recv_t);
    x.recv = recv_t.ToVector<int64_t>();
    int64_t recv_rows = 0;
    for (int64_t r : x.recv) recv_rows += r;
    x.in = Tensor::Empty({rows, hidden_}, dtype_);
    x.out = Tensor::Empty({recv_rows, hidden_}, dtype_);
    RunPattern(x.in, x.send, me, /*sending=*/true, /*check=*/false);
    x.s = ToElementSplits(x.send, hidden_);
    x.r = ToElementSplits(x.recv, hidden_);
    x.imbalance = h.Max(double(recv_rows)) / (h.Sum(double(recv_rows)) / n);
    return x;
  }

  // Times `name` (alltoall or alltoallv) ours beside raw MPI, checks both, adds the row;
  // returns #wrong summed over ranks.
  int64_t Measure(Harness& h, Exchange& x, const std::string& name, int64_t rows, Table& table) {
    const MPI_Datatype type = MpiType(dtype_);
    std::function<void()> ours, raw, hier;
    if (name == "alltoall") {
      ours = [&] { comm_->AllToAll(x.in, x.out); };
      hier = [&] { hier_->hier().AllToAll(x.in, x.out); };
      raw = [&] {
        SY_MPI_CHECK(MPI_Alltoall(x.in.raw_data(), x.s.counts[0], type, x.out.raw_data(),
                                  x.r.counts[0], type, comm_->comm()));
      };
    } else {
      ours = [&] {
        if (async_) {
          comm_->AllToAllVAsync(x.in, x.send, x.out, x.recv)->Wait();
        } else {
          comm_->AllToAllV(x.in, x.send, x.out, x.recv);
        }
      };
      hier = [&] { hier_->hier().AllToAllV(x.in, x.send, x.out, x.recv); };
      raw = [&] {
        SY_MPI_CHECK(MPI_Alltoallv(x.in.raw_data(), x.s.counts.data(), x.s.displs.data(), type,
                                   x.out.raw_data(), x.r.counts.data(), x.r.displs.data(), type,
                                   comm_->comm()));
      };
    }
    const std::vector<double> t = h.TimeInterleaved({ours, raw, hier});
    const InterNodeTraffic traffic =
        hier_->Measure(x.in, x.send, x.out, x.recv, /*uniform=*/name == "alltoall");
    const bool off = !(traffic.flat == traffic.flat_formula && traffic.hier == traffic.hier_formula);
    const int64_t wrong = h.Check([&] {
      int64_t bad = off;
      for (const auto* call : {&ours, &raw, &hier}) {
        std::memset(x.out.raw_data(), 0xff, x.out.nbytes());
        (*call)();
        bad += RunPattern(x.out, x.recv, comm_->rank(), /*sending=*/false, /*check=*/true);
      }
      return bad;
    });
    const int n = comm_->size();
    const double bytes = double(rows * row_bytes_), factor = double(n - 1) / n;
    const double algbw = bytes / t[0] / 1e9, mpi_algbw = bytes / t[1] / 1e9;
    auto max = [&](int64_t v) { return static_cast<int64_t>(h.Max(static_cast<double>(v))); };
    table.AddRow({rows * row_bytes_, rows * hidden_, BenchDTypeName(dtype_), spec_.Name(), name,
                  t[0] * 1e6, algbw, algbw * factor, wrong, t[1] * 1e6, mpi_algbw * factor,
                  t[0] / t[1], x.imbalance, t[2] * 1e6, t[2] / t[0],
                  max(traffic.flat.bytes), max(traffic.flat_formula.bytes),
                  max(traffic.hier.bytes), max(traffic.hier_formula.bytes),
                  max(traffic.flat.messages), max(traffic.flat_formula.messages),
                  max(traffic.hier.messages), max(traffic.hier_formula.messages)});
    return wrong;
  }

  std::string skew_text_, hot_share_text_ = "0.75", op_ = "all";
  int hot_ = 0, experts_ = 0, hidden_ = 1024, seed_ = 1, async_ = 0, ranks_per_node_ = 0;
  std::unique_ptr<HierarchicalAllToAll> hier_;
  std::unique_ptr<dist::MpiCommunicator> comm_;
  RoutingSpec spec_;
  std::vector<std::string> ops_;
  DType dtype_ = DType::kF32;
  int64_t row_bytes_ = 0;
  std::vector<int64_t> sizes_;
};

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) {
  return switchyard::bench::RunBenchmark<switchyard::bench::AllToAllPerf>(
      argc, argv, "alltoall_perf",
      "All-to-all of host buffers: our MPI Communicator beside raw MPI on the same bytes.",
      {.sweep = true, .dtype = true});
}
