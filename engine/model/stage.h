// Pipeline stages: which part of the decoder a model chunk holds. A stage is a description
// the decoder is built from (Decoder::Create's DecoderParallel::stage), not a special case
// inside it:
//
//   model stage 0        embedding, layers [0, e0)
//   model stage s        layers [e(s-1), e(s))
//   model stage S - 1    layers [e(S-2), L), final norm, head and loss
//
// With tied embeddings the last stage keeps its own copy of the token table ("embed.wte",
// the same name, box and initial values as the first stage's) for the head; the trainer
// keeps the two equal by summing their gradients over the first and last stage.
//
// Layer names stay global ("layers.<i>" with i in [0, L)), so checkpoints do not depend on
// the split. Interleaved schedules give a pipeline rank several chunks: with pp ranks and v
// chunks each there are S = pp * v model stages, and chunk c of rank r is model stage
// c * pp + r.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/model/model_config.h"
#include "engine/parallel/parameter.h"
#include "moe/moe_config.h"

namespace switchyard::model {

struct Stage {
  int64_t first_layer = 0;
  int64_t end_layer = -1;  // one past the last layer; -1: model.n_layers (the whole model)
  bool embedding = true;   // holds the token (and position) embedding: the first stage
  bool head = true;        // holds the final norm, the head and the loss: the last stage

  // The whole model on one stage.
  static Stage Whole() { return Stage{}; }
  int64_t End(int64_t n_layers) const { return end_layer < 0 ? n_layers : end_layer; }
  bool whole(int64_t n_layers) const {
    return first_layer == 0 && End(n_layers) == n_layers && embedding && head;
  }
  // "embedding + layers 0-3", "layers 4-7 + head", "layers 2-2".
  std::string Describe(int64_t n_layers) const;
  // The layers lie inside [0, n_layers) and are not empty.
  Status Validate(int64_t n_layers) const;
  bool operator==(const Stage&) const = default;
};

// The relative cost of layer i: its share of the model's per-token compute (2 x active
// parameters + attention's scores) plus its share of the parameters (memory), so that MoE
// layers (many parameters, few active) and dense layers (all active) weigh both ways.
double LayerCost(const ModelConfig& model, const moe::MoEConfig& moe, int64_t layer);

// Each stage's cost: its layers' LayerCost, plus the embedding's share on a stage with the
// embedding and the head's (its product, and its table when untied) on a stage with the head.
std::vector<double> StageCosts(const ModelConfig& model, const moe::MoEConfig& moe,
                               std::span<const Stage> stages);

// Splits model.n_layers layers into `stages` contiguous model stages, each with at least
// one layer. `layers_per_stage` (one count per stage, summing to n_layers) fixes the split;
// empty balances it automatically: the split whose most expensive stage (StageCosts) is
// the cheapest possible. Errors name the setting: more stages than layers, a list of the wrong length
// or sum, a stage of zero layers.
StatusOr<std::vector<Stage>> PartitionLayers(const ModelConfig& model, const moe::MoEConfig& moe,
                                             int stages,
                                             std::span<const int64_t> layers_per_stage = {});

// The parts whose gradients a rank's backward finishes, in the order it finishes them
// (Decoder::Backward reports each through on_done; the gradient sync launches their
// buckets in this order): per chunk, from the last to the first, the head (untied), the
// final norm, with tied embeddings on a head stage without the embedding the table's copy
// ("embed"), the layers from the last, the embedding. The rank's chunks in chunk order.
std::vector<parallel::PartId> BackwardParts(std::span<const Stage> chunks, int64_t n_layers,
                                            bool tie_embeddings);

}  // namespace switchyard::model
