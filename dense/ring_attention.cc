// PROVISIONAL naive implementation (see the header).
#include "dense/ring_attention.h"

#include <cmath>
#include <limits>
#include <vector>

namespace switchyard::dense {
namespace {

struct Geo {
  int64_t b2, sc, hq, hkv, hd, c, rank;
  int64_t pos(int64_t r, int64_t row, int64_t s) const {  // row in [0, 2B)
    const int64_t b = b2 / 2, h = row / b;
    return ((h == 0 ? r : 2 * c - 1 - r) * sc) + s;
  }
};

}  // namespace

void RingAttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                          Tensor& lse, dist::Communicator& cp, DeviceContext*,
                          RingAttentionStats*) {
  const Geo g{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3), cp.size(), cp.rank()};
  Tensor ka = Tensor::Empty({g.c * g.b2, g.sc, g.hkv, g.hd}, DType::kF32);
  Tensor va = Tensor::Empty({g.c * g.b2, g.sc, g.hkv, g.hd}, DType::kF32);
  cp.AllGather(k, ka);
  cp.AllGather(v, va);
  const float scale = static_cast<float>(1.0 / std::sqrt(double(g.hd)));
  const int64_t b = g.b2 / 2;
  std::vector<float> sc(g.c * 2 * g.sc);
  for (int64_t row = 0; row < g.b2; ++row)
    for (int64_t s = 0; s < g.sc; ++s)
      for (int64_t h = 0; h < g.hq; ++h) {
        const int64_t kh = h / (g.hq / g.hkv), pq = g.pos(g.rank, row, s), seqb = row % b;
        const float* qp = q.data<float>() + ((row * g.sc + s) * g.hq + h) * g.hd;
        float m = -std::numeric_limits<float>::infinity();
        int64_t n = 0;
        std::vector<const float*> vs;
        for (int64_t r = 0; r < g.c; ++r)
          for (int64_t hh = 0; hh < 2; ++hh)
            for (int64_t t = 0; t < g.sc; ++t) {
              const int64_t krow = hh * b + seqb;
              if (g.pos(r, krow, t) > pq) continue;
              const int64_t idx = ((r * g.b2 + krow) * g.sc + t) * g.hkv + kh;
              const float* kp = ka.data<float>() + idx * g.hd;
              float d = 0;
              for (int64_t j = 0; j < g.hd; ++j) d += qp[j] * kp[j];
              sc[n++] = d * scale;
              vs.push_back(va.data<float>() + idx * g.hd);
              m = std::max(m, d * scale);
            }
        double sum = 0;
        for (int64_t i = 0; i < n; ++i) sum += std::exp(double(sc[i]) - m);
        const double l = m + std::log(sum);
        lse.data<float>()[(row * g.hq + h) * g.sc + s] = float(l);
        float* op = out.data<float>() + ((row * g.sc + s) * g.hq + h) * g.hd;
        for (int64_t j = 0; j < g.hd; ++j) op[j] = 0;
        for (int64_t i = 0; i < n; ++i) {
          const float p = float(std::exp(double(sc[i]) - l));
          for (int64_t j = 0; j < g.hd; ++j) op[j] += p * vs[i][j];
        }
      }
}

void RingAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                           const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                           Tensor& dv, dist::Communicator& cp, DeviceContext*,
                           RingAttentionStats*) {
  const Geo g{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3), cp.size(), cp.rank()};
  Tensor ka = Tensor::Empty({g.c * g.b2, g.sc, g.hkv, g.hd}, DType::kF32);
  Tensor va = Tensor::Empty({g.c * g.b2, g.sc, g.hkv, g.hd}, DType::kF32);
  cp.AllGather(k, ka);
  cp.AllGather(v, va);
  Tensor dka = Tensor::Zeros(ka.shape(), DType::kF32), dva = Tensor::Zeros(va.shape(), DType::kF32);
  const float scale = static_cast<float>(1.0 / std::sqrt(double(g.hd)));
  const int64_t b = g.b2 / 2;
  dq.SetZero();
  for (int64_t row = 0; row < g.b2; ++row)
    for (int64_t s = 0; s < g.sc; ++s)
      for (int64_t h = 0; h < g.hq; ++h) {
        const int64_t kh = h / (g.hq / g.hkv), pq = g.pos(g.rank, row, s), seqb = row % b;
        const int64_t qi = ((row * g.sc + s) * g.hq + h) * g.hd;
        const float* qp = q.data<float>() + qi;
        const float* dop = dout.data<float>() + qi;
        const float* op = out.data<float>() + qi;
        float* dqp = dq.data<float>() + qi;
        const float l = lse.data<float>()[(row * g.hq + h) * g.sc + s];
        float delta = 0;
        for (int64_t j = 0; j < g.hd; ++j) delta += dop[j] * op[j];
        for (int64_t r = 0; r < g.c; ++r)
          for (int64_t hh = 0; hh < 2; ++hh)
            for (int64_t t = 0; t < g.sc; ++t) {
              const int64_t krow = hh * b + seqb;
              if (g.pos(r, krow, t) > pq) continue;
              const int64_t idx = (((r * g.b2 + krow) * g.sc + t) * g.hkv + kh) * g.hd;
              const float* kp = ka.data<float>() + idx;
              const float* vp = va.data<float>() + idx;
              float d = 0, dp = 0;
              for (int64_t j = 0; j < g.hd; ++j) {
                d += qp[j] * kp[j];
                dp += dop[j] * vp[j];
              }
              const float p = std::exp(d * scale - l);
              const float ds = p * (dp - delta) * scale;
              for (int64_t j = 0; j < g.hd; ++j) {
                dva.data<float>()[idx + j] += p * dop[j];
                dqp[j] += ds * kp[j];
                dka.data<float>()[idx + j] += ds * qp[j];
              }
            }
      }
  cp.ReduceScatter(dka, dk, dist::ReduceOp::kSum);
  cp.ReduceScatter(dva, dv, dist::ReduceOp::kSum);
}

}  // namespace switchyard::dense
