// The experts (MODEL.md section 2): a block of `num_local` expert MLPs, the slice
// [first, first + num_local) of the E global experts that one expert-parallel rank holds.
// Expert e maps a row x (d) to
//   gelu / relu:  y = act(x @ W1[e] + b1[e]) @ W2[e] + b2[e]
//   swiglu:       y = (silu(x @ W1[e] + b1[e]) * (x @ W3[e])) @ W2[e] + b2[e]
// (biases only with `bias`; swiglu has no bias on the W3 branch). The rows arrive grouped
// by local expert (the dispatcher's output), so every matrix product is one grouped GEMM
// over contiguous row blocks (kernels/gemm.h); experts with zero rows are skipped.
//
// Forward returns an ExpertsActivations holding what Backward needs (llm.c style: the
// caller keeps it), so several micro-batches can be in flight at once. Backward adds the
// parameter gradients into the grad tensors (+=) and returns dx; ZeroGrad clears them.
//
// Devices: parameters, gradients and activations live on options.device; every call runs
// its kernels on ctx's stream (ctx required on CUDA, may be null on the CPU). The row
// counts per expert are host values, or device offsets (the device-sized Forward).
//
// Dense MLPs reuse the same code: a DenseMlp is an Experts with num_local = 1 and all rows
// in its one group. Shared experts (DeepSeek; num_shared_experts copies of hidden
// d_shared, all applied to every token and summed) are ONE DenseMlp of hidden
// n * d_shared, n = num_shared_experts: concatenating the copies' hidden units gives the
// same function,
//   sum_i act(x W1_i + b1_i) W2_i = act(x [W1_1 .. W1_n] + [b1_1 .. b1_n]) [W2_1; ..; W2_n],
// and with `bias` the copies' b2 vectors collapse into one b2 (DeepSeek-V2/V3 do the same).
// SharedExpertsOptions builds those options from a MoEConfig.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/parallel/parameter.h"
#include "kernels/activation_storage.h"
#include "kernels/gemm.h"
#include "moe/moe_config.h"

namespace switchyard::moe {

// Shapes and placement of a block of experts.
struct ExpertsOptions {
  int64_t d_model = 0;   // d; required
  int64_t d_hidden = 0;  // f, each expert's hidden size; required
  Activation activation = Activation::kGelu;
  bool bias = false;      // b1 (f) and b2 (d) per expert
  int64_t first = 0;      // global index of the first local expert
  int64_t num_local = 1;  // experts held here, >= 1
  Device device = Device::Cpu();
  // The whole layer, for the parameter descriptions: E experts (0: first + num_local), and
  // with expert tensor parallelism this block's hidden units [hidden_offset, +d_hidden) of
  // hidden_total (0: d_hidden). Only etp rank 0 adds b2 (the partial outputs are summed).
  int64_t num_experts = 0;
  int64_t hidden_offset = 0, hidden_total = 0;
  bool adds_output_bias = true;

  int64_t experts_total() const { return num_experts > 0 ? num_experts : first + num_local; }
  int64_t hidden_whole() const { return hidden_total > 0 ? hidden_total : d_hidden; }

