#include "engine/parallel/context_parallel.h"

#include <cstring>
#include <vector>

#include "engine/core/check.h"

namespace switchyard::parallel {

Status ContextParallel::Validate() const {
  if (!active()) return OkStatus();
  if (seq_len <= 0 || seq_len % (2 * size()) != 0) {
    return InvalidArgument("model.seq_len=", seq_len, " is not divisible by 2 * parallel.cp = ",
                           2 * size(), " (context parallelism cuts every sequence into 2 * cp "
                           "chunks)");
  }
  return OkStatus();
}

namespace {

// Copies chunk `chunk` (of `chunks`) of every sequence of (B, S) `from` into rows `row0`..
// of the (rows, S/chunks) `to`, or the other way (to_whole).
void CopyChunk(const Tensor& whole, const Tensor& local, int64_t chunk, int64_t chunks,
               int64_t row0, bool to_whole) {
  const int64_t b = whole.dim(0), s = whole.dim(1), len = s / chunks;
  const size_t elem = SizeOf(whole.dtype()), bytes = elem * len;
  auto* w = static_cast<char*>(const_cast<void*>(whole.raw_data()));
  auto* l = static_cast<char*>(const_cast<void*>(local.raw_data()));
  for (int64_t i = 0; i < b; ++i) {
    char* wp = w + (i * s + chunk * len) * elem;
    char* lp = l + (row0 + i) * len * elem;
    if (to_whole) {
      std::memcpy(wp, lp, bytes);
    } else {
      std::memcpy(lp, wp, bytes);
    }
  }
}

}  // namespace

Tensor ShardSequences(const Tensor& whole, int cp_size, int cp_rank) {
  if (cp_size == 1) return whole;
  SY_CHECK(whole.ndim() == 2 && whole.device().is_cpu())
      << "ShardSequences: (B, S) on the CPU, got " << whole.DebugString();
  const int64_t b = whole.dim(0), s = whole.dim(1), chunks = 2 * cp_size;
  SY_CHECK(s % chunks == 0) << "ShardSequences: S=" << s << " not divisible by " << chunks;
  Tensor local = Tensor::Empty({2 * b, s / chunks}, whole.dtype());
  CopyChunk(whole, local, cp_rank, chunks, 0, false);
  CopyChunk(whole, local, chunks - 1 - cp_rank, chunks, b, false);
  return local;
}

Tensor UnshardSequences(const std::vector<Tensor>& pieces) {
  const int64_t c = static_cast<int64_t>(pieces.size());
  SY_CHECK(c >= 1 && pieces[0].ndim() == 2);
  if (c == 1) return pieces[0];
  const int64_t b = pieces[0].dim(0) / 2, len = pieces[0].dim(1);
  Tensor whole = Tensor::Empty({b, 2 * c * len}, pieces[0].dtype());
  for (int64_t r = 0; r < c; ++r) {
    CopyChunk(whole, pieces[r], r, 2 * c, 0, true);
    CopyChunk(whole, pieces[r], 2 * c - 1 - r, 2 * c, b, true);
  }
  return whole;
}

}  // namespace switchyard::parallel
