// bf16 shadows of f32 weights for runtime.precision=bf16 (DESIGN.md, "GPU speed"): each
// matrix product in bf16 mode reads bf16 operands, and without shadows every product
// converts its f32 weight again (forward, backward, every micro-batch). A DeviceContext
// holds one WeightShadows table; the trainer registers the weights once and opens a window
// per optimizer step (Activate at the step's start, Deactivate after its update): inside
// it, the first product that reads a registered weight writes its bf16 copy (one
// conversion of the whole weight), and every later product reads that copy. Outside a
// window, or for a tensor that is not registered, a product converts its operand as
// before. The shadow holds exactly the values a product's own conversion produces (the
// same rounding of the same f32 values), so results are bit-identical with or without it.
//
// The table is passive storage: kernels/gemm.cc looks operands up (Find) and writes the
// shadow with kernels::Cast. A weight's values must not change inside a window (the
// optimizer's update closes it first); weights whose storage is released between uses
// (ZeRO stage 3) must not be registered.
//
// The optimizer's update can write a shadow in the pass that writes the new weights
// (UpdateTarget; kernels::AdamWTensors::shadow): that shadow is fresh when the next window
// opens, and no product converts the weight in that step. Whoever changes registered weights
// otherwise between a step's update and the next window (a checkpoint load) calls
// Invalidate.
#pragma once

#include <cstdint>
#include <map>

#include "engine/core/tensor.h"

namespace switchyard {

class WeightShadows {
 public:
  // `weight`: a defined f32 tensor (kept alive by the table until Clear). Registering the
  // same storage twice is a no-op; overlapping storage is a fatal error.
  void Register(const Tensor& weight);
  // Drops every registration and shadow.
  void Clear();
  bool empty() const { return entries_.empty(); }
  int64_t size() const { return static_cast<int64_t>(entries_.size()); }

  // Opens a window: every shadow is stale (written again at its first use) but those the
  // last update wrote (UpdateTarget since the last window). No-op when disabled.
  void Activate();
  // The shadow an update of the whole registered `weight` (the same storage) should write
  // with the new values, marked to be fresh at the next Activate; undefined when the table
  // is disabled, the weight is not registered, or its shadow was never allocated (no product
  // has read it: it is written at its first use as before).
  Tensor UpdateTarget(const Tensor& weight);
  // Forgets what updates wrote: the next window writes every shadow at its first use.
  void Invalidate();
  // Closes the window: products convert per call again; shadows keep their memory.
  void Deactivate();
  bool active() const { return active_; }
  // Off: Activate does nothing (products convert per call; the registrations still count
  // weight conversions). On by default.
  void set_enabled(bool enabled) { enabled_ = enabled; }
  bool enabled() const { return enabled_; }

  // What Find returns for an operand inside a registered weight.
  struct Match {
    Tensor weight;        // the whole registered f32 weight
    Tensor* shadow;       // its bf16 copy (shape of weight; undefined until first written),
                          // holding the weight's values iff *fresh
    bool* fresh;          // the copy holds this window's values
    int64_t offset = 0;   // the operand's first element within the weight
  };
  // The registered weight whose storage contains all of `operand` (an f32 tensor), or
  // nothing (match.shadow == nullptr).
  Match Find(const Tensor& operand);

 private:
  struct Entry {
    Tensor weight;
    Tensor shadow;  // bf16, allocated at the first use
    bool fresh = false;
    bool updated = false;  // written by an update since the last window (UpdateTarget)
  };
  std::map<uintptr_t, Entry> entries_;  // by the weight's first byte
  bool active_ = false;
  bool enabled_ = true;
};

}  // namespace switchyard
