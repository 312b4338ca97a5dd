// The input embedding of the decoder (MODEL.md section 1):
//   x0 = wte[tokens] (+ wpe[positions] when position = learned)
// wte (V, d) is the token table; wpe (S_max, d) the learned position table, present when
// max_positions > 0 (position = rope leaves it out: the rotation happens inside attention).
// Positions are the sequence index 0..S-1 of each row of tokens.
//
// With tie_embeddings the LM head is wte^T: the model computes logits = h @ wte^T through
// kernels::Gemm on wte() and adds the head's gradient into grad_wte() (both handles share the
// parameter's storage), so one tensor carries both uses.
//
// Vocabulary parallelism (options.tp, Megatron-LM's VocabParallelEmbedding): the vocabulary
// is padded to a multiple of tp (padded_vocab()) and rank r holds the rows
// [r*Vp/tp, (r+1)*Vp/tp) of wte; each rank looks up the tokens it holds (zeros for the
// others) and the partial sums leave the tensor-parallel region (all-reduce, or
// reduce-scatter to the rank's rows under sequence parallelism): exactly one rank
// contributes each row, so the sum equals the one-rank lookup bit for bit. The padding rows
// stay zero, are never looked up, and are not part of the parameter (Parameters() lists
// only the real rows, so checkpoints hold the (V, d) table). wpe is whole on every rank and
// added by rank 0 before the reduction; its gradient is rank 0's, summed over tp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/parallel/context_parallel.h"
#include "dense/parameter.h"
#include "dense/tp_block.h"
#include "kernels/embedding.h"
#include "engine/parallel/vocab_parallel.h"
#include "engine/core/device_context.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"

namespace switchyard::dense {

struct EmbeddingOptions {
  int64_t vocab_size = 0;     // V; required
  int64_t d_model = 0;        // d; required
  int64_t max_positions = 0;  // S_max of the learned table wpe; 0: no wpe (rope)
  Device device = Device::Cpu();
  TensorParallel tp;          // vocabulary parallelism; none by default
  parallel::ContextParallel cp;         // tokens (2B, S/(2c)) in cp's local layout: global positions

  // V rounded up to a multiple of tp; the rows this rank holds, the first of them, and how
  // many of them are real vocabulary (the rest is padding).
  int64_t local_rows() const { return Range().shard_cols; }
  int64_t vocab_start() const { return Range().start; }
  int64_t valid_rows() const { return Range().valid_cols; }
  parallel::VocabRange Range() const {
    return parallel::VocabRangeOf(vocab_size, tp.size(), tp.rank());
  }

  // Names the field and the value it rejects ("embedding.vocab_size=0 must be > 0").
  Status Validate() const;
};

// wte (V, d); wpe (S_max, d) when max_positions > 0, else undefined.
struct EmbeddingParams {
  Tensor wte, wpe;
};

// What Backward needs from one Forward.
struct EmbeddingActivations {
  Tensor tokens;  // (B, S) i32, shared with the caller: keep it unchanged
  kernels::IdCheck id_check = kernels::IdCheck::kOnDevice;  // as Forward was told
  Tensor y;       // (B, S, d); this rank's rows (B*S/tp, d) under sequence parallelism
};

class Embedding {
 public:
  // Tables and gradients allocated and zeroed. Checks Validate().
  explicit Embedding(const EmbeddingOptions& options, DeviceContext* ctx = nullptr);
  // wte and wpe ~ N(0, std^2) keyed by RngKey{seed, StreamId(name + ".wte")} (".wpe") at
  // element offset 0 (element (v, j) is global index v * d + j).
  static Embedding Init(const EmbeddingOptions& options, uint64_t seed, const std::string& name,
                        float std = 0.02f, DeviceContext* ctx = nullptr);
  // Takes (shares) the given tables; errors name the tensor and what is wrong.
  static StatusOr<Embedding> FromTensors(const EmbeddingOptions& options, EmbeddingParams params,
                                         DeviceContext* ctx = nullptr);

  Embedding(Embedding&&) = default;
  Embedding& operator=(Embedding&&) = default;
  Embedding(const Embedding&) = delete;
  Embedding& operator=(const Embedding&) = delete;

  // tokens (B, S) i32 in [0, V), S <= S_max with wpe -> acts.y (B, S, d).
  // id_check: kOnHost when the caller checked the tokens against the vocabulary on the host
  // (kernels/embedding.h: no device readback then); Backward does as Forward was told.
  EmbeddingActivations Forward(const Tensor& tokens, DeviceContext* ctx = nullptr,
                               kernels::IdCheck id_check = kernels::IdCheck::kOnDevice) const;
  // dy (B, S, d): scatter-adds into grad_wte (repeated tokens sum) and grad_wpe. Tokens
  // have no gradient.
  void Backward(const EmbeddingActivations& acts, const Tensor& dy, DeviceContext* ctx = nullptr);
  void ZeroGrad(DeviceContext* ctx = nullptr);

  const EmbeddingOptions& options() const { return options_; }
  Tensor wte() const { return wte_; }
  Tensor wpe() const { return wpe_; }
  Tensor grad_wte() const { return grad_wte_; }
  Tensor grad_wpe() const { return grad_wpe_; }
  // "wte", then "wpe" when it exists.
  std::vector<Parameter> Parameters() const;

 private:
  Embedding(const EmbeddingOptions& options, EmbeddingParams params, DeviceContext* ctx);

  EmbeddingOptions options_;
  Tensor wte_, wpe_;
  Tensor grad_wte_, grad_wpe_;
};

}  // namespace switchyard::dense