  // Names the field and the value it rejects ("experts.d_hidden=0 must be > 0").
  Status Validate() const;
};

// The routed experts [first, first + num_local) of `config` (see MoEConfig::ExpertsPerRank).
ExpertsOptions RoutedExpertsOptions(const MoEConfig& config, int64_t first, int64_t num_local,
                                    Device device = Device::Cpu());
// The shared experts of `config` as one dense MLP of hidden
// num_shared_experts * shared_hidden() (see the header comment). Requires
// num_shared_experts > 0.
ExpertsOptions SharedExpertsOptions(const MoEConfig& config, Device device = Device::Cpu());

// The parameters, for loading (Experts::FromTensors). Shapes, with L = num_local:
//   w1 (L, d, f), w2 (L, f, d), w3 (L, d, f) swiglu only, b1 (L, f) and b2 (L, d) with bias.
// Absent ones are undefined tensors.
struct ExpertsParams {
  Tensor w1, w2, w3, b1, b2;
};


// What Backward needs from one Forward; R rows, f = d_hidden. Under bf16 activation storage
// (kernels/activation_storage.h) x (unless Forward was told KeepInput::kAsGiven) and h are
// the bf16 operands the products read, and a and b are kept rounded to bf16 (the forward
// computed h from their f32 values).
struct ExpertsActivations {
  Tensor x;                   // (R, d) the input, shared with the caller: keep it unchanged
  std::vector<int64_t> rows;  // (num_local) rows per local expert, sum R (host-sized)
  Tensor offsets;             // or (num_local + 1) i64 on the device: device-sized groups,
                              // rows past offsets[num_local] in no group (rows is empty)
  Tensor a;                   // (R, f) x @ W1 + b1, before the activation
  Tensor b;                   // (R, f) x @ W3; swiglu only
  Tensor h;                   // (R, f) act(a), or silu(a) * b
  Tensor y;                   // (R, d) the output, h @ W2 + b2 (Backward does not read it: the
                              // MoE layer releases it once combined)
  // How the CPU ran the grouped GEMMs (kernels/gemm.h); Backward runs its own the same way.
  kernels::GroupSchedule schedule = kernels::GroupSchedule::kAuto;
};

class Experts {
 public:
  // Parameters and gradients allocated and zeroed on options.device. Checks Validate().
  explicit Experts(const ExpertsOptions& options, DeviceContext* ctx = nullptr);
  // Weights drawn from N(0, std^2), keyed by RngKey{seed, StreamId(name + ".w1")} (".w2",
  // ".w3") over the whole (E, d, f) tensor and sliced to this block's box
  // (parallel::FillNormalBox): every ep / etp split of the experts holds the same values as
  // one object holding all of them. Biases start at zero.
  static Experts Init(const ExpertsOptions& options, uint64_t seed, const std::string& name,
                      float std = 0.02f, DeviceContext* ctx = nullptr) {
    return Init(options, seed, name, std, std, ctx);
  }
  // The same with the output projection W2 drawn from N(0, out_std^2) (Megatron's
  // output_layer_init_method: the scaled residual init), W1 and W3 from N(0, std^2).
  static Experts Init(const ExpertsOptions& options, uint64_t seed, const std::string& name,
                      float std, float out_std, DeviceContext* ctx = nullptr);
  // Takes (shares, does not copy) the given parameters, e.g. loaded from a checkpoint.
  // Errors name the tensor and the shape, dtype or device it rejects.
  static StatusOr<Experts> FromTensors(const ExpertsOptions& options, ExpertsParams params,
                                       DeviceContext* ctx = nullptr);

  Experts(Experts&&) = default;
  Experts& operator=(Experts&&) = default;
  Experts(const Experts&) = delete;  // a copy would silently share the parameters
  Experts& operator=(const Experts&) = delete;

  // x (R, d), rows grouped by local expert: rows_per_expert (num_local counts, sum R).
  // Returns the activations; the output is its `y` (R, d). schedule: how the CPU runs the
  // grouped GEMMs of this call and of its Backward (kAuto: from rows_per_expert). Running
  // some experts (the others given zero rows) under the schedule of a call over all of them
  // gives each the bits that call gives it (the overlap chunks, moe/overlap.h).
  // keep: what acts.x holds (kernels::KeptOperand): the products' operand (bf16 under bf16
  // activation storage), or x as given (an input its producer keeps in f32 anyway).
  ExpertsActivations Forward(const Tensor& x, std::span<const int64_t> rows_per_expert,
                             DeviceContext* ctx = nullptr,
                             kernels::GroupSchedule schedule = kernels::GroupSchedule::kAuto,
                             kernels::KeepInput keep = kernels::KeepInput::kOperand) const;
  // The same with the groups sized on the device (the dropless experts on one ep rank, no
  // host wait): offsets (num_local + 1) i64 on x's device, group e = rows [offsets[e],
  // offsets[e + 1]) of x, as kernels/gemm.h's device-sized products take them. Rows from
  // offsets[num_local] on are in no group: y's are not written, Backward's dx's neither.
  // On the CPU the same bits as the host-sized Forward with kAuto (and its Backward).
  // zero_past_groups: y's rows past the groups are zeros instead of unwritten (the MoE layer's
  // dropped rows, which the combine reads as it keeps its rows).
  ExpertsActivations Forward(const Tensor& x, const Tensor& offsets, DeviceContext* ctx = nullptr,
                             bool zero_past_groups = false) const;
  // dy (R, d) for acts.y. Adds into every parameter gradient; returns dx (R, d).
  Tensor Backward(const ExpertsActivations& acts, const Tensor& dy, DeviceContext* ctx = nullptr);
  // Sets every gradient to zero.
  void ZeroGrad(DeviceContext* ctx = nullptr);

