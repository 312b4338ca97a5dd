#include "engine/dist/watchdog.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <sstream>
#include <system_error>
#include <thread>

#include "engine/core/allocator.h"

#ifdef SY_HAVE_MPI
#include <mpi.h>
#endif

namespace switchyard::dist {
namespace {

using Clock = std::chrono::steady_clock;

// The collective in progress on the main thread (the only thread that runs collectives).
struct Mark {
  std::mutex mu;
  bool active = false;
  const char* op = "";
  uint64_t seq = 0;
  std::vector<int> group;
  std::vector<int> peers;  // a point-to-point wait's peers (world ranks); empty: the group
  std::string note;        // WatchdogNote's
  std::map<int, std::string> names;  // NameRankForWatchdog's
  Clock::time_point since;
};

Mark& TheMark() {
  static Mark* mark = new Mark;  // never destroyed: the thread may outlive statics
  return *mark;
}

// The exit status of a rank that timed out (engine/cli/args.h kExitCollectiveTimeout).
constexpr int kExitCollectiveTimeout = 4;
constexpr int kTag = 0x5744;  // "WD"
constexpr int kAnswerBytes = 512;

struct Watchdog {
  std::mutex mu;
  std::condition_variable cv;
  std::thread thread;
  bool stop = false;
  std::atomic<double> timeout_s{0};
  int rank = 0, world = 1;
  bool can_ask = false;  // MPI_THREAD_MULTIPLE: the thread may talk to the other ranks
#ifdef SY_HAVE_MPI
  MPI_Comm comm = MPI_COMM_NULL;
#endif
};

Watchdog*& TheWatchdog() {
  static Watchdog* w = nullptr;
  return w;
}

std::string Join(const std::vector<int>& v) {
  std::ostringstream out;
  for (size_t i = 0; i < v.size(); ++i) out << (i ? " " : "") << v[i];
  return out.str();
}

// " 3 [pipeline stage 1]": a rank in a list of ranks, with its name when it has one.
std::string StrJoinRank(bool after_another, int rank, const std::string& name) {
  std::string out = (after_another ? " " : "") + std::to_string(rank);
  if (!name.empty()) out += " [" + name + "]";
  return out;
}

#ifdef SY_HAVE_MPI
// Sends `mine` to every other rank and collects their answers for up to `grace` seconds:
// rank -> its collective, absent for ranks that did not answer.
std::map<int, std::string> AskEveryone(Watchdog& w, const std::string& mine, double grace) {
  std::map<int, std::string> answers;
  std::vector<MPI_Request> sends, recvs;
  std::vector<std::vector<char>> buffers(w.world, std::vector<char>(kAnswerBytes, '\0'));
  std::vector<int> peers;
  std::string text = mine.substr(0, kAnswerBytes - 1);
  for (int r = 0; r < w.world; ++r) {
    if (r == w.rank) continue;
    MPI_Request s, q;
    MPI_Isend(text.c_str(), static_cast<int>(text.size()) + 1, MPI_CHAR, r, kTag, w.comm, &s);
    MPI_Irecv(buffers[r].data(), kAnswerBytes, MPI_CHAR, r, kTag, w.comm, &q);
    sends.push_back(s);
    recvs.push_back(q);
    peers.push_back(r);
  }
  const auto deadline = Clock::now() + std::chrono::duration<double>(grace);
  std::vector<bool> got(recvs.size(), false);
  size_t pending = recvs.size();
  while (pending > 0 && Clock::now() < deadline) {
    for (size_t i = 0; i < recvs.size(); ++i) {
      if (got[i]) continue;
      int done = 0;
      MPI_Test(&recvs[i], &done, MPI_STATUS_IGNORE);
      if (done) {
        got[i] = true;
        --pending;
        answers[peers[i]] = std::string(buffers[peers[i]].data());
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return answers;  // the pending requests are abandoned: the process exits next
}
#endif

// Reports the timed-out collective and exits the process.
[[noreturn]] void Fire(Watchdog& w, const char* op, uint64_t seq, const std::vector<int>& group,
                       const std::vector<int>& peers, const std::string& note,
                       const std::map<int, std::string>& names) {
  const std::string mine = DescribeCollective(op, seq, group);
  std::ostringstream line;
  line << "switchyard: rank " << w.rank << ": " << mine;
  if (!peers.empty()) line << " with world " << (peers.size() == 1 ? "rank " : "ranks ") << Join(peers);
  line << " did not complete within " << w.timeout_s.load() << " s (train.collective_timeout_s)";
  if (!note.empty()) line << " (" << note << ")";
#ifdef SY_HAVE_MPI
  if (w.can_ask && w.world > 1) {
    const double grace = std::min(10.0, std::max(1.0, w.timeout_s.load()));
    const std::map<int, std::string> answers = AskEveryone(w, mine, grace);
    std::vector<int> silent, together;
    std::string silent_names;
    std::vector<std::string> elsewhere;
    for (int r : peers.empty() ? group : peers) {
      if (r == w.rank) continue;
      auto it = answers.find(r);
      if (it == answers.end()) {
        silent.push_back(r);
        const auto name = names.find(r);
        silent_names += StrJoinRank(silent.size() > 1, r, name == names.end() ? "" : name->second);
      } else if (it->second == mine) {
        together.push_back(r);
      } else {
        elsewhere.push_back("rank " + std::to_string(r) + " is in " + it->second);
      }
    }
    line << "; not arrived: ";
    if (silent.empty() && elsewhere.empty()) line << "none";
    if (!silent.empty()) {
      line << (silent.size() == 1 ? "rank " : "ranks ") << silent_names
           << " (no answer: stopped, hung or busy)";
    }
    for (size_t i = 0; i < elsewhere.size(); ++i) {
      line << (i || !silent.empty() ? ", " : "") << elsewhere[i];
    }
    if (!together.empty()) line << "; waiting in it too: ranks " << Join(together);
  } else {
    line << "; the other ranks could not be asked (MPI without MPI_THREAD_MULTIPLE)";
  }
#endif
  std::fprintf(stderr, "%s\n", line.str().c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  ::_exit(kExitCollectiveTimeout);
}

void Loop(Watchdog* w) {
  std::unique_lock<std::mutex> lock(w->mu);
  while (!w->stop) {
    w->cv.wait_for(lock, std::chrono::milliseconds(100));
    if (w->stop) break;
    Mark& m = TheMark();
    const char* op = nullptr;
    uint64_t seq = 0;
    std::vector<int> group, peers;
    std::string note;
    std::map<int, std::string> names;
    {
      std::lock_guard<std::mutex> g(m.mu);
      if (m.active) {
        const double waited = std::chrono::duration<double>(Clock::now() - m.since).count();
        if (waited > w->timeout_s.load()) {
          op = m.op;
          seq = m.seq;
          group = m.group;
          peers = m.peers;
          note = m.note;
          names = m.names;
        }
      }
    }
    if (op != nullptr) Fire(*w, op, seq, group, peers, note, names);
  }
}

}  // namespace

std::string DescribeCollective(const char* op, uint64_t seq, const std::vector<int>& group) {
  return std::string(op) + " #" + std::to_string(seq) + " on group of world ranks [" + Join(group) +
         "]";
}

namespace {
thread_local bool unwatched_thread = false;
}  // namespace

void UnwatchThisThread() { unwatched_thread = true; }

WatchdogScope::WatchdogScope(const char* op, uint64_t seq, const std::vector<int>& group,
                             const std::vector<int>& peers) {
  if (TheWatchdog() == nullptr || unwatched_thread) return;
  Mark& m = TheMark();
  std::lock_guard<std::mutex> g(m.mu);
  m.active = true;
  m.op = op;
  m.seq = seq;
  m.group = group;
  m.peers = peers;
  m.since = Clock::now();
  active_ = true;
}

WatchdogScope::~WatchdogScope() {
  if (!active_) return;
  Mark& m = TheMark();
  std::lock_guard<std::mutex> g(m.mu);
  m.active = false;
}

WatchdogNote::WatchdogNote(std::string note) {
  Mark& m = TheMark();
  std::lock_guard<std::mutex> g(m.mu);
  previous_ = std::move(m.note);
  m.note = std::move(note);
}

WatchdogNote::~WatchdogNote() {
  Mark& m = TheMark();
  std::lock_guard<std::mutex> g(m.mu);
  m.note = std::move(previous_);
}

void NameRankForWatchdog(int world_rank, std::string what) {
  Mark& m = TheMark();
  std::lock_guard<std::mutex> g(m.mu);
  m.names[world_rank] = std::move(what);
}

void StartCollectiveWatchdog(double timeout_s) {
  if (timeout_s <= 0) {
    StopCollectiveWatchdog();
    return;
  }
  if (Watchdog* w = TheWatchdog(); w != nullptr) {
    w->timeout_s.store(timeout_s);
    return;
  }
#ifdef SY_HAVE_MPI
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return;
  int world = 1, rank = 0, level = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (world == 1) return;
  MPI_Query_thread(&level);
  auto* w = new Watchdog;
  w->timeout_s.store(timeout_s);
  w->rank = rank;
  w->world = world;
  w->can_ask = level >= MPI_THREAD_MULTIPLE;
  MPI_Comm_dup(MPI_COMM_WORLD, &w->comm);
  TheWatchdog() = w;
  try {
    w->thread = std::thread(Loop, w);
  } catch (const std::system_error& e) {
    ExitNoThread("the collective watchdog", e.what());
  }
#endif
}

void StopCollectiveWatchdog() {
  Watchdog* w = TheWatchdog();
  if (w == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(w->mu);
    w->stop = true;
  }
  w->cv.notify_all();
  w->thread.join();
  TheWatchdog() = nullptr;
#ifdef SY_HAVE_MPI
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && w->comm != MPI_COMM_NULL) MPI_Comm_free(&w->comm);
#endif
  delete w;
}

}  // namespace switchyard::dist
