// The process-wide device counters of engine/core/counters.h.
#include "engine/core/counters.h"

#include "engine/core/captured_work.h"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace switchyard {
namespace {

struct State {
  std::atomic<int64_t> dispatches{0};
  std::atomic<int64_t> readbacks{0};
  std::atomic<int64_t> cuda_mallocs{0};
  std::atomic<int64_t> conversion_calls[kNumDTypes][kNumDTypes] = {};
  std::atomic<int64_t> conversion_elements[kNumDTypes][kNumDTypes] = {};
  std::atomic<int64_t> weight_calls{0};
  std::atomic<int64_t> weight_elements{0};
  std::mutex mu;
  std::map<std::string, int64_t> sites;  // guarded by mu
  // Dispatches by op, keyed by the name's address (a literal or __func__: one per dispatching
  // function, so a few dozen keys); guarded by mu. Names repeated at two addresses (an op
  // overloaded in two files) merge in Snapshot.
  std::map<const char*, int64_t> ops;
};

State& GetState() {
  static State* state = new State();  // never destroyed: counted from any thread at exit
  return *state;
}

constexpr auto kRelaxed = std::memory_order_relaxed;

}  // namespace

int64_t DeviceCounts::conversions() const {
  int64_t n = 0;
  for (const auto& row : conversion_calls)
    for (int64_t c : row) n += c;
  return n;
}

int64_t DeviceCounts::conversion_element_total() const {
  int64_t n = 0;
  for (const auto& row : conversion_elements)
    for (int64_t c : row) n += c;
  return n;
}

DeviceCounts DeviceCounts::Minus(const DeviceCounts& earlier) const {
  DeviceCounts d;
  d.dispatches = dispatches - earlier.dispatches;
  d.readbacks = readbacks - earlier.readbacks;
  d.cuda_mallocs = cuda_mallocs - earlier.cuda_mallocs;
  for (int i = 0; i < kNumDTypes; ++i) {
    for (int j = 0; j < kNumDTypes; ++j) {
      d.conversion_calls[i][j] = conversion_calls[i][j] - earlier.conversion_calls[i][j];
      d.conversion_elements[i][j] = conversion_elements[i][j] - earlier.conversion_elements[i][j];
    }
  }
  d.weight_conversion_calls = weight_conversion_calls - earlier.weight_conversion_calls;
  d.weight_conversion_elements = weight_conversion_elements - earlier.weight_conversion_elements;
  auto minus = [](const std::map<std::string, int64_t>& now,
                  const std::map<std::string, int64_t>& before) {
    std::map<std::string, int64_t> diff;
    for (const auto& [name, n] : now) {
      auto it = before.find(name);
      const int64_t d = n - (it == before.end() ? 0 : it->second);
      if (d != 0) diff[name] = d;
    }
    return diff;
  };
  d.readback_sites = minus(readback_sites, earlier.readback_sites);
  d.dispatch_ops = minus(dispatch_ops, earlier.dispatch_ops);
  return d;
}

void DeviceCounts::Add(const DeviceCounts& other) {
  dispatches += other.dispatches;
  readbacks += other.readbacks;
  cuda_mallocs += other.cuda_mallocs;
  for (int i = 0; i < kNumDTypes; ++i) {
    for (int j = 0; j < kNumDTypes; ++j) {
      conversion_calls[i][j] += other.conversion_calls[i][j];
      conversion_elements[i][j] += other.conversion_elements[i][j];
    }
  }
  weight_conversion_calls += other.weight_conversion_calls;
  weight_conversion_elements += other.weight_conversion_elements;
  for (const auto& [site, n] : other.readback_sites) readback_sites[site] += n;
  for (const auto& [op, n] : other.dispatch_ops) dispatch_ops[op] += n;
}

