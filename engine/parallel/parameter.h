// A parameter and its layout: the one description every part of the engine reads.
//
// A layer that owns a weight says how it is split (../shared/DESIGN.md "A parameter's
// layout is data"); initialisation, gradient sync, clipping, the optimizer, ZeRO,
// checkpoints and the dry-run read the description and never parse names:
//
//   global_shape   the whole logical tensor, e.g. (E, d, f) for an expert weight
//   offset         per dim, where this rank's box starts; the box's size is value.shape()
//                  (box_shape when flat_value)
//                  (experts over ep on dim 0 and over etp on dim 2 is one box)
//   view           which view of the mesh the axes below refer to (dense or expert)
//   replicated     the mesh axes over which identical copies of this box live (dense:
//                  dp x cp; routed experts: edp; sequence-parallel norm weights, the
//                  router and row-parallel biases: also tp)
//   grad_sum       the axes over which gradient contributions are summed: a subset of
//                  replicated. Norm weights without sequence parallelism are replicated
//                  over tp, but every tp rank computes the whole gradient, so tp is not
//                  summed.
//   flat_begin/end the elements of the box (flattened, row-major) this rank owns under
//                  ZeRO (its optimizer state, its gradient shard); the whole box without it.
//   flat_value     value holds ONLY those elements, as a 1-D tensor, and box_shape gives
//                  the box's size (ZeRO shards: optimizer state, stage-3 parameters). A
//                  checkpoint saves and loads such an entry like any box, element range
//                  and all; false: value is the whole box.
//   part           the block of the model it belongs to (PartId: the embedding, layer i,
//                  the final norm, the head; named "embed", "layers.3", "norm_f", "head"):
//                  ZeRO-3 gathers a part at a time and the gradient sync buckets each part
//                  apart. Written by the model when it registers the block; kNone: none.
//   tied           one of the copies of a weight that several pipeline stages hold (tied
//                  embeddings: the first stage's token table and the last stage's copy
//                  for the head); their gradients are summed between those stages.
#pragma once

#include <compare>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"
#include "engine/dist/mesh.h"

namespace switchyard::parallel {

// A set of mesh axes (one bit per dist::Axis) of one view.
class AxisSet {
 public:
  constexpr AxisSet() = default;
  AxisSet(std::initializer_list<dist::Axis> axes);
  bool Has(dist::Axis axis) const { return (bits_ >> static_cast<int>(axis)) & 1u; }
  AxisSet With(dist::Axis axis) const;
  bool empty() const { return bits_ == 0; }
  // Every axis of *this is in other.
  bool SubsetOf(AxisSet other) const { return (bits_ & ~other.bits_) == 0; }
  std::vector<dist::Axis> Axes() const;
  uint8_t bits() const { return bits_; }
  bool operator==(const AxisSet&) const = default;
  // "dp,cp,tp" with the view's names ("edp,etp" in the expert view).
  std::string ToString(dist::View view) const;

 private:
  uint8_t bits_ = 0;
};

// The block of the model a parameter belongs to: what ZeRO-3 gathers at once and what
// backward finishes at once. A tied head without the embedding on its stage holds the
// token table's copy, which belongs to kEmbed.
struct PartId {
  enum class Kind : uint8_t { kNone, kEmbed, kLayer, kNormF, kHead };
  Kind kind = Kind::kNone;
  int64_t layer = -1;  // kLayer: the model's layer index; -1 else

  static PartId Embed() { return {Kind::kEmbed, -1}; }
  static PartId Layer(int64_t i) { return {Kind::kLayer, i}; }
  static PartId NormF() { return {Kind::kNormF, -1}; }
  static PartId Head() { return {Kind::kHead, -1}; }
  bool none() const { return kind == Kind::kNone; }
  // "embed", "layers.3", "norm_f", "head" ("" for kNone): the registry names' prefix.
  std::string Name() const;
  bool operator==(const PartId&) const = default;
  auto operator<=>(const PartId&) const = default;
};

struct Parameter {
  std::string name;  // stable and layout-independent: "layers.1.moe.experts.w1"
  Shape global_shape;
  std::vector<int64_t> offset;  // per dim; empty means all zero
  dist::View view = dist::View::kDense;
  AxisSet replicated;  // identical copies live over these axes
  AxisSet grad_sum;    // gradient contributions are summed over these (subset of replicated)
  int64_t flat_begin = 0, flat_end = -1;  // ZeRO: owned elements of the box; -1: to the end
  bool flat_value = false;   // value holds only [flat_begin, flat_end) of the box (1-D)
  Shape box_shape;           // the box's size when flat_value (else value.shape())
  bool trainable = true;     // false: persistent state the optimizer skips (expert bias)
  bool weight_decay = true;  // AdamW decays it (matrices, not biases or norm weights)
  float lr_scale = 1.0f;     // its learning rate is the step's times this (moe.router_lr_scale)
  Tensor value;              // this rank's box (shares storage with the layer)
  Tensor grad;               // the box's gradient; undefined when not trainable
  PartId part;               // the model's block (layer 3); see the file comment
  bool tied = false;         // a pipeline-stage copy of a tied weight (file comment)

