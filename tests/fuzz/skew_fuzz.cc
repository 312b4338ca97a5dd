// plan::ParseSkew on an arbitrary routing log (the planner's --skew FILE): an error or a
// skew whose load ratio at any ep is finite and >= 1, never a crash.
#include <cmath>
#include <cstdint>

#include "engine/plan/cost_model.h"
#include "tests/fuzz/fuzz_util.h"

using namespace switchyard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto skew = plan::ParseSkew(fuzz::AsFile(data, size, "routing.jsonl"));
  if (!skew.ok()) return 0;
  for (int ep : {1, 2, 3, 8, 64}) {
    const double s = skew->ForEp(ep);
    if (!(s >= 1) || !std::isfinite(s)) fuzz::Fail("ForEp(" + std::to_string(ep) + ") = " + std::to_string(s));
  }
  return 0;
}
