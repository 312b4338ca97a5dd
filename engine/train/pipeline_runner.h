// One training step's micro-batches through this rank's pipeline stages, in the order a
// schedule gives (engine/parallel/pipeline_schedule.h): the forwards and backwards of the
// rank's model chunks (one decoder each: one chunk, or parallel.virtual_stages of them
// under the interleaved schedule), the activations to the next model stage and the
// gradients back to the previous one by non-blocking send/recv on the pp communicator.
// Sends are posted and never waited for before the end of the step, but after every action
// (and before a recv waits) the completed ones are released (Work::Test), so a sent tensor
// lives until the peer has taken it, not until the step ends; a recv is waited for before
// the forward or backward that reads it, which is the execution rule the schedules are
// validated against, so no schedule the config accepts can deadlock. With pp = 1 the 1F1B
// list is forward 0, backward 0, forward 1, ...: the plain gradient-accumulation loop.
//
// What a step does around the stages (inputs, statistics, gradient accumulation and the
// gradient buckets) is the caller's, through the hooks.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/dist/communicator.h"
#include "engine/model/decoder.h"
#include "engine/parallel/pipeline_schedule.h"

namespace switchyard::train {

class PipelineRunner {
 public:
  // pp: this rank's pipeline group (rank = pipeline rank). chunks: the rank's decoders in
  // chunk order (chunk c is model stage c * pp + rank).
  PipelineRunner(std::vector<model::Decoder*> chunks, dist::Communicator& pp,
                 parallel::PipelineSchedule schedule, int micro_batches);

  struct Hooks {
    // Micro-batch m's input (DecoderInput::hidden is filled in here on later stages).
    std::function<model::DecoderInput(int m)> input;
    // After the forward of micro-batch m on chunk c (its losses, statistics, routing).
    std::function<void(int c, int m, const model::DecoderOutput& out)> after_forward;
    // Just before the backward of micro-batch m on chunk c, and after it.
    std::function<void(int c, int m)> before_backward;
    std::function<void(int c, int m)> after_backward;
    // Passed to each chunk's last backward of the step as Decoder::Backward's on_done: each
    // part's gradient is final (the gradient buckets can go).
    std::function<void(const parallel::PartId& part)> on_last_backward_done;
    // The same for every other backward of the step (ZeRO-2/3 stream each micro-batch's
    // gradient buckets).
    std::function<void(const parallel::PartId& part)> on_backward_done;
  };
  void RunStep(const Hooks& hooks);

  // Optional per-action timing (benchmarks/pipeline_perf.cc measures the bubble from it):
  // while a trace is set, RunStep records when it began and ended (after its sends
  // completed) and when each action started and ended, in seconds on the steady clock
  // (CLOCK_MONOTONIC: comparable between the processes of one machine). A forward or
  // backward includes the hooks around it (inputs, statistics, gradient accumulation); a
  // recv is the wait for its message; a send is its posting. Off by default: then one
  // pointer test per action.
  struct ActionTime {
    parallel::Action action;
    double start = 0, end = 0;
  };
  struct StepTrace {
    double begin = 0, end = 0;
    std::vector<ActionTime> actions;  // in execution order
  };
  // Null turns tracing off. The trace is overwritten by every step and must outlive them.
  void set_trace(StepTrace* trace) { trace_ = trace; }

  // Forward only (evaluation): each chunk in turn receives the previous model stage's
  // output, runs and sends its output on. Every rank calls it for the same batches in the
  // same order. The losses are the head's (zero elsewhere), aux/z and moe_stats those of the
  // rank's MoE layers in moe_layer_ids() order.
  model::DecoderOutput Forward(const model::DecoderInput& in);

  const std::vector<parallel::Action>& actions() const { return actions_; }
  int chunks() const { return static_cast<int>(chunks_.size()); }
  model::Decoder& chunk(int c) { return *chunks_[c]; }
  dist::Communicator& pp() { return pp_; }
  // The rank's MoE layers over its chunks, in chunk order.
  std::vector<int64_t> moe_layer_ids() const;
  std::vector<moe::MoELayer*> moe_layers();

 private:
  Tensor Recv(const Shape& shape, int peer);
  void Send(const Tensor& t, int peer);
  // Drops the sends that have completed (their tensors with them); never waits.
  void ReleaseCompletedSends();
  void WaitSends();
  // "stage 1 (world rank 1)" (interleaved: "stages 1 3 (world rank 1)"): what pipeline
  // rank pp_rank holds, for the watchdog's report of a stalled send or receive.
  std::string StageName(int pp_rank) const;

  std::vector<model::Decoder*> chunks_;
  dist::Communicator& pp_;
  int micro_batches_;
  std::vector<parallel::Action> actions_;
  struct Pending {
    std::unique_ptr<dist::Work> work;
    Tensor tensor;  // alive until the send completes
    int peer = 0;   // its pipeline rank
  };
  std::vector<Pending> sends_;
  StepTrace* trace_ = nullptr;
};

}  // namespace switchyard::train
