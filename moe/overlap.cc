// The chunked exchange of the MoE layer (moe/overlap.h): the chunks' counts and row orders
// from a dispatch plan, and the pipeline that posts every chunk's exchange, computes each
// chunk once its rows are in and posts its return.
#include "moe/overlap.h"

#include <memory>
#include <utility>

#include "engine/core/check.h"
#include "moe/row_index.h"

namespace switchyard::moe {
namespace {

// The inverse permutation of `index`.
std::vector<int64_t> Inverse(const std::vector<int64_t>& index) {
  std::vector<int64_t> inverse(index.size());
  for (size_t i = 0; i < index.size(); ++i) inverse[index[i]] = static_cast<int64_t>(i);
  return inverse;
}

// Waits for one exchange and charges it to the recording profiler (groups of one rank do
// no communication and are not counted).
void Finish(dist::TimedWork& work, const dist::Communicator& comm) {
  work.Wait();
  if (Profiler* p = Profiler::Recording(); p != nullptr && comm.size() > 1) {
    p->AddAllToAll(work.seconds(), work.exposed_seconds());
  }
}

}  // namespace

ChunkedExchange::ChunkedExchange(const DispatchPlan& plan, int64_t chunks, DeviceContext* ctx)
    : ep_size_(plan.ep_size()), num_assignments_(plan.num_assignments()) {
  const int64_t el = plan.experts_per_rank(), ep = ep_size_;
  SY_CHECK(plan.exchanged()) << "ChunkedExchange: ExchangeCounts must run first";
  SY_CHECK(chunks >= 1 && chunks <= el)
      << "moe.overlap_chunks=" << chunks << " for " << el << " experts per ep rank";
  const Device dev = plan.device();
  // Where each global expert's rows start in the expert order.
  const std::vector<int64_t>& send = plan.send_per_expert();  // (E)
  std::vector<int64_t> expert_offset(send.size() + 1, 0);
  for (size_t g = 0; g < send.size(); ++g) expert_offset[g + 1] = expert_offset[g] + send[g];
  const std::vector<int64_t>& counts = plan.recv_per_source_expert();  // (ep, E_l)

  std::vector<int64_t> to_chunk_major;
  to_chunk_major.reserve(num_assignments_);
  chunks_.resize(chunks);
  for (int64_t c = 0; c < chunks; ++c) {
    Chunk& k = chunks_[c];
    k.first = c * el / chunks;
    k.end = (c + 1) * el / chunks;
    k.send_offset = static_cast<int64_t>(to_chunk_major.size());
    k.send_rows.assign(ep, 0);
    k.recv_rows.assign(ep, 0);
    k.rows_per_local_expert.assign(el, 0);
    // Sent: for each destination rank, the rows of its experts [first, end), expert order.
    for (int64_t r = 0; r < ep; ++r) {
      for (int64_t g = r * el + k.first; g < r * el + k.end; ++g) {
        for (int64_t a = expert_offset[g]; a < expert_offset[g + 1]; ++a) {
          to_chunk_major.push_back(a);
        }
        k.send_rows[r] += send[g];
      }
    }
    k.sent = static_cast<int64_t>(to_chunk_major.size()) - k.send_offset;
    // Received in (source, expert) order; grouped in (expert, source) order.
    std::vector<int64_t> received_at(ep * el, 0);
    for (int64_t s = 0; s < ep; ++s) {
      for (int64_t e = k.first; e < k.end; ++e) {
        received_at[s * el + e] = k.received;
        k.recv_rows[s] += counts[s * el + e];
        k.received += counts[s * el + e];
      }
    }
    std::vector<int64_t> regroup;
    regroup.reserve(k.received);
    for (int64_t e = k.first; e < k.end; ++e) {
      k.rows_per_local_expert[e] = plan.rows_per_local_expert()[e];
      for (int64_t s = 0; s < ep; ++s) {
        const int64_t at = received_at[s * el + e];
        for (int64_t i = 0; i < counts[s * el + e]; ++i) regroup.push_back(at + i);
      }
    }
    k.regroup = IndexOn(regroup, dev, ctx);
    k.ungroup = IndexOn(Inverse(regroup), dev, ctx);
  }
  SY_CHECK_EQ(static_cast<int64_t>(to_chunk_major.size()), num_assignments_);
  to_chunk_major_ = IndexOn(to_chunk_major, dev, ctx);
  from_chunk_major_ = IndexOn(Inverse(to_chunk_major), dev, ctx);
}

Tensor ChunkedExchange::Run(const Tensor& rows, dist::CommThread& comm, const Compute& compute,
                            const std::function<void()>& meanwhile, DeviceContext* ctx,
                            Phase there, Phase back_phase) const {
  SY_CHECK(rows.ndim() == 2 && rows.dim(0) == num_assignments_)
      << "ChunkedExchange::Run: rows " << ShapeString(rows.shape()) << " for "
      << num_assignments_ << " assignments";
  SY_CHECK_EQ(comm.comm().size(), ep_size_) << "ChunkedExchange: plan built for another ep group";
  const int64_t d = rows.dim(1), n = chunks();
  const Device dev = rows.device();
  std::vector<std::unique_ptr<dist::TimedWork>> out(n), back(n);
  std::vector<Tensor> received(n);
  Tensor returned = Tensor::Empty({num_assignments_, d}, DType::kF32, dev);  // chunk-major
  {
    // Every chunk's rows leave at once, chunk 0 first.
    ScopedPhase phase(there);
    const Tensor chunked = RowsAt(rows, to_chunk_major_, ctx);
    for (int64_t c = 0; c < n; ++c) {
      const Chunk& k = chunks_[c];
      received[c] = Tensor::Empty({k.received, d}, DType::kF32, dev);
      out[c] = comm.AllToAllV(chunked.Slice(k.send_offset, k.send_offset + k.sent), k.send_rows,
                              received[c], k.recv_rows);
    }
  }
  if (meanwhile) {
    ScopedPhase phase(Phase::kExperts);
    meanwhile();
  }
  for (int64_t c = 0; c < n; ++c) {
    const Chunk& k = chunks_[c];
    Tensor grouped;
    {
      ScopedPhase phase(there);
      Finish(*out[c], comm.comm());
      grouped = RowsAt(received[c], k.regroup, ctx);
      received[c] = Tensor();
    }
    Tensor result;
    {
      ScopedPhase phase(Phase::kExperts);
      result = compute(c, grouped);
    }
    SY_CHECK(result.ndim() == 2 && result.dim(0) == k.received && result.dim(1) == d)
        << "ChunkedExchange: chunk " << c << " computed " << ShapeString(result.shape())
        << " for " << k.received << " rows";
    ScopedPhase phase(back_phase);
    Tensor slot = returned.Slice(k.send_offset, k.send_offset + k.sent);
    back[c] = comm.AllToAllV(RowsAt(result, k.ungroup, ctx), k.recv_rows, slot, k.send_rows);
  }
  ScopedPhase phase(back_phase);
  for (int64_t c = 0; c < n; ++c) Finish(*back[c], comm.comm());
  return RowsAt(returned, from_chunk_major_, ctx);
}

}  // namespace switchyard::moe