  const ExpertsOptions& options() const { return options_; }
  // Handles sharing storage with the parameters (write through them to load); undefined
  // where the parameter does not exist (w3 without swiglu, b1/b2 without bias).
  Tensor w1() const { return w1_; }
  Tensor w2() const { return w2_; }
  Tensor w3() const { return w3_; }
  Tensor b1() const { return b1_; }
  Tensor b2() const { return b2_; }
  Tensor grad_w1() const { return grad_w1_; }
  Tensor grad_w2() const { return grad_w2_; }
  Tensor grad_w3() const { return grad_w3_; }
  Tensor grad_b1() const { return grad_b1_; }
  Tensor grad_b2() const { return grad_b2_; }
  // The parameters that exist, in the order w1, w2, w3, b1, b2, as boxes of the whole
  // layer's tensors: the experts on dim 0 (split over ep), the hidden units on dim 2 of
  // w1/w3 and dim 1 of w2/b1 (split over etp). view kDense: replicated over dp x cp (a
  // dense MLP, the shared experts); kExpert: over edp (routed experts). Under a hidden
  // split (hidden_whole() > d_hidden) b2 is whole on every rank of the split and added
  // by one of them (adds_output_bias): ReplicatedOver(kTp, grad_summed), kTp being etp in
  // the expert view.
  std::vector<parallel::Parameter> Parameters(dist::View view = dist::View::kDense) const;

 private:
  Experts(const ExpertsOptions& options, ExpertsParams params, DeviceContext* ctx);
  // Forward's work once acts' groups (rows and schedule, or offsets) are set.
  void ForwardInto(const Tensor& x, ExpertsActivations& acts, DeviceContext* ctx,
                   kernels::KeepInput keep, bool zero_past_groups = false) const;
  // Its last product, y = h W2 (+ b2), from acts.h.
  void ForwardOutput(ExpertsActivations& acts, bool zero_past_groups, DeviceContext* ctx) const;

  ExpertsOptions options_;
  Tensor w1_, w2_, w3_, b1_, b2_;
  Tensor grad_w1_, grad_w2_, grad_w3_, grad_b1_, grad_b2_;
};

// A dense MLP applied to every row: one expert holding all rows. Shared experts are one
// DenseMlp built from SharedExpertsOptions.
class DenseMlp {
 public:
  // Checks experts.options().num_local == 1.
  explicit DenseMlp(Experts experts);

  // x (R, d) -> acts.y (R, d). acts.x is x as given (KeepInput::kAsGiven): the shared
  // experts' input is the MoE layer's input, which the router keeps in f32.
  ExpertsActivations Forward(const Tensor& x, DeviceContext* ctx = nullptr) const;
  // Adds into the gradients; returns dx (R, d).
  Tensor Backward(const ExpertsActivations& acts, const Tensor& dy, DeviceContext* ctx = nullptr);

  Experts& experts() { return experts_; }
  const Experts& experts() const { return experts_; }

 private:
  Experts experts_;
};

}  // namespace switchyard::moe
