// A communicator that times the communication a computation did not hide: it forwards
// every call to another communicator and adds the seconds spent posting point-to-point ops
// and waiting for them (Send, Recv, the async forms' Wait, BatchSendRecv) to seconds().
// cp_attention_perf wraps the ring's communicator in it.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "benchmarks/harness.h"
#include "engine/dist/communicator.h"

namespace switchyard::bench {

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
  bool Test() override { return inner_->Test(); }

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

}  // namespace switchyard::bench
