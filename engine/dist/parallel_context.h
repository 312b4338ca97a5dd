// ParallelContext: the communicators of one rank's groups in both views of the Mesh, built
// once at start-up and handed to the modules that need them (no globals).
//
//   dense view:  tp, cp, dp, pp, dp_cp (dense gradients are reduced over dp x cp),
//                dp_cp_tp (also over tp: sequence-parallel norms, the router) and tp_cp
//                (a micro-batch's tokens under context parallelism)
//   expert view: etp, ep (the token all-to-all), edp (expert gradients are reduced here)
//                and edp_etp (also over etp: the experts' output bias under etp)
//   topology:    ep_hierarchical, the ep group with its all-to-all routed over the mesh's
//                nodes (HierarchicalCommunicator; moe.dispatcher = hierarchical)
#pragma once

#include <memory>
#include <string>

#include "engine/dist/communicator.h"
#include "engine/dist/hierarchical_communicator.h"
#include "engine/dist/mesh.h"

namespace switchyard::dist {

class ParallelContext {
 public:
  // Splits `world` (whose ranks are the mesh's ranks) into every group above. Collective
  // over world: every rank calls it with the same mesh. An error when the mesh is for
  // another world size.
  static StatusOr<std::unique_ptr<ParallelContext>> Create(Communicator& world, const Mesh& mesh);

  const Mesh& mesh() const { return mesh_; }
  int rank() const { return rank_; }

  Communicator& tp() const { return *tp_; }
  Communicator& cp() const { return *cp_; }
  Communicator& dp() const { return *dp_; }
  Communicator& pp() const { return *pp_; }
  Communicator& dp_cp() const { return *dp_cp_; }
  Communicator& dp_cp_tp() const { return *dp_cp_tp_; }
  // The ranks holding one micro-batch's tokens under cp x tp, member cp_rank * tp + tp_rank
  // whatever the mesh order (an MoE routing group's ranks, moe/group_routing.h).
  Communicator& tp_cp() const { return *tp_cp_; }
  Communicator& etp() const { return *etp_; }
  Communicator& ep() const { return *ep_; }
  Communicator& edp() const { return *edp_; }
  Communicator& edp_etp() const { return *edp_etp_; }
  // The ep group's all-to-all in two steps over the mesh's nodes (inside the node, then one
  // message per node pair), bit-identical to ep()'s. An error naming the group when its
  // nodes hold different numbers of its members.
  StatusOr<Communicator*> ep_hierarchical() const;
  // The communicator the context was created over (it must outlive the context).
  Communicator& world() const { return *world_; }

  // The mesh's one-line description of this rank.
  std::string Describe() const { return mesh_.Describe(rank_); }

 private:
  ParallelContext(const Mesh& mesh, int rank) : mesh_(mesh), rank_(rank) {}

  Mesh mesh_;
  int rank_;
  std::unique_ptr<Communicator> tp_, cp_, dp_, pp_, dp_cp_, dp_cp_tp_, tp_cp_, etp_, ep_, edp_, edp_etp_;
  std::unique_ptr<HierarchicalCommunicator> ep_hierarchical_;
  Status ep_hierarchical_status_;
  Communicator* world_ = nullptr;
};

}  // namespace switchyard::dist
