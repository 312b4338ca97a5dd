// The `parallel` section of a config: the layout over the world, and the one check of it
// (ParallelConfig::Validate) against the model's shapes, the world size and the pipeline.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/dist/mesh.h"
#include "engine/model/model_config.h"
#include "engine/parallel/pipeline_schedule.h"
#include "moe/moe_config.h"

namespace switchyard::config {

// parallel: the layout over the world; dp (and edp) is what remains.
struct ParallelConfig {
  int tp = 1;          // tensor parallel: attention heads, MLP hidden units, vocabulary
  int cp = 1;          // context parallel
  int ep = 1;          // expert parallel
  int etp = 0;         // tensor parallel inside each expert; 0 means the same as tp
  int pp = 1;          // pipeline stages
  // Pipeline parallelism (docs/pipeline.md): the schedule of a step's micro-batches
  // (train.grad_accum of them) over the pp stages — gpipe | 1f1b | interleaved — with
  // virtual_stages model chunks per rank for interleaved, and the layers of each model
  // stage (pp x virtual_stages counts summing to model.n_layers; empty: balanced by
  // compute and parameters, engine/model/stage.h).
  parallel::PipelineSchedule pipeline_schedule = parallel::PipelineSchedule::kOneFOneB;
  int virtual_stages = 1;
  std::vector<int64_t> pipeline_layers;
  // ZeRO stage 0-3 (engine/parallel/zero.h, docs/zero.md): 1 shards the optimizer state
  // over each parameter's data-parallel group (dense: dp x cp; experts: edp), 2 the
  // gradients too, 3 the parameters too.
  int zero_stage = 0;
  // ZeRO-Offload: optimizer state and update on the host (GPU runs; needs zero_stage >= 1;
  // on the CPU backend accepted and changes nothing).
  bool offload_optimizer = false;
  std::string order = "tp-cp-ep-dp-pp";  // mesh axis order, first fastest
  // With tp > 1: norms, the residual stream and the MoE layers work on sequence shards
  // (Megatron-LM requires it with MoE); all-gather / reduce-scatter replace the all-reduces.
  bool sequence_parallel = true;
  // Ranks per node, placed in blocks (node of rank r = r / ranks_per_node); 0 (default):
  // detected at start-up (MPI_COMM_TYPE_SHARED). Set it to declare virtual nodes, e.g. to
  // try moe.dispatcher=hierarchical on one machine. tp and etp groups must stay inside a
  // node (docs/mesh.md "Topology").
  int ranks_per_node = 0;

  // etp resolved: 0 means the same as tp.
  int expert_tp() const { return etp > 0 ? etp : tp; }
  // The mesh sizes (etp resolved).
  dist::MeshSizes MeshSizes() const;
  // The fewest ranks the layout runs on: a multiple of both tp*cp*pp and etp*ep*pp.
  int64_t SmallestWorld() const;
  // The one check of the layout, naming the key and the value it rejects: the sizes, ZeRO,
  // what the model's shapes allow to split (heads, kv heads, the MLP and expert hidden
  // sizes, the sequence under cp and sequence parallelism), the world size (world <= 0
  // skips it: dist::CheckMeshSizes) and the pipeline (the schedule fits `micro_batches`,
  // the layers split into the stages), and with parallel.ranks_per_node set, the topology
  // (it divides the world, tp and etp groups inside a node, and under
  // moe.dispatcher=hierarchical the same number of each ep group's ranks on every node).
  Status Validate(const model::ModelConfig& model, const moe::MoEConfig& moe,
                  int64_t micro_batches, int world) const;
};

// The topology rules of Validate for a mesh whose ranks_per_node is known (set or
// detected): tp and etp inside a node; under moe.dispatcher=hierarchical every ep group
// with the same number of ranks on each of its nodes. One line naming the key.
Status CheckTopology(const dist::Mesh& mesh, const moe::MoEConfig& moe_config);

}  // namespace switchyard::config
