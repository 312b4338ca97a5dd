// cp_attention_perf: ring attention for context parallelism (dense/ring_attention.h), cp =
// the world (launch with mpirun -np 1, 2, 4; scripts/bench_cp.sh runs all three and merges
// their JSON). For each sequence length S (B sequences, Hq query and Hkv key/value heads of
// width hd; each rank's two chunks of Sc = S / (2c) positions as in
// engine/parallel/context_parallel.h):
//
//   (a) time: RingAttentionForward and RingAttentionBackward on this rank's shards, each
//       repetition started together (a barrier), the median over -n repetitions after -w
//       warm-ups; the table shows the slowest rank's median. `wait` is the part of it spent
//       inside the communicator (posting and waiting for the ring's hops, timed by a
//       wrapper around the cp communicator), `compute` = total - wait;
//   (b) balance: slowest / fastest rank's median total (`balance`) and compute (`cbal`);
//       zigzag chunks give every rank S (S + 1) / (2c) pairs per sequence and head, where
//       contiguous chunks would give the last rank 2c - 1 times the first one's;
//   (c) bytes: what the rank sent (a dist::CountingCommunicator under the timer), beside
//       the analytic volume: (c-1)/c of the whole sequence's k + v bytes per ring pass,
//       one pass forward (k, v) and two backward (k, v, then dk, dv).
//
// `whole` (c = 1 only): plain kernels::AttentionForward + AttentionBackward on the whole
// sequence, the reference the ring replaces (it computes the full S x S scores; the ring
// at c = 1 computes two diagonal blocks and one full block of (S/2)^2).
//
// #wrong counts rows whose bytes differ from the analytic volume or from what
// RingAttentionStats reports, or whose pairs are not the whole count / c on every rank.
// Timings are never checked: with more ranks than cores they measure the scheduler too.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/benchmark.h"
#include "benchmarks/wait_timing_communicator.h"
#include "dense/ring_attention.h"
#include "engine/core/philox.h"
#include "engine/dist/counting_communicator.h"
#include "kernels/attention.h"
#include "kernels/random.h"

namespace switchyard::bench {
namespace {

Tensor Uniform(const Shape& shape, uint64_t stream) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  kernels::FillUniform(t, RngKey{14, stream}, 0, -1.0f, 1.0f);
  return t;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// One sequence length's shards: this rank's q, k, v and dout, and the outputs.
struct Shards {
  Tensor q, k, v, dout, out, lse, dq, dk, dv;
};

class CpAttentionPerf final : public Benchmark {
 public:
  void AddFlags(cli::FlagSet& flags) override {
    flags.AddString("seq_lens", &seq_lens_, "comma-separated sequence lengths S (multiples of 2 cp)");
    flags.AddInt("batch", &batch_, "sequences B");
    flags.AddInt("heads", &hq_, "query heads Hq");
    flags.AddInt("kv_heads", &hkv_, "key/value heads Hkv (divides Hq)");
    flags.AddInt("head_dim", &hd_, "head width hd");
  }

  Status Setup(Harness& h) override {
    c_ = h.ranks();
    for (const std::string& text : SplitList(seq_lens_)) lens_.push_back(std::stoll(text));
    for (int64_t s : lens_) {
      if (s <= 0 || s % (2 * c_) != 0) {
        return InvalidArgument("--seq_lens: ", s, " is not a positive multiple of 2 cp = ", 2 * c_);
      }
    }
    if (batch_ < 1 || hq_ < 1 || hkv_ < 1 || hq_ % hkv_ != 0 || hd_ < 1) {
      return InvalidArgument(
          "--batch, --heads, --kv_heads, --head_dim: need B, Hq, Hkv, hd >= 1 and Hkv | Hq");
    }
    std::vector<int> all(c_);
    for (int r = 0; r < c_; ++r) all[r] = r;
    counting_ = std::make_unique<dist::CountingCommunicator>(h.world().Split({all}));
    cp_ = std::make_unique<WaitTimingCommunicator>(*counting_);
    return OkStatus();
  }

  Table MakeTable(Harness& h) override {
    return Table(
        {{{"seq", "", 6, 0}, {"Sc", "", 5, 0}},
         {{"fwd", "(ms)", 9, 2}, {"bwd", "(ms)", 9, 2}, {"total", "(ms)", 9, 2},
          {"wait", "(ms)", 8, 2}, {"compute", "(ms)", 9, 2}, {"balance", "max/min", 8, 3},
          {"cbal", "max/min", 8, 3}, {"whole", "(ms)", 9, 2}},
         {{"fwd_sent", "(B)", 11, 0}, {"fwd_vol", "(B)", 11, 0}, {"bwd_sent", "(B)", 11, 0},
          {"bwd_vol", "(B)", 11, 0}, {"pairs", "/rank", 12, 0}}},
        h.printing());
  }

  // One case per sequence length.
  int NumCases() const override { return static_cast<int>(lens_.size()); }

