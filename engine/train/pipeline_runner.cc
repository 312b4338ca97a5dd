#include "engine/train/pipeline_runner.h"

#include <chrono>
#include <optional>

#include "engine/core/profile.h"
#include "engine/dist/watchdog.h"

namespace switchyard::train {

using parallel::ActionKind;

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

PipelineRunner::PipelineRunner(std::vector<model::Decoder*> chunks, dist::Communicator& pp,
                               parallel::PipelineSchedule schedule, int micro_batches)
    : chunks_(std::move(chunks)), pp_(pp), micro_batches_(micro_batches) {
  const int v = static_cast<int>(chunks_.size());
  SY_CHECK_OK(parallel::CheckScheduleArgs(schedule, pp.size(), micro_batches, v));
  actions_ = parallel::ScheduleActions(schedule, pp.size(), micro_batches, v, pp.rank());
  for (int r = 0; pp.size() > 1 && r < pp.size(); ++r) {
    std::string stages;
    for (int c = 0; c < v; ++c) stages += StrCat(c ? " " : "", c * pp.size() + r);
    dist::NameRankForWatchdog(pp.world_ranks()[r],
                              StrCat("pipeline ", v > 1 ? "stages " : "stage ", stages));
  }
}

std::string PipelineRunner::StageName(int pp_rank) const {
  std::string stages;
  for (int c = 0; c < chunks(); ++c) stages += StrCat(c ? " " : "", c * pp_.size() + pp_rank);
  return StrCat(chunks() > 1 ? "stages " : "stage ", stages, " (world rank ",
                pp_.world_ranks()[pp_rank], ")");
}

Tensor PipelineRunner::Recv(const Shape& shape, int peer) {
  ReleaseCompletedSends();  // before waiting: what the peers took need not wait with us
  Tensor t = Tensor::Empty(shape, DType::kF32, chunks_[0]->device());
  ScopedPhase phase(Phase::kCommunication);  // with the wait for the peer (the bubble)
  const dist::WatchdogNote note(StrCat("pipeline ", StageName(pp_.rank()), " receiving from ",
                                       StageName(peer)));
  pp_.RecvAsync(t, peer)->Wait();
  return t;
}

void PipelineRunner::Send(const Tensor& t, int peer) {
  ScopedPhase phase(Phase::kCommunication);
  sends_.push_back({pp_.SendAsync(t, peer), t, peer});
}

void PipelineRunner::ReleaseCompletedSends() {
  std::erase_if(sends_, [](Pending& p) { return p.work->Test(); });
}

void PipelineRunner::WaitSends() {
  ScopedPhase phase(Phase::kCommunication);
  for (Pending& p : sends_) {
    const dist::WatchdogNote note(StrCat("pipeline ", StageName(pp_.rank()), " sending to ",
                                         StageName(p.peer)));
    p.work->Wait();
  }
  sends_.clear();
}

void PipelineRunner::RunStep(const Hooks& hooks) {
  const int v = chunks(), m_count = micro_batches_;
  std::vector<model::DecoderInput> inputs(m_count);
  // Per (chunk, micro-batch): c * m_count + m.
  std::vector<std::optional<model::DecoderOutput>> outs(v * m_count);
  std::vector<Tensor> received(v * m_count);  // the activation, then the gradient
  // What a micro-batch holds on a chunk goes after the action parallel::ActivationReleases
  // names (the planner's walk reads the same rule).
  std::vector<bool> embedding(v);
  for (int c = 0; c < v; ++c) embedding[c] = chunks_[c]->stage().embedding;
  const std::vector<bool> frees = parallel::ActivationReleases(actions_, embedding);
  std::vector<int> last_backward(v, -1);
  for (size_t i = 0; i < actions_.size(); ++i)
    if (actions_[i].kind == ActionKind::kBackward) last_backward[actions_[i].chunk] = static_cast<int>(i);
  auto input = [&](int m) -> model::DecoderInput& {
    if (!inputs[m].tokens.defined()) inputs[m] = hooks.input(m);
    return inputs[m];
  };
  if (trace_ != nullptr) {
    trace_->actions.clear();
    trace_->begin = Now();
  }
  for (size_t i = 0; i < actions_.size(); ++i) {
    const parallel::Action& a = actions_[i];
    const int m = a.micro_batch, c = a.chunk, at = c * m_count + m;
    model::Decoder& chunk = *chunks_[c];
    const double start = trace_ != nullptr ? Now() : 0;
    switch (a.kind) {
      case ActionKind::kRecvActivation:
      case ActionKind::kRecvGradient: {
        const model::DecoderInput& in = input(m);
        received[at] = Recv(chunk.HiddenShape(in.tokens.dim(0), in.tokens.dim(1)), a.peer);
        break;
      }
      case ActionKind::kForward: {
        model::DecoderInput in = input(m);
        if (!chunk.stage().embedding) in.hidden = received[at];
        received[at] = Tensor();
        outs[at].emplace(chunk.Forward(in));
        if (hooks.after_forward) hooks.after_forward(c, m, *outs[at]);
        break;
      }
      case ActionKind::kSendActivation:
        Send(outs[at]->hidden, a.peer);
        break;
      case ActionKind::kBackward: {
        if (!chunk.stage().head) outs[at]->grad_hidden = received[at];
        received[at] = Tensor();
        if (hooks.before_backward) hooks.before_backward(c, m);
        model::DecoderInput in = input(m);
        chunk.Backward(in, *outs[at],
                       static_cast<int>(i) == last_backward[c] ? hooks.on_last_backward_done
                                                               : hooks.on_backward_done);
        if (hooks.after_backward) hooks.after_backward(c, m);
        break;
      }
      case ActionKind::kSendGradient:
        Send(outs[at]->grad_input, a.peer);
        break;
    }
    if (frees[i]) outs[at].reset();
    ReleaseCompletedSends();
    if (trace_ != nullptr) trace_->actions.push_back({a, start, Now()});
  }
  WaitSends();
  if (trace_ != nullptr) trace_->end = Now();
}

model::DecoderOutput PipelineRunner::Forward(const model::DecoderInput& in) {
  const int pp = pp_.size(), rank = pp_.rank();
  model::DecoderOutput total;
  for (model::Decoder* chunk : chunks_) {
    model::DecoderInput mine = in;
    if (!chunk->stage().embedding) {
      mine.hidden = Recv(chunk->HiddenShape(in.tokens.dim(0), in.tokens.dim(1)),
                         (rank + pp - 1) % pp);
    }
    model::DecoderOutput out = chunk->Forward(mine);
    if (!chunk->stage().head) {
      Send(out.hidden, (rank + 1) % pp);
      WaitSends();
    }
    total.ce_sum += out.ce_sum;
    total.ce_count += out.ce_count;
    total.aux_sum += out.aux_sum;
    total.z_sum += out.z_sum;
    for (moe::MoEStats& s : out.moe_stats) total.moe_stats.push_back(std::move(s));
    for (Tensor& t : out.moe_indices) total.moe_indices.push_back(std::move(t));
  }
  return total;
}

std::vector<int64_t> PipelineRunner::moe_layer_ids() const {
  std::vector<int64_t> out;
  for (const model::Decoder* c : chunks_)
    out.insert(out.end(), c->moe_layer_ids().begin(), c->moe_layer_ids().end());
  return out;
}

std::vector<moe::MoELayer*> PipelineRunner::moe_layers() {
  std::vector<moe::MoELayer*> out;
  for (model::Decoder* c : chunks_)
    for (moe::MoELayer* l : c->moe_layers()) out.push_back(l);
  return out;
}

}  // namespace switchyard::train
