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
#include <mpi.h>

#include <cstring>

#include "benchmarks/harness.h"
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

int Main(int argc, char** argv) {
  Harness h("alltoall_perf",
            "All-to-all of host buffers: our MPI Communicator beside raw MPI on the same bytes.",
            {.sweep = true, .dtype = true});
  std::string skew_text, hot_share_text = "0.75", op = "all";
  int hot = 0, experts = 0, hidden = 1024, seed = 1, async = 0;
  h.flags().AddInt("hidden", &hidden, "elements per row (a token's hidden vector; default 1024)");
  h.flags().AddString("skew", &skew_text, "uneven split: expert e gets a share ~ 1/(e+1)^s (Zipf)");
  h.flags().AddInt("hot", &hot, "1: expert 0 gets --hot_share of the tokens (uneven split)");
  h.flags().AddString("hot_share", &hot_share_text, "the hot expert's share (default 0.75)");
  h.flags().AddInt("experts", &experts, "experts, a multiple of the ranks (default: the ranks)");
  h.flags().AddInt("seed", &seed, "seed of the uneven splits (default 1)");
  h.flags().AddString("op", &op, "all, alltoall (uniform only) or alltoallv (default all)");
  h.flags().AddInt("async", &async, "1: our side uses AllToAllVAsync + Wait");
  if (auto code = h.Start(argc, argv)) return *code;

  auto comm = dist::MpiCommunicator::Duplicate(MPI_COMM_WORLD);
  const int n = comm->size(), me = comm->rank();
  if (experts == 0) experts = n;
  if (hidden < 1) return h.Fail(StrCat("--hidden=", hidden, " must be >= 1"));
  if (experts < 1 || experts % n != 0) {
    return h.Fail(
        StrCat("--experts=", experts, " must be a positive multiple of the ", n, " ranks"));
  }
  StatusOr<RoutingSpec> spec = RoutingSpecFromFlags(skew_text, hot, hot_share_text, experts, seed);
  if (!spec.ok()) return h.Fail(Message(spec.status()));
  const bool uniform = spec->kind == RoutingSpec::Kind::kUniform;
  if (op != "all" && op != "alltoall" && op != "alltoallv") {
    return h.Fail("--op must be all, alltoall or alltoallv, got \"" + op + "\"");
  }
  if (op == "alltoall" && !uniform) return h.Fail("--op alltoall needs a uniform split");
  std::vector<std::string> ops;
  if (uniform && op != "alltoallv") ops.push_back("alltoall");
  if (op != "alltoall") ops.push_back("alltoallv");

  const DType dtype = h.options().dtype;
  const int64_t row_bytes = hidden * static_cast<int64_t>(SizeOf(dtype));
  const MPI_Datatype type = MpiType(dtype);
  Table table =
      h.StandardTable({{"split", "", 9, 0}, {"op", "", 9, 0}}, {{"mpi_time", "(us)", 10, 1},
                                                                {"mpi_busbw", "(GB/s)", 9, 2},
                                                                {"ratio", "ours/mpi", 8, 3},
                                                                {"recv_imb", "max/mean", 8, 2}});
  if (h.printing()) {
    std::printf(
        "# split %s over %d experts, rows of %d elements; ours = Communicator::%s, "
        "mpi = raw MPI on the same buffers\n#\n",
        spec->Name().c_str(), experts, hidden, async ? "AllToAllVAsync" : "AllToAll(V)");
  }
  table.PrintHeader();
  int64_t total_wrong = 0;
  for (int64_t size : h.Sizes()) {
    int64_t rows = size / row_bytes;
    if (uniform) rows -= rows % n;
    if (rows == 0) {
      if (h.printing())
        std::printf("# %lld B: less than one %lld-byte row per rank, skipped\n",
                    static_cast<long long>(size), static_cast<long long>(row_bytes));
      continue;
    }
    const std::vector<int64_t> send = PerRank(DrawRowsPerExpert(*spec, rows, me), n);
    Tensor send_t = Tensor::FromVector(send, {n, 1}), recv_t = Tensor::Empty({n, 1}, DType::kI64);
    comm->AllToAll(send_t, recv_t);
    const std::vector<int64_t> recv = recv_t.ToVector<int64_t>();
    int64_t recv_rows = 0;
    for (int64_t r : recv) recv_rows += r;
    Tensor in = Tensor::Empty({rows, hidden}, dtype),
           out = Tensor::Empty({recv_rows, hidden}, dtype);
    RunPattern(in, send, me, /*sending=*/true, /*check=*/false);
    // Raw MPI counts and displacements in elements, as a plain MPI program would pass them.
    std::vector<int> sc(n), sd(n), rc(n), rd(n);
    for (int p = 0, so = 0, ro = 0; p < n; ++p) {
      sc[p] = static_cast<int>(send[p] * hidden), rc[p] = static_cast<int>(recv[p] * hidden);
      sd[p] = so, rd[p] = ro, so += sc[p], ro += rc[p];
    }
    const double imbalance = h.Max(double(recv_rows)) / (h.Sum(double(recv_rows)) / n);

    for (const std::string& name : ops) {
      std::function<void()> ours, raw;
      if (name == "alltoall") {
        ours = [&] { comm->AllToAll(in, out); };
        raw = [&] {
          SY_MPI_CHECK(
              MPI_Alltoall(in.raw_data(), sc[0], type, out.raw_data(), rc[0], type, comm->comm()));
        };
      } else {
        ours = [&] {
          if (async) {
            comm->AllToAllVAsync(in, send, out, recv)->Wait();
          } else {
            comm->AllToAllV(in, send, out, recv);
          }
        };
        raw = [&] {
          SY_MPI_CHECK(MPI_Alltoallv(in.raw_data(), sc.data(), sd.data(), type, out.raw_data(),
                                     rc.data(), rd.data(), type, comm->comm()));
        };
      }
      const std::vector<double> t = h.TimeInterleaved({ours, raw});
      int64_t wrong = 0;
      if (h.options().check) {
        for (const auto* call : {&ours, &raw}) {
          std::memset(out.raw_data(), 0xff, out.nbytes());
          (*call)();
          wrong += RunPattern(out, recv, me, /*sending=*/false, /*check=*/true);
        }
      }
      wrong = h.Sum(wrong);
      total_wrong += wrong;
      const double bytes = double(rows * row_bytes), factor = double(n - 1) / n;
      const double algbw = bytes / t[0] / 1e9, mpi_algbw = bytes / t[1] / 1e9;
      table.AddRow({rows * row_bytes, rows * hidden, BenchDTypeName(dtype), spec->Name(), name,
                    t[0] * 1e6, algbw, algbw * factor, wrong, t[1] * 1e6, mpi_algbw * factor,
                    t[0] / t[1], imbalance});
    }
  }
  return h.Finish(table, total_wrong,
                  {{"split", spec->Name()},
                   {"experts", experts},
                   {"hidden", hidden},
                   {"async", async},
                   {"busbw_factor", "(n-1)/n"}});
}

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) { return switchyard::bench::Main(argc, argv); }
