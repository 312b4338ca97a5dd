// CPU reference implementation of kernels/cross_entropy.h: per row one max, one pass of
// exponentials (kept in the gradient row when there is one) summed in f32 lanes and then in
// double, then the gradient scaled in place. Rows run in parallel; each row's loss is kept
// and the rows are summed in order, so the sum does not depend on the thread count. Shapes
// were checked by kernels/cross_entropy.cc; the targets are checked against V here.
#include "kernels/cross_entropy.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "engine/core/check.h"
#include "engine/core/thread_pool.h"
#include "kernels/cpu/rows.h"

namespace switchyard::kernels::cpu {

int64_t CountTargets(const Tensor& targets, int32_t ignore_index) {
  const int32_t* t = targets.data<int32_t>();
  int64_t count = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) count += t[i] != ignore_index;
  return count;
}

CrossEntropySums CrossEntropy(const Tensor& logits, const Tensor& targets, Tensor* dlogits,
                              double grad_scale, int32_t ignore_index, const char* op) {
  const int64_t n = targets.numel();
  const int64_t v = logits.dim(-1);
  const int32_t* t = targets.data<int32_t>();
  for (int64_t r = 0; r < n; ++r) {
    SY_CHECK(t[r] == ignore_index || (t[r] >= 0 && t[r] < v))
        << op << ": target " << t[r] << " at row " << r << " is outside the vocabulary of " << v
        << " (ignore_index=" << ignore_index << ")";
  }
  std::vector<double> row_loss(static_cast<size_t>(n), 0.0);
  ParallelFor(n, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(dlogits ? 0 : static_cast<size_t>(v));
    for (int64_t r = begin; r < end; ++r) {
      const float* x = logits.data<float>() + r * v;
      float* dx = dlogits ? dlogits->data<float>() + r * v : nullptr;
      if (t[r] == ignore_index) {
        if (dx) std::memset(dx, 0, static_cast<size_t>(v) * sizeof(float));
        continue;
      }
      const float max = RowMax(x, v);
      const float target_logit = x[t[r]];  // read before dx may overwrite the row
      const double sum = ExpShiftRow(x, max, dx ? dx : scratch.data(), v);
      row_loss[r] = static_cast<double>(max) + std::log(sum) - static_cast<double>(target_logit);
      if (dx) {
        ScaleRow(dx, static_cast<float>(grad_scale / sum), v);
        dx[t[r]] -= static_cast<float>(grad_scale);
      }
    }
  });
  CrossEntropySums sums;
  for (int64_t r = 0; r < n; ++r) {
    if (t[r] == ignore_index) continue;
    sums.loss_sum += row_loss[r];
    ++sums.count;
  }
  return sums;
}

}  // namespace switchyard::kernels::cpu
