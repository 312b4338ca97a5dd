#include "engine/train/pipeline_runner.h"

#include <chrono>
#include <optional>

namespace switchyard::train {

using parallel::ActionKind;

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

PipelineRunner::PipelineRunner(model::Decoder& decoder, dist::Communicator& pp,
                               parallel::PipelineSchedule schedule, int micro_batches)
    : decoder_(decoder), pp_(pp), micro_batches_(micro_batches) {
  SY_CHECK_OK(parallel::CheckScheduleArgs(schedule, pp.size(), micro_batches, 1));
  actions_ = parallel::ScheduleActions(schedule, pp.size(), micro_batches, 1, pp.rank());
}

Tensor PipelineRunner::Recv(const Shape& shape, int peer) {
  Tensor t = Tensor::Empty(shape, DType::kF32, decoder_.device());
  pp_.RecvAsync(t, peer)->Wait();
  return t;
}

void PipelineRunner::Send(const Tensor& t, int peer) {
  sends_.push_back({pp_.SendAsync(t, peer), t});
}

void PipelineRunner::WaitSends() {
  for (Pending& p : sends_) p.work->Wait();
  sends_.clear();
}

void PipelineRunner::RunStep(const Hooks& hooks) {
  std::vector<model::DecoderInput> inputs(micro_batches_);
  std::vector<std::optional<model::DecoderOutput>> outs(micro_batches_);
  std::vector<Tensor> received(micro_batches_);  // activation, then gradient, of micro m
  int last_backward = -1;
  for (size_t i = 0; i < actions_.size(); ++i)
    if (actions_[i].kind == ActionKind::kBackward) last_backward = static_cast<int>(i);
  if (trace_ != nullptr) {
    trace_->actions.clear();
    trace_->begin = Now();
  }
  for (size_t i = 0; i < actions_.size(); ++i) {
    const parallel::Action& a = actions_[i];
    const int m = a.micro_batch;
    const double start = trace_ != nullptr ? Now() : 0;
    switch (a.kind) {
      case ActionKind::kRecvActivation:
      case ActionKind::kRecvGradient: {
        if (!inputs[m].tokens.defined()) inputs[m] = hooks.input(m);
        const Shape shape = decoder_.HiddenShape(inputs[m].tokens.dim(0), inputs[m].tokens.dim(1));
        received[m] = Recv(shape, a.peer);
        break;
      }
      case ActionKind::kForward: {
        if (!inputs[m].tokens.defined()) inputs[m] = hooks.input(m);
        if (!decoder_.stage().embedding) inputs[m].hidden = received[m];
        received[m] = Tensor();
        outs[m].emplace(decoder_.Forward(inputs[m]));
        if (hooks.after_forward) hooks.after_forward(m, *outs[m]);
        break;
      }
      case ActionKind::kSendActivation:
        Send(outs[m]->hidden, a.peer);
        break;
      case ActionKind::kBackward: {
        if (!decoder_.stage().head) outs[m]->grad_hidden = received[m];
        received[m] = Tensor();
        if (hooks.before_backward) hooks.before_backward(m);
        const bool last = static_cast<int>(i) == last_backward;
        decoder_.Backward(inputs[m], *outs[m],
                          last ? hooks.on_last_backward_done
                               : std::function<void(const std::string&)>());
        if (hooks.after_backward) hooks.after_backward(m);
        // What the previous stage needs is kept until its send; the activations go.
        if (decoder_.stage().embedding) outs[m].reset();
        break;
      }
      case ActionKind::kSendGradient:
        Send(outs[m]->grad_input, a.peer);
        outs[m].reset();
        break;
    }
    if (trace_ != nullptr) trace_->actions.push_back({a, start, Now()});
  }
  WaitSends();
  if (trace_ != nullptr) trace_->end = Now();
}

model::DecoderOutput PipelineRunner::Forward(model::DecoderInput in) {
  const model::Stage& stage = decoder_.stage();
  const int rank = pp_.rank();
  if (!stage.embedding) {
    in.hidden = Recv(decoder_.HiddenShape(in.tokens.dim(0), in.tokens.dim(1)), rank - 1);
  }
  model::DecoderOutput out = decoder_.Forward(in);
  if (!stage.head) {
    Send(out.hidden, rank + 1);
    WaitSends();
  }
  return out;
}

}  // namespace switchyard::train
