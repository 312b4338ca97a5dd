// CommThread (comm_thread.h): a FIFO of exchanges run by one thread, and the fallback to
// the communicator's own asynchronous all-to-all.
#include "engine/dist/comm_thread.h"

#include <chrono>
#include <string_view>
#include <system_error>
#include <utility>

#include "engine/core/allocator.h"
#include "engine/core/check.h"
#include "engine/dist/process.h"
#include "engine/dist/watchdog.h"

namespace switchyard::dist {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// The fallback: the communicator's asynchronous exchange; its bytes move in Wait.
class FallbackWork final : public TimedWork {
 public:
  FallbackWork(std::unique_ptr<Work> work, double post_seconds)
      : work_(std::move(work)), seconds_(post_seconds), exposed_(post_seconds) {}
  ~FallbackWork() override { Wait(); }

  void Wait() override {
    if (!work_) return;
    const Clock::time_point t0 = Clock::now();
    work_->Wait();
    const double waited = Seconds(t0, Clock::now());
    seconds_ += waited;
    exposed_ += waited;
    work_.reset();
  }
  bool Test() override {
    if (work_ && work_->Test()) Wait();  // returns at once
    return !work_;
  }
  double seconds() const override { return seconds_; }
  double exposed_seconds() const override { return exposed_; }

 private:
  std::unique_ptr<Work> work_;
  double seconds_, exposed_;
};

}  // namespace

// One exchange on the thread: what to run, and when it ran.
struct CommThread::Job {
  std::function<void()> run;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Clock::time_point start, end;
};

namespace {

class ThreadWork final : public TimedWork {
 public:
  ThreadWork(std::shared_ptr<CommThread::Job> job, uint64_t seq, std::vector<int> group)
      : job_(std::move(job)), seq_(seq), group_(std::move(group)) {}
  ~ThreadWork() override { Wait(); }

  void Wait() override {
    if (waited_) return;
    const Clock::time_point t0 = Clock::now();
    {
      const WatchdogScope watch("all_to_all_v", seq_, group_);
      std::unique_lock<std::mutex> lock(job_->mu);
      job_->cv.wait(lock, [&] { return job_->done; });
    }
    exposed_ = Seconds(t0, Clock::now());
    seconds_ = Seconds(job_->start, job_->end);
    waited_ = true;
    job_.reset();
  }
  bool Test() override {
    if (waited_) return true;
    {
      std::lock_guard<std::mutex> lock(job_->mu);
      if (!job_->done) return false;
    }
    Wait();  // returns at once
    return true;
  }
  double seconds() const override { return seconds_; }
  double exposed_seconds() const override { return exposed_; }

 private:
  std::shared_ptr<CommThread::Job> job_;
  uint64_t seq_;
  std::vector<int> group_;
  bool waited_ = false;
  double seconds_ = 0.0, exposed_ = 0.0;
};

}  // namespace

CommThread::CommThread(Communicator& comm) : comm_(&comm) {
  if (comm.size() > 1 && comm.backend() == std::string_view("mpi") && MpiThreadMultiple()) {
    try {
      thread_ = std::thread([this] { Run(); });
    } catch (const std::system_error& e) {
      ExitNoThread("the communication thread", e.what());
    }
  }
}

CommThread::~CommThread() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void CommThread::Run() {
  UnwatchThisThread();  // the posting thread's Wait is watched instead
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job->start = Clock::now();
    job->run();
    job->run = nullptr;  // drops the tensors' handles before the waiter sees done
    {
      std::lock_guard<std::mutex> lock(job->mu);
      job->end = Clock::now();
      job->done = true;
    }
    job->cv.notify_all();
  }
}

std::unique_ptr<TimedWork> CommThread::AllToAllV(const Tensor& in,
                                                 std::span<const int64_t> send_rows,
                                                 Tensor& out,
                                                 std::span<const int64_t> recv_rows) {
  ++seq_;
  if (!threaded()) {
    const Clock::time_point t0 = Clock::now();
    std::unique_ptr<Work> work = comm_->AllToAllVAsync(in, send_rows, out, recv_rows);
    return std::make_unique<FallbackWork>(std::move(work), Seconds(t0, Clock::now()));
  }
  // A bad call fails here, on the caller's thread, naming the shapes.
  internal::CheckTensor(in, comm_->device(), "AllToAllV");
  internal::CheckTensor(out, comm_->device(), "AllToAllV");
  internal::CheckAllToAllV(in, send_rows, out, recv_rows, comm_->size(), comm_->rank());
  auto job = std::make_shared<Job>();
  std::vector<int64_t> send(send_rows.begin(), send_rows.end());
  std::vector<int64_t> recv(recv_rows.begin(), recv_rows.end());
  job->run = [comm = comm_, in, out, send = std::move(send), recv = std::move(recv)]() mutable {
    comm->AllToAllV(in, send, out, recv);
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(job);
  }
  cv_.notify_one();
  return std::make_unique<ThreadWork>(std::move(job), seq_, comm_->world_ranks());
}

}  // namespace switchyard::dist
