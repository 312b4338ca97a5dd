#include "engine/config/parallel_config.h"

#include <algorithm>
#include <climits>
#include <numeric>
#include <vector>

#include "engine/dist/hierarchical_communicator.h"

#include "engine/model/stage.h"
#include "engine/parallel/pipeline_schedule.h"

namespace switchyard::config {
namespace {

// Each size alone, ZeRO, and the experts' split over ep.
Status CheckParallelSizes(const ParallelConfig& p, const moe::MoEConfig& moe) {
  for (auto [name, v] : {std::pair<const char*, int>{"tp", p.tp}, {"cp", p.cp}, {"ep", p.ep},
                         {"pp", p.pp}}) {
    if (v < 1) return InvalidArgument("parallel.", name, "=", v, " must be >= 1");
  }
  if (p.etp < 0) return InvalidArgument("parallel.etp=", p.etp, " must be >= 0 (0: same as tp)");
  if (p.ranks_per_node < 0) {
    return InvalidArgument("parallel.ranks_per_node=", p.ranks_per_node,
                           " must be >= 0 (0: detected at start-up)");
  }
  if (p.zero_stage < 0 || p.zero_stage > 3) {
    return InvalidArgument("parallel.zero_stage=", p.zero_stage, " must be 0, 1, 2 or 3");
  }
  if (p.offload_optimizer && p.zero_stage == 0) {
    return InvalidArgument("parallel.offload_optimizer=true needs parallel.zero_stage >= 1 (the "
                           "offloaded optimizer is the sharded one, as in ZeRO-Offload)");
  }
  SY_RETURN_IF_ERROR(moe.ExpertsPerRank(p.ep).status());
  return moe.CheckOverlapChunks(p.ep);
}

// What the model's shapes allow to split: the sequence over cp and tp (sequence
// parallelism), the heads, the kv heads and the dense MLP over tp, the experts' hidden
// units over etp.
Status CheckModelSplits(const ParallelConfig& p, const model::ModelConfig& model,
                        const moe::MoEConfig& moe) {
  if (p.cp > 1 && model.seq_len % (2 * p.cp) != 0) {
    return InvalidArgument("model.seq_len=", model.seq_len, " is not divisible by 2 * parallel.cp = ",
                           2 * p.cp, " (context parallelism cuts every sequence into 2 * cp "
                           "chunks, two per cp rank)");
  }
  const int64_t local_seq = p.cp > 1 ? model.seq_len / (2 * p.cp) : model.seq_len;
  if (p.tp > 1 && p.sequence_parallel && local_seq % p.tp != 0) {
    return InvalidArgument("model.seq_len=", model.seq_len,
                           p.cp > 1 ? " / (2 * parallel.cp)" : "", " is not divisible by parallel.tp=",
                           p.tp, " (sequence parallelism splits every sequence; or set "
                           "parallel.sequence_parallel=false)");
  }
  if (p.tp > 1 && model.n_heads % p.tp != 0) {
    return InvalidArgument("parallel.tp=", p.tp, " does not divide model.n_heads=", model.n_heads);
  }
  const int64_t kv_heads = model.kv_heads();
  if (p.tp > 1 && kv_heads % p.tp != 0 && p.tp % kv_heads != 0) {
    return InvalidArgument("parallel.tp=", p.tp, " and model.n_kv_heads=", kv_heads,
                           ": tp must divide the kv heads (they are split) or be a multiple of "
                           "them (they are replicated)");
  }
  if (p.tp > 1 && model.ff_hidden() % p.tp != 0 && moe.layer_freq != 1) {
    return InvalidArgument("parallel.tp=", p.tp, " does not divide the dense MLP hidden size ",
                           model.ff_hidden(), " (model.d_ff)");
  }
  if (p.expert_tp() > 1) {
    if (Status s = moe.ExpertHiddenPerRank(p.expert_tp()).status(); !s.ok()) {
      return InvalidArgument(s.message(), p.etp > 0 ? "" : " (etp defaults to tp; set parallel.etp)");
    }
  }
  return OkStatus();
}

// The world: at least the smallest one (the launch command to use), and a multiple of both
// groups' sizes.
Status CheckWorld(const ParallelConfig& p, int world) {
  const int64_t needed = p.SmallestWorld();
  if (world < needed) {
    return InvalidArgument("parallel.tp=", p.tp, " cp=", p.cp, " pp=", p.pp, " ep=", p.ep,
                           " etp=", p.expert_tp(), " needs ", needed, " ranks (or a multiple), but ",
                           world == 1 ? std::string("this is one process") : StrCat(world, " were launched"),
                           "; launch with mpirun -np ", needed, " switchyard ...");
  }
  if (p.ranks_per_node > 0 && world % p.ranks_per_node != 0) {
    return InvalidArgument("parallel.ranks_per_node=", p.ranks_per_node,
                           " does not divide the world size ", world,
                           " (every node holds the same number of ranks)");
  }
  return dist::CheckMeshSizes(world, p.MeshSizes());
}

// Pipeline: the schedule fits the micro-batches and the layers split into the stages.
Status CheckPipeline(const ParallelConfig& p, const model::ModelConfig& model,
                     const moe::MoEConfig& moe, int64_t micro_batches) {
  // The schedules' (and the dry-run's) bound on a step's forwards, checked in int64 before
  // the schedule's int arguments: pp * virtual_stages * micro-batches.
  const int64_t forwards = int64_t{p.pp} * std::max(p.virtual_stages, 1) * micro_batches;
  if (forwards > parallel::kMaxScheduledForwards) {
    return InvalidArgument("parallel.pp=", p.pp, " * parallel.virtual_stages=", p.virtual_stages,
                           " * train.grad_accum=", micro_batches, " = ", forwards,
                           " micro-batch forwards per step exceed the limit of ",
                           parallel::kMaxScheduledForwards);
  }
  if (p.pp > 1 || p.virtual_stages != 1) {
    const Status fits = parallel::CheckScheduleArgs(
        p.pipeline_schedule, p.pp, static_cast<int>(micro_batches), p.virtual_stages);
    if (!fits.ok()) {
      return InvalidArgument("parallel.pp=", p.pp, ", parallel.pipeline_schedule=",
                             parallel::PipelineScheduleName(p.pipeline_schedule),
                             ", parallel.virtual_stages=", p.virtual_stages,
                             ", train.grad_accum=", micro_batches, " (the micro-batches): ",
                             fits.message());
    }
  }
  if (p.pp * p.virtual_stages > 1 || !p.pipeline_layers.empty()) {
    return model::PartitionLayers(model, moe, p.pp * p.virtual_stages, p.pipeline_layers).status();
  }
  return OkStatus();
}

}  // namespace

Status ParallelConfig::Validate(const model::ModelConfig& model, const moe::MoEConfig& moe,
                                int64_t micro_batches, int world) const {
  SY_RETURN_IF_ERROR(CheckParallelSizes(*this, moe));
  SY_RETURN_IF_ERROR(CheckModelSplits(*this, model, moe));
  if (world >= 1) SY_RETURN_IF_ERROR(CheckWorld(*this, world));
  SY_RETURN_IF_ERROR(CheckPipeline(*this, model, moe, micro_batches));
  // The order, by the mesh it lays out: of this world, or (none given) of the smallest one
  // the sizes allow, whose dp / edp ratio is every world's.
  dist::MeshSizes sizes = MeshSizes();
  if (world < 1) sizes.ranks_per_node = 0;
  const int64_t mesh_world = world >= 1 ? world : SmallestWorld();
  if (mesh_world > INT_MAX) return OkStatus();  // no world of int ranks: CheckWorld's to say
  StatusOr<dist::Mesh> mesh = dist::Mesh::Create(static_cast<int>(mesh_world), sizes, order);
  if (!mesh.ok()) {
    const std::string message(mesh.status().message());
    if (message.rfind("order ", 0) == 0) return InvalidArgument("parallel.", message);
    return mesh.status();
  }
  if (world >= 1 && ranks_per_node > 0) return CheckTopology(*mesh, moe);
  return OkStatus();
}

Status CheckTopology(const dist::Mesh& mesh, const moe::MoEConfig& moe_config) {
  if (Status s = dist::CheckTensorParallelInsideNodes(mesh); !s.ok()) {
    return InvalidArgument("parallel.ranks_per_node=", mesh.ranks_per_node(), ": ", s.message());
  }
  if (moe_config.dispatcher != moe::Dispatcher::kHierarchical) return OkStatus();
  for (const std::vector<int>& group : mesh.Groups(dist::View::kExpert, {dist::Axis::kEp})) {
    std::vector<int> nodes;
    for (int r : group) nodes.push_back(mesh.NodeOf(r));
    if (Status s = dist::NodeLayout::Of(nodes).status(); !s.ok()) {
      return InvalidArgument("moe.dispatcher=hierarchical with parallel.ranks_per_node=",
                             mesh.ranks_per_node(), ": ep group ", dist::FormatGroup(group), ": ",
                             s.message());
    }
  }
  return OkStatus();
}

dist::MeshSizes ParallelConfig::MeshSizes() const {
  return {.tp = tp, .cp = cp, .ep = ep, .etp = expert_tp(), .pp = pp,
          .ranks_per_node = ranks_per_node};
}

int64_t ParallelConfig::SmallestWorld() const {
  return std::lcm(int64_t{tp} * cp * pp, int64_t{expert_tp()} * ep * pp);
}

}  // namespace switchyard::config
