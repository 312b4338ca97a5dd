// cp_attention_perf: ring attention for context parallelism (dense/ring_attention.h, issue
// 14), cp = the world (launch with mpirun -np 1, 2, 4; scripts/bench_cp.sh runs all three
// and merges their JSON). For each sequence length S (B sequences, Hq query and Hkv
// key/value heads of width hd; every rank holds chunks i and 2c-1-i, Sc = S / (2c)):
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

#include "benchmarks/harness.h"
#include "dense/ring_attention.h"
#include "engine/core/philox.h"
#include "engine/dist/counting_communicator.h"
#include "kernels/attention.h"
#include "kernels/random.h"

namespace switchyard::bench {
namespace {

// A Work whose Wait adds its seconds to a counter.
class TimedWork final : public dist::Work {
 public:
  TimedWork(std::unique_ptr<dist::Work> inner, double* seconds)
      : inner_(std::move(inner)), seconds_(seconds) {}
  void Wait() override {
    const double t0 = Now();
    inner_->Wait();
    *seconds_ += Now() - t0;
  }

 private:
  std::unique_ptr<dist::Work> inner_;
  double* seconds_;
};

// Forwards every call to `inner` and adds the seconds spent posting point-to-point ops and
// waiting for them to `seconds()`: the communication a ring step did not hide.
class WaitTimingCommunicator final : public dist::Communicator {
 public:
  explicit WaitTimingCommunicator(dist::Communicator& inner) : inner_(inner) {}
  double seconds() const { return seconds_; }
  void Reset() { seconds_ = 0; }

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::vector<int> world_ranks() const override { return inner_.world_ranks(); }
  Device device() const override { return inner_.device(); }
  std::string_view backend() const override { return inner_.backend(); }
  DeviceContext* context() const override { return inner_.context(); }
  void AllReduce(Tensor& t, dist::ReduceOp op) override { inner_.AllReduce(t, op); }
  void AllGather(const Tensor& in, Tensor& out) override { inner_.AllGather(in, out); }
  void ReduceScatter(const Tensor& in, Tensor& out, dist::ReduceOp op) override {
    inner_.ReduceScatter(in, out, op);
  }
  void AllToAll(const Tensor& in, Tensor& out) override { inner_.AllToAll(in, out); }
  void AllToAllV(const Tensor& in, std::span<const int64_t> send_rows, Tensor& out,
                 std::span<const int64_t> recv_rows) override {
    inner_.AllToAllV(in, send_rows, out, recv_rows);
  }
  void AllGatherV(const Tensor& in, Tensor& out, std::span<const int64_t> rows) override {
    inner_.AllGatherV(in, out, rows);
  }
  void ReduceScatterV(const Tensor& in, Tensor& out, std::span<const int64_t> rows,
                      dist::ReduceOp op) override {
    inner_.ReduceScatterV(in, out, rows, op);
  }
  void Broadcast(Tensor& t, int root) override { inner_.Broadcast(t, root); }
  void Send(const Tensor& t, int peer, int tag) override { Timed([&] { inner_.Send(t, peer, tag); }); }
  void Recv(Tensor& t, int peer, int tag) override { Timed([&] { inner_.Recv(t, peer, tag); }); }
  std::unique_ptr<dist::Work> SendAsync(const Tensor& t, int peer, int tag) override {
    return Wrap([&] { return inner_.SendAsync(t, peer, tag); });
  }
  std::unique_ptr<dist::Work> RecvAsync(Tensor& t, int peer, int tag) override {
    return Wrap([&] { return inner_.RecvAsync(t, peer, tag); });
  }
  std::unique_ptr<dist::Work> BatchSendRecv(std::span<const dist::P2POp> ops) override {
    return Wrap([&] { return inner_.BatchSendRecv(ops); });
  }
  void Barrier() override { inner_.Barrier(); }
  std::unique_ptr<dist::Work> AllReduceAsync(Tensor& t, dist::ReduceOp op) override {
    return inner_.AllReduceAsync(t, op);
  }
  std::unique_ptr<dist::Work> AllGatherAsync(const Tensor& in, Tensor& out) override {
    return inner_.AllGatherAsync(in, out);
  }
  std::unique_ptr<dist::Work> ReduceScatterAsync(const Tensor& in, Tensor& out,
                                                 dist::ReduceOp op) override {
    return inner_.ReduceScatterAsync(in, out, op);
  }
  std::unique_ptr<dist::Work> AllToAllVAsync(const Tensor& in, std::span<const int64_t> send_rows,
                                             Tensor& out,
                                             std::span<const int64_t> recv_rows) override {
    return inner_.AllToAllVAsync(in, send_rows, out, recv_rows);
  }
  std::unique_ptr<dist::Communicator> Split(const std::vector<std::vector<int>>& groups) override {
    return inner_.Split(groups);
  }