  // The usual dense parameter: whole, replicated and gradient-summed over dp x cp.
  static Parameter Dense(std::string name, Tensor value, Tensor grad, bool weight_decay);
  // A routed expert parameter: expert view, replicated and gradient-summed over edp.
  static Parameter Expert(std::string name, Tensor value, Tensor grad, bool weight_decay);

  // This rank's box covers [at, at + value.dim(dim)) of a global extent `global` along dim.
  Parameter& Split(int dim, int64_t at, int64_t global);
  // Identical copies also live over `axis`; their gradients are summed over it when
  // grad_summed (each copy saw part of the data), else each copy has the whole gradient.
  Parameter& ReplicatedOver(dist::Axis axis, bool grad_summed);

  int64_t OffsetAt(int dim) const { return offset.empty() ? 0 : offset[dim]; }
  // The size of this rank's box: value.shape(), or box_shape when value is a flat range.
  const Shape& BoxShape() const { return flat_value ? box_shape : value.shape(); }
  // The end of the owned flat range (flat_end, or the box's element count for -1).
  int64_t FlatEnd() const { return flat_end < 0 ? NumElements(BoxShape()) : flat_end; }
  // The box is the whole global tensor.
  bool is_whole() const { return BoxShape() == global_shape; }
  // "layers.0.attn.q.weight (64, 32) of (64, 64) at [0, 32], over dp,cp".
  std::string Describe() const;
  // Checks the description against value/grad: the box inside global_shape, grad_sum a
  // subset of replicated, grad of the box's shape when trainable. A failure names the
  // parameter and what is wrong (a programming error: SY_CHECK).
  void CheckConsistent() const;
};

// Prefixes every name with "<prefix>." and appends to out.
void AppendPrefixed(const std::string& prefix, std::vector<Parameter> params,
                    std::vector<Parameter>& out);

// An ordered list of parameters (registration order is the model's order).
class ParameterRegistry {
 public:
  // Adds a parameter; names must be unique and the description consistent (checked).
  void Add(Parameter p);
  std::vector<Parameter>& params() { return params_; }
  const std::vector<Parameter>& params() const { return params_; }
  // The parameter called `name`, or null.
  Parameter* Find(const std::string& name);
  const Parameter* Find(const std::string& name) const;
  // Zeroes every gradient, ordered on ctx's stream for device tensors.
  void ZeroGrad(DeviceContext* ctx = nullptr);
  // Elements of the whole model (global shapes, every parameter counted once).
  int64_t GlobalElements(bool trainable_only = true) const;

 private:
  std::vector<Parameter> params_;
};

// Fills `box` (the box of a global tensor starting at `offset`, box.shape() its size) with
// the values a whole-tensor kernels::FillNormal(whole, key, 0, mean, std) would put there:
// element (i0, i1, ...) of the global tensor is counter index sum_k i_k * stride_k. Any box
// of any layout holds exactly the numbers one rank would (DESIGN.md "Init whole, then
// slice").
void FillNormalBox(Tensor& box, const Shape& global, const std::vector<int64_t>& offset,
                   uint64_t seed, const std::string& stream_name, float mean, float std,
                   DeviceContext* ctx = nullptr);

// FillNormalBox for a parameter's value, keyed by its name (or `stream_name` when given).
void InitNormal(Parameter& p, uint64_t seed, float std, DeviceContext* ctx = nullptr,
                const std::string& stream_name = "");

}  // namespace switchyard::parallel