  StatusOr<int64_t> RunCase(Harness& h, int index, Table& table) override {
    const int64_t s = lens_[index], sc = s / (2 * c_);
    Shards x = MakeShards(sc, h.rank());
    dense::RingAttentionStats fwd_stats, bwd_stats;
    dist::TrafficCounters fwd_traffic, bwd_traffic;
    std::vector<double> fwd_s, bwd_s, wait_s, compute_s;
    h.Repeat([&](bool timed) {
      dense::RingAttentionStats fs, bs;
      cp_->Reset();
      counting_->ResetTraffic();
      const double t0 = Now();
      dense::RingAttentionForward(x.q, x.k, x.v, x.out, x.lse, *cp_, nullptr, &fs);
      const double t1 = Now();
      fwd_traffic = counting_->traffic();
      counting_->ResetTraffic();
      dense::RingAttentionBackward(x.q, x.k, x.v, x.out, x.lse, x.dout, x.dq, x.dk, x.dv, *cp_,
                                   nullptr, &bs);
      const double t2 = Now();
      bwd_traffic = counting_->traffic();
      fwd_stats = fs;
      bwd_stats = bs;
      if (!timed) return;
      fwd_s.push_back(t1 - t0);
      bwd_s.push_back(t2 - t1);
      wait_s.push_back(cp_->seconds());
      compute_s.push_back(t2 - t0 - cp_->seconds());
    });
    std::vector<double> total_s(fwd_s.size());
    for (size_t i = 0; i < total_s.size(); ++i) total_s[i] = fwd_s[i] + bwd_s[i];
    const double total = Median(total_s), compute = Median(compute_s);
    const double total_max = h.Max(total), total_min = -h.Max(-total);
    const double compute_max = h.Max(compute), compute_min = -h.Max(-compute);
    const Cell whole = c_ == 1 ? Cell(WholeMs(h, s)) : Cell(std::string("-"));

    // Bytes: (c-1)/c of the whole k + v per pass; stats must agree with the counter.
    const int64_t whole_kv = 2 * int64_t{batch_} * s * hkv_ * hd_ * static_cast<int64_t>(sizeof(float));
    const int64_t fwd_vol = whole_kv * (c_ - 1) / c_, bwd_vol = 2 * fwd_vol;
    const int64_t pairs_want = int64_t{batch_} * hq_ * s * (s + 1) / 2 / c_;
    int64_t bad = 0;
    bad += fwd_traffic.p2p_bytes != fwd_vol || fwd_stats.bytes_sent != fwd_vol;
    bad += bwd_traffic.p2p_bytes != bwd_vol || bwd_stats.bytes_sent != bwd_vol;
    bad += fwd_stats.pairs != pairs_want || bwd_stats.pairs != pairs_want;
    const int64_t wrong = h.Sum(bad);
    const double fwd_ms = 1e3 * h.MedianOfMax(fwd_s), bwd_ms = 1e3 * h.MedianOfMax(bwd_s);
    const double wait_ms = 1e3 * h.Max(Median(wait_s));
    table.AddRow({s, sc, fwd_ms, bwd_ms, 1e3 * total_max, wait_ms, 1e3 * compute_max,
                  total_min > 0 ? total_max / total_min : 0.0,
                  compute_min > 0 ? compute_max / compute_min : 0.0, whole,
                  fwd_traffic.p2p_bytes, fwd_vol, bwd_traffic.p2p_bytes, bwd_vol, fwd_stats.pairs});
    return wrong;
  }

  void Conclude(Harness& h, Table& table) override {
    h.Printf("# cp %d: B %d, Hq %d, Hkv %d, hd %d; times: slowest rank's median of %d reps\n", c_,
             batch_, hq_, hkv_, hd_, h.options().iters);
  }

  nlohmann::json Extra(const Harness& h) const override {
    return {{"cp", c_}, {"batch", batch_}, {"heads", hq_}, {"kv_heads", hkv_}, {"head_dim", hd_}};
  }

 private:
  // Random shards of Sc positions per chunk: every position's values are independent, so
  // any rank's may stand in.
  Shards MakeShards(int64_t sc, int rank) const {
    const Shape qs{2 * batch_, sc, hq_, hd_}, kvs{2 * batch_, sc, hkv_, hd_};
    Shards x;
    x.q = Uniform(qs, 10 + rank), x.k = Uniform(kvs, 20 + rank), x.v = Uniform(kvs, 30 + rank);
    x.dout = Uniform(qs, 40 + rank);
    x.out = Tensor::Empty(qs, DType::kF32), x.lse = Tensor::Empty({2 * batch_, hq_, sc}, DType::kF32);
    x.dq = Tensor::Empty(qs, DType::kF32), x.dk = Tensor::Empty(kvs, DType::kF32),
    x.dv = Tensor::Empty(kvs, DType::kF32);
    return x;
  }

  // The plain kernels on the whole sequence of length s (c = 1: one rank holds it all):
  // the median milliseconds of forward + backward.
  double WholeMs(Harness& h, int64_t s) const {
    const Shape wq{batch_, s, hq_, hd_}, wkv{batch_, s, hkv_, hd_};
    Tensor q = Uniform(wq, 50), k = Uniform(wkv, 51), v = Uniform(wkv, 52), dout = Uniform(wq, 53);
    Tensor out = Tensor::Empty(wq, DType::kF32), lse = Tensor::Empty({batch_, hq_, s}, DType::kF32);
    Tensor dq = Tensor::Empty(wq, DType::kF32), dk = Tensor::Empty(wkv, DType::kF32),
           dv = Tensor::Empty(wkv, DType::kF32);
    std::vector<double> times;
    h.Repeat([&](bool timed) {
      const double t0 = Now();
      kernels::AttentionForward(q, k, v, out, lse);
      kernels::AttentionBackward(q, k, v, lse, dout, dq, dk, dv);
      if (timed) times.push_back(Now() - t0);
    });
    return 1e3 * Median(times);
  }

  std::string seq_lens_ = "512,1024,2048,4096";
  int batch_ = 1, hq_ = 8, hkv_ = 2, hd_ = 64;
  int c_ = 1;
  std::vector<int64_t> lens_;
  std::unique_ptr<dist::CountingCommunicator> counting_;
  std::unique_ptr<WaitTimingCommunicator> cp_;
};

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) {
  return switchyard::bench::RunBenchmark<switchyard::bench::CpAttentionPerf>(
      argc, argv, "cp_attention_perf",
      "ring attention (context parallelism, cp = ranks): forward + backward time per "
      "rank, the ring's bytes beside the analytic volume, and the ranks' balance");
}