 private:
  template <typename F>
  void Timed(F f) {
    const double t0 = Now();
    f();
    seconds_ += Now() - t0;
  }
  template <typename F>
  std::unique_ptr<dist::Work> Wrap(F post) {
    const double t0 = Now();
    std::unique_ptr<dist::Work> work = post();
    seconds_ += Now() - t0;
    return std::make_unique<TimedWork>(std::move(work), &seconds_);
  }

  dist::Communicator& inner_;
  double seconds_ = 0;
};

// "a,b,c" -> integers.
std::vector<int64_t> ParseList(const std::string& text) {
  std::vector<int64_t> out;
  for (size_t s = 0; !text.empty() && s != std::string::npos;) {
    const size_t comma = text.find(',', s);
    out.push_back(std::stoll(text.substr(s, comma == std::string::npos ? comma : comma - s)));
    s = comma == std::string::npos ? comma : comma + 1;
  }
  return out;
}

Tensor Uniform(const Shape& shape, uint64_t stream) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  kernels::FillUniform(t, RngKey{14, stream}, 0, -1.0f, 1.0f);
  return t;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

int Main(int argc, char** argv) {
  Harness h("cp_attention_perf",
            "ring attention (context parallelism, cp = ranks): forward + backward time per "
            "rank, the ring's bytes beside the analytic volume, and the ranks' balance",
            {});
  std::string seq_lens = "512,1024,2048,4096";
  int batch = 1, hq = 8, hkv = 2, hd = 64;
  h.flags().AddString("seq_lens", &seq_lens, "comma-separated sequence lengths S (multiples of 2 cp)");
  h.flags().AddInt("batch", &batch, "sequences B");
  h.flags().AddInt("heads", &hq, "query heads Hq");
  h.flags().AddInt("kv_heads", &hkv, "key/value heads Hkv (divides Hq)");
  h.flags().AddInt("head_dim", &hd, "head width hd");
  if (auto code = h.Start(argc, argv)) return *code;
  const int c = h.ranks(), rank = h.rank();
  const std::vector<int64_t> lens = ParseList(seq_lens);
  for (int64_t s : lens) {
    if (s <= 0 || s % (2 * c) != 0) {
      return h.Fail("--seq_lens: " + std::to_string(s) + " is not a positive multiple of 2 cp = " +
                    std::to_string(2 * c));
    }
  }
  if (batch < 1 || hq < 1 || hkv < 1 || hq % hkv != 0 || hd < 1) {
    return h.Fail("--batch, --heads, --kv_heads, --head_dim: need B, Hq, Hkv, hd >= 1 and Hkv | Hq");
  }

  std::vector<int> all(c);
  for (int r = 0; r < c; ++r) all[r] = r;
  dist::CountingCommunicator counting(h.world().Split({all}));
  WaitTimingCommunicator cp(counting);

  Table table({{{"seq", "", 6, 0}, {"Sc", "", 5, 0}},
               {{"fwd", "(ms)", 9, 2}, {"bwd", "(ms)", 9, 2}, {"total", "(ms)", 9, 2},
                {"wait", "(ms)", 8, 2}, {"compute", "(ms)", 9, 2}, {"balance", "max/min", 8, 3},
                {"cbal", "max/min", 8, 3}, {"whole", "(ms)", 9, 2}},
               {{"fwd_sent", "(B)", 11, 0}, {"fwd_vol", "(B)", 11, 0}, {"bwd_sent", "(B)", 11, 0},
                {"bwd_vol", "(B)", 11, 0}, {"pairs", "/rank", 12, 0}}},
              h.printing());
  table.PrintHeader();
  int64_t wrong = 0;
  for (int64_t s : lens) {
    const int64_t sc = s / (2 * c);
    const Shape qs{2 * batch, sc, hq, hd}, kvs{2 * batch, sc, hkv, hd};
    // Random shards: every position's values are independent, so any rank's may stand in.
    Tensor q = Uniform(qs, 10 + rank), k = Uniform(kvs, 20 + rank), v = Uniform(kvs, 30 + rank);
    Tensor dout = Uniform(qs, 40 + rank);
    Tensor out = Tensor::Empty(qs, DType::kF32), lse = Tensor::Empty({2 * batch, hq, sc}, DType::kF32);
    Tensor dq = Tensor::Empty(qs, DType::kF32), dk = Tensor::Empty(kvs, DType::kF32),
           dv = Tensor::Empty(kvs, DType::kF32);

    dense::RingAttentionStats fwd_stats, bwd_stats;
    dist::TrafficCounters fwd_traffic, bwd_traffic;
    std::vector<double> fwd_s, bwd_s, wait_s, compute_s;
    const int reps = h.options().warmup + h.options().iters;
    for (int rep = 0; rep < reps; ++rep) {
      const bool timed = rep >= h.options().warmup;
      dense::RingAttentionStats fs, bs;
      cp.Barrier();
      cp.Reset();
      counting.ResetTraffic();
      const double t0 = Now();
      dense::RingAttentionForward(q, k, v, out, lse, cp, nullptr, &fs);
      const double t1 = Now();
      fwd_traffic = counting.traffic();
      counting.ResetTraffic();
      dense::RingAttentionBackward(q, k, v, out, lse, dout, dq, dk, dv, cp, nullptr, &bs);
      const double t2 = Now();
      bwd_traffic = counting.traffic();
      fwd_stats = fs;
      bwd_stats = bs;
      if (!timed) continue;
      fwd_s.push_back(t1 - t0);
      bwd_s.push_back(t2 - t1);
      wait_s.push_back(cp.seconds());
      compute_s.push_back(t2 - t0 - cp.seconds());
    }
    std::vector<double> total_s(fwd_s.size());
    for (size_t i = 0; i < total_s.size(); ++i) total_s[i] = fwd_s[i] + bwd_s[i];
    const double total = Median(total_s), compute = Median(compute_s);
    const double total_max = h.Max(total), total_min = -h.Max(-total);
    const double compute_max = h.Max(compute), compute_min = -h.Max(-compute);

    // The plain kernels on the whole sequence (c = 1: one rank holds it all).
    Cell whole = std::string("-");
    if (c == 1) {
      const Shape wq{batch, s, hq, hd}, wkv{batch, s, hkv, hd};
      Tensor wq_t = Uniform(wq, 50), wk = Uniform(wkv, 51), wv = Uniform(wkv, 52),
             wdo = Uniform(wq, 53);
      Tensor wo = Tensor::Empty(wq, DType::kF32), wl = Tensor::Empty({batch, hq, s}, DType::kF32);
      Tensor wdq = Tensor::Empty(wq, DType::kF32), wdk = Tensor::Empty(wkv, DType::kF32),
             wdv = Tensor::Empty(wkv, DType::kF32);
      std::vector<double> times;
      for (int rep = 0; rep < reps; ++rep) {
        const double t0 = Now();
        kernels::AttentionForward(wq_t, wk, wv, wo, wl);
        kernels::AttentionBackward(wq_t, wk, wv, wl, wdo, wdq, wdk, wdv);
        if (rep >= h.options().warmup) times.push_back(Now() - t0);
      }
      whole = 1e3 * Median(times);
    }

    // Bytes: (c-1)/c of the whole k + v per pass; stats must agree with the counter.
    const int64_t whole_kv = 2 * int64_t{batch} * s * hkv * hd * static_cast<int64_t>(sizeof(float));
    const int64_t fwd_vol = whole_kv * (c - 1) / c, bwd_vol = 2 * fwd_vol;
    const int64_t pairs_want = int64_t{batch} * hq * s * (s + 1) / 2 / c;
    int64_t bad = 0;
    bad += fwd_traffic.p2p_bytes != fwd_vol || fwd_stats.bytes_sent != fwd_vol;
    bad += bwd_traffic.p2p_bytes != bwd_vol || bwd_stats.bytes_sent != bwd_vol;
    bad += fwd_stats.pairs != pairs_want || bwd_stats.pairs != pairs_want;
    const int64_t row_wrong = h.Sum(bad);
    wrong += row_wrong;
    const double fwd_ms = 1e3 * h.MedianOfMax(fwd_s), bwd_ms = 1e3 * h.MedianOfMax(bwd_s);
    const double wait_ms = 1e3 * h.Max(Median(wait_s));
    table.AddRow({s, sc, fwd_ms, bwd_ms, 1e3 * total_max, wait_ms, 1e3 * compute_max,
                  total_min > 0 ? total_max / total_min : 0.0,
                  compute_min > 0 ? compute_max / compute_min : 0.0, whole,
                  fwd_traffic.p2p_bytes, fwd_vol, bwd_traffic.p2p_bytes, bwd_vol,
                  fwd_stats.pairs});
  }
  if (h.printing()) {
    std::printf("# cp %d: B %d, Hq %d, Hkv %d, hd %d; times: slowest rank's median of %d reps\n", c,
                batch, hq, hkv, hd, h.options().iters);
  }
  nlohmann::json extra = {{"cp", c}, {"batch", batch}, {"heads", hq}, {"kv_heads", hkv},
                          {"head_dim", hd}};
  return h.Finish(table, wrong, extra);
}

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) { return switchyard::bench::Main(argc, argv); }
