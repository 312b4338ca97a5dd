// Shared by the decoder tests (decoder_test, stage_test, recompute_test, head_chunk_test):
// the Llama/Mixtral variants of a test's small GPT/Switch configs, one Forward + Backward
// with every gradient, and a chain of pipeline-stage decoders run as one model on one
// process.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/decoder.h"
#include "engine/model/model_config.h"
#include "moe/moe_config.h"

namespace switchyard::model::testing {

// `gpt` with rmsnorm, rope, swiglu, no biases, an untied head and 4 query / 2 kv heads.
inline ModelConfig LlamaLike(ModelConfig gpt) {
  gpt.norm = dense::NormKind::kRmsNorm;
  gpt.position = Position::kRope;
  gpt.activation = dense::Activation::kSwiglu;
  gpt.bias = false;
  gpt.tie_embeddings = false;
  gpt.n_heads = 4;
  gpt.n_kv_heads = 2;
  return gpt;
}

// `sw` with an MoE layer everywhere, top-2 normalised gates and swiglu experts.
inline moe::MoEConfig MixtralLike(moe::MoEConfig sw) {
  sw.layer_freq = 1;
  sw.top_k = 2;
  sw.normalize_gates = true;
  sw.activation = moe::Activation::kSwiglu;
  return sw;
}

// What one Forward + Backward produced: the reported numbers and every trainable gradient.
struct Result {
  DecoderOutput out;
  std::map<std::string, std::vector<float>> grads;
};
inline Result ForwardBackward(Decoder& dec, const DecoderInput& in) {
  Result r;
  r.out = dec.Forward(in);
  dec.Backward(in, r.out);
  for (const parallel::Parameter& p : dec.registry().params())
    if (p.trainable) r.grads[p.name] = p.grad.ToVector<float>();
  return r;
}

// A chain of stage decoders (model stages in order) as one model: forward through them in
// order, each reading the previous stage's output; aux and z summed over the stages.
struct ChainRun {
  std::vector<DecoderOutput> outs;  // per stage
  double aux = 0, z = 0;
};
inline ChainRun ForwardChain(const std::vector<std::unique_ptr<Decoder>>& chain,
                             const DecoderInput& in) {
  ChainRun run;
  for (size_t s = 0; s < chain.size(); ++s) {
    DecoderInput sin = in;
    if (s > 0) sin.hidden = run.outs.back().hidden;
    run.outs.push_back(chain[s]->Forward(sin));
    run.aux += run.outs.back().aux_sum;
    run.z += run.outs.back().z_sum;
  }
  return run;
}
// Backward in reverse, each stage given the next stage's input gradient.
inline void BackwardChain(const std::vector<std::unique_ptr<Decoder>>& chain,
                          const DecoderInput& in, ChainRun& run) {
  for (size_t s = chain.size(); s-- > 0;) {
    DecoderInput sin = in;
    if (s > 0) sin.hidden = run.outs[s - 1].hidden;
    if (s + 1 < chain.size()) run.outs[s].grad_hidden = run.outs[s + 1].grad_input;
    chain[s]->Backward(sin, run.outs[s]);
  }
}

}  // namespace switchyard::model::testing