std::string DeviceCounts::Json(int64_t divide_by) const {
  const double div = static_cast<double>(divide_by > 0 ? divide_by : 1);
  char buf[160];
  auto num = [&](int64_t v) {
    std::snprintf(buf, sizeof(buf), "%.9g", static_cast<double>(v) / div);
    return std::string(buf);
  };
  auto object = [&](const std::map<std::string, int64_t>& m) {
    std::string out;
    for (const auto& [name, n] : m) out += (out.empty() ? "" : ", ") + ("\"" + name + "\": ") + num(n);
    return "{" + out + "}";
  };
  std::string conv;
  for (int i = 0; i < kNumDTypes; ++i) {
    for (int j = 0; j < kNumDTypes; ++j) {
      if (conversion_calls[i][j] == 0 && conversion_elements[i][j] == 0) continue;
      conv += (conv.empty() ? "" : ", ") + std::string("\"") +
              std::string(DTypeName(static_cast<DType>(i))) + "->" +
              std::string(DTypeName(static_cast<DType>(j))) + "\": {\"calls\": " +
              num(conversion_calls[i][j]) + ", \"elements\": " +
              num(conversion_elements[i][j]) + "}";
    }
  }
  return "{\"dispatches\": " + num(dispatches) + ", \"dispatch_ops\": " + object(dispatch_ops) +
         ", \"readbacks\": " + num(readbacks) + ", \"readback_sites\": " +
         object(readback_sites) + ", \"cuda_mallocs\": " + num(cuda_mallocs) +
         ", \"conversions\": {" + conv + "}, \"weight_conversions\": {\"calls\": " +
         num(weight_conversion_calls) + ", \"elements\": " + num(weight_conversion_elements) +
         "}}";
}

namespace counters {

DeviceCounts Snapshot() {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  DeviceCounts c;
  c.dispatches = s.dispatches.load(kRelaxed);
  c.readbacks = s.readbacks.load(kRelaxed);
  c.cuda_mallocs = s.cuda_mallocs.load(kRelaxed);
  for (int i = 0; i < kNumDTypes; ++i) {
    for (int j = 0; j < kNumDTypes; ++j) {
      c.conversion_calls[i][j] = s.conversion_calls[i][j].load(kRelaxed);
      c.conversion_elements[i][j] = s.conversion_elements[i][j].load(kRelaxed);
    }
  }
  c.weight_conversion_calls = s.weight_calls.load(kRelaxed);
  c.weight_conversion_elements = s.weight_elements.load(kRelaxed);
  c.readback_sites = s.sites;
  for (const auto& [op, n] : s.ops) c.dispatch_ops[op] += n;
  return c;
}

void CountDispatch(const char* op) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  // Under the mutex with the op so a snapshot sees the total and the ops agree.
  s.dispatches.fetch_add(1, kRelaxed);
  ++s.ops[op];
}

namespace {
thread_local int dispatch_depth = 0;  // dispatched ops running on this thread
}  // namespace

DispatchScope::DispatchScope() { ++dispatch_depth; }
DispatchScope::~DispatchScope() { --dispatch_depth; }

void CountTensorOp(const char* op) {
  if (dispatch_depth == 0) CountDispatch(op);
}

void CountReadback(const char* site) {
  capture::CheckNotCapturing(site);
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  // Under the mutex with the site so a snapshot sees the total and the sites agree.
  s.readbacks.fetch_add(1, kRelaxed);
  ++s.sites[site];
}

void CountConversion(DType from, DType to, int64_t elements) {
  State& s = GetState();
  const int i = static_cast<int>(from), j = static_cast<int>(to);
  s.conversion_calls[i][j].fetch_add(1, kRelaxed);
  s.conversion_elements[i][j].fetch_add(elements, kRelaxed);
}

void CountWeightConversion(int64_t elements) {
  State& s = GetState();
  s.weight_calls.fetch_add(1, kRelaxed);
  s.weight_elements.fetch_add(elements, kRelaxed);
}

void CountCudaMalloc() { GetState().cuda_mallocs.fetch_add(1, kRelaxed); }

}  // namespace counters
}  // namespace switchyard
