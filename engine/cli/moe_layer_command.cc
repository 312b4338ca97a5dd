// `switchyard moe-layer`: forward and backward of one MoE layer on tensors from a
// safetensors file, for cross-checking against other frameworks and for studying routing
// on real hidden states. Under `mpirun -np R` the R ranks split the routing groups and the
// experts (parallel.ep); rank 0 writes every output whole. See docs/moe-layer.md.
//
// Every rank reads and validates the same input, and every failure goes through Agree():
// a collective that tells all ranks whether any rank failed, so that no rank enters a
// collective that another has left, and only the lowest failing rank prints (one line).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/cli/args.h"
#include "engine/cli/common.h"
#include "engine/cli/commands.h"
#include "engine/core/file.h"
#include "engine/core/safetensors.h"
#include "engine/dist/communicator.h"
#include "engine/dist/mesh.h"
#include "engine/dist/parallel_context.h"
#include "engine/dist/process.h"
#include "engine/config/config.h"
#include "engine/train/runtime.h"
#include "moe/experts.h"
#include "moe/moe_layer.h"

namespace switchyard::cli {
namespace {

using dist::Communicator;
using dist::ReduceOp;

constexpr char kCommand[] = "switchyard moe-layer";
constexpr int64_t kMaxGroupLines = 32;  // per-group summary lines printed at most


int Agree(Communicator& world, const Status& status, int code) {
  return cli::Agree(world, status, code, kCommand);
}

// ---- Flags ---------------------------------------------------------------------------

struct Flags {
  std::string config, input, out;
  std::string mode = "train";
  int step = 0;
  int layer = 0;
  std::vector<std::string> overrides;  // --set, in order
  bool help = false;
  std::string usage;
};

Status ParseFlags(const std::vector<std::string>& args, Flags* f) {
  std::vector<std::string> rest = args;
  SY_ASSIGN_OR_RETURN(f->overrides, TakeOverrides(rest));
  FlagSet flags(kCommand,
                "Runs forward and backward of one MoE layer on the tensors of a safetensors\n"
                "file and writes y, every gradient, the aux and z losses and the routing counts\n"
                "(rank 0 writes). Under `mpirun -np R` the ranks split the routing groups and,\n"
                "by parallel.ep, the experts. See docs/moe-layer.md.");
  flags.AddPath("config", &f->config, "YAML config (model.d_model, moe.*, parallel.ep)", true);
  flags.AddPath("input", &f->input, "safetensors file: x, dy and the parameters", true);
  flags.AddPath("out", &f->out, "safetensors file to write (atomically, rank 0)", true);
  flags.AddString("mode", &f->mode,
                  "train (capacity_factor, jitter on) or eval (eval_capacity_factor, no "
                  "jitter); default train");
  flags.AddInt("step", &f->step, "step keying the jitter and random second-expert draws (0)");
  flags.AddInt("layer", &f->layer, "layer id keying the same draws (0)");
  // Listed for --help only; the loop above consumes every --set.
  std::string unused;
  flags.AddString("set", &unused, "section.key=value config override; repeatable");
  f->usage = flags.Usage();
  SY_RETURN_IF_ERROR(flags.Parse(rest));
  f->help = flags.help_requested();
  if (f->help) return OkStatus();
  if (f->mode != "train" && f->mode != "eval") {
    return InvalidArgument("--mode must be train or eval, got \"", f->mode, "\"");
  }
  // Through a symlink or a hard link too: the atomic write would replace the file read.
  for (const auto& [flag, path] : {std::pair{"input", f->input}, {"config", f->config}}) {
    if (SameFile(f->out, path)) {
      return InvalidArgument("--out ", f->out, " is the --", flag, " file; write the results elsewhere");
    }
  }
  if (f->step < 0) return InvalidArgument("--step must be >= 0, got ", f->step);
  if (f->layer < 0) return InvalidArgument("--layer must be >= 0, got ", f->layer);
  return OkStatus();
}

// The config, checked against the world and restricted to the layouts this command runs:
// ep x edp only (tp = cp = pp = etp = 1).
StatusOr<config::Config> LoadLayerConfig(const Flags& f, int world) {
  SY_ASSIGN_OR_RETURN(config::Config config, config::LoadConfig(f.config, f.overrides));
  const config::ParallelConfig& p = config.parallel;
  for (auto [name, v] : {std::pair<const char*, int>{"tp", p.tp}, {"cp", p.cp}, {"pp", p.pp}}) {
    if (v != 1) {
      return InvalidArgument("moe-layer runs ep x data-parallel layouts only: parallel.", name,
                             "=", v, " must be 1");
    }
  }
  if (p.etp > 1) {
    return InvalidArgument("moe-layer runs ep x data-parallel layouts only: parallel.etp=", p.etp,
                           " must be 1 (or 0)");
  }
  SY_RETURN_IF_ERROR(config.Validate(world));
  if (!config.runtime.device.is_cpu() && world > 1) {
    return InvalidArgument("moe-layer runs runtime.device=", config.runtime.device,
                           " on one rank only (got ", world, " ranks)");
  }
  return config;
}

// ---- Input ---------------------------------------------------------------------------

struct Inputs {
  int64_t groups = 0, tokens = 0;          // G, T
  Tensor x, dy;                            // (G, T, d)
  Tensor router_weight, expert_bias;       // (d, E), (E) or undefined
  moe::ExpertsParams experts;              // (E, ...), all experts
  moe::ExpertsParams shared;               // file shapes: w1 (d, H), b1 (H), ...
};

struct Expected {
  std::string name;
  Shape shape;
  Tensor* into;
};

// Why an optional tensor is not used by this config (empty for unknown names).
std::string UnusedReason(const std::string& name, const moe::MoEConfig& c) {
  if (name == "experts.w3") {
    return StrCat("moe.activation is ", moe::ActivationName(c.activation), ", not swiglu");
  }
  if (name == "experts.b1" || name == "experts.b2" || name == "shared.b1" ||
      name == "shared.b2") {
    if (!c.bias) return "moe.bias is false";
  }
  if (name.rfind("shared.", 0) == 0 && c.num_shared_experts == 0) {
    return "moe.num_shared_experts is 0";
  }
  if (name == "shared.w3") {
    return StrCat("moe.activation is ", moe::ActivationName(c.activation), ", not swiglu");
  }
  if (name == "router.expert_bias") return "moe.expert_bias_rate is 0";
  return "";
}

StatusOr<Inputs> LoadInputs(const SafetensorsFile& file, const std::string& path,
                            const moe::MoEConfig& c, int world) {
  Inputs in;
  const int64_t d = c.d_model, e = c.num_experts, f = c.d_expert;
  SY_ASSIGN_OR_RETURN(in.x, GetTensor(file, "x", DType::kF32, {}, path));
  if (in.x.ndim() != 3 || in.x.dim(2) != d || in.x.dim(0) < 1 || in.x.dim(1) < 1) {
    return InvalidArgument(path, ": tensor 'x': expected f32 (G, T, ", d, ") with G, T >= 1, got ",
                           DTypeName(in.x.dtype()), " ", ShapeString(in.x.shape()));
  }
  in.groups = in.x.dim(0);
  in.tokens = in.x.dim(1);
  const int64_t g = in.groups, t = in.tokens;

  std::vector<Expected> want = {
      {"dy", {g, t, d}, &in.dy},
      {"router.weight", {d, e}, &in.router_weight},
      {"experts.w1", {e, d, f}, &in.experts.w1},
      {"experts.w2", {e, f, d}, &in.experts.w2},
  };
  const bool swiglu = c.activation == moe::Activation::kSwiglu;
  if (swiglu) want.push_back({"experts.w3", {e, d, f}, &in.experts.w3});
  if (c.bias) {
    want.push_back({"experts.b1", {e, f}, &in.experts.b1});
    want.push_back({"experts.b2", {e, d}, &in.experts.b2});
  }
  if (c.expert_bias_rate > 0) want.push_back({"router.expert_bias", {e}, &in.expert_bias});
  if (c.num_shared_experts > 0) {
    const int64_t h = c.num_shared_experts * c.shared_hidden();
    want.push_back({"shared.w1", {d, h}, &in.shared.w1});
    want.push_back({"shared.w2", {h, d}, &in.shared.w2});
    if (swiglu) want.push_back({"shared.w3", {d, h}, &in.shared.w3});
    if (c.bias) {
      want.push_back({"shared.b1", {h}, &in.shared.b1});
      want.push_back({"shared.b2", {d}, &in.shared.b2});
    }
  }
  for (const Expected& w : want) {
    if (!file.tensors.contains(w.name)) {
      return NotFound(path, ": missing tensor '", w.name, "': expected f32 ",
                      ShapeString(w.shape));
    }
    SY_ASSIGN_OR_RETURN(*w.into, GetTensor(file, w.name, DType::kF32, w.shape, path));
  }
  // NaN or Inf in any input would flow silently into every output: refuse it by name.
  std::vector<std::pair<std::string, const Tensor*>> loaded = {{"x", &in.x}};
  for (const Expected& w : want) loaded.emplace_back(w.name, w.into);
  for (const auto& [name, t] : loaded) {
    const float* v = t->data<float>();
    for (int64_t i = 0; i < t->numel(); ++i) {
      if (!std::isfinite(v[i])) {
        return InvalidArgument(path, ": tensor '", name, "' holds a non-finite value (", v[i],
                               " at flat index ", i, " of ", ShapeString(t->shape()), ")");
      }
    }
  }
  // Anything else is most likely a file made for another config: refuse it.
  for (const auto& [name, tensor] : file.tensors) {
    if (name == "x") continue;
    const bool expected = std::any_of(want.begin(), want.end(),
                                      [&](const Expected& w) { return w.name == name; });
    if (expected) continue;
    const std::string reason = UnusedReason(name, c);
    if (!reason.empty()) {
      return InvalidArgument(path, ": tensor '", name, "' is not used by this config (", reason,
                             ")");
    }
    return InvalidArgument(path, ": unknown tensor '", name,
                           "'; see docs/moe-layer.md for the names");
  }
  if (g % world != 0) {
    return InvalidArgument(path, ": the ", g, " routing groups of 'x' (G, T, d) = ",
                           ShapeString(in.x.shape()), " do not split over ", world,
                           " ranks; G must be a multiple of the rank count");
  }
  return in;
}

// ---- Output --------------------------------------------------------------------------

// Gathers each rank's rows (dim 0) over `comm` in rank order.
Tensor Gather(Communicator& comm, const Tensor& local) {
  Shape shape = local.shape();
  shape[0] *= comm.size();
  Tensor out = Tensor::Empty(shape, local.dtype());
  comm.AllGather(local, out);
  return out;
}

std::string Join(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) out += ' ';
    out += std::to_string(v[i]);
  }
  return out + "]";
}

void PrintSummary(const Inputs& in, const config::Config& config, const Flags& f,
                  const dist::Mesh& mesh, const SafetensorsFile& out,
                  const moe::MoEStats& stats) {
  const moe::MoEConfig& c = config.moe;
  const int64_t g = in.groups, e = c.num_experts;
  std::printf("moe-layer: G=%lld groups x T=%lld tokens, d=%lld, E=%lld, top-%lld, %s, "
              "f=%lld, shared=%lld; mode %s, step %d, layer %d; %d rank(s): ep %d x edp %d\n",
              static_cast<long long>(g), static_cast<long long>(in.tokens),
              static_cast<long long>(c.d_model), static_cast<long long>(e),
              static_cast<long long>(c.top_k), moe::ActivationName(c.activation),
              static_cast<long long>(c.d_expert), static_cast<long long>(c.num_shared_experts),
              f.mode.c_str(), f.step, f.layer, mesh.world(), mesh.ep(), mesh.edp());
  const float* aux = out.tensors.at("aux_loss").data<float>();
  const float* z = out.tensors.at("z_loss").data<float>();
  const int64_t* dropped = out.tensors.at("dropped").data<int64_t>();
  const int64_t* tpe = out.tensors.at("tokens_per_expert").data<int64_t>();
  std::printf("group %12s %12s %8s  tokens per expert (kept)\n", "aux", "z", "dropped");
  for (int64_t i = 0; i < std::min(g, kMaxGroupLines); ++i) {
    std::vector<int64_t> row(tpe + i * e, tpe + (i + 1) * e);
    std::printf("%5lld %12.6g %12.6g %8lld  %s\n", static_cast<long long>(i), aux[i], z[i],
                static_cast<long long>(dropped[i]), Join(row).c_str());
  }
  if (g > kMaxGroupLines) {
    std::printf("  ... %lld more groups (all in the output file)\n",
                static_cast<long long>(g - kMaxGroupLines));
  }
  std::printf("tokens per expert, all groups: routed %s\n", Join(stats.tokens_per_expert).c_str());
  std::printf("                               kept   %s\n",
              Join(stats.tokens_per_expert_kept).c_str());
  std::printf("routing: dropped %lld of %lld assignments (%.4f), router entropy %.6f "
              "(uniform %.6f), kept load share min %.4f max %.4f (mean %.4f)\n",
              static_cast<long long>(stats.dropped()), static_cast<long long>(stats.assignments),
              stats.dropped_fraction(), stats.router_entropy(), std::log(double(e)),
              stats.min_load_share(), stats.max_load_share(), stats.mean_load_share());
  // L = sum(y * dy) + mean over groups of (aux + z), the loss the gradients are of.
  const Tensor& y = out.tensors.at("y");
  const float* yp = y.data<float>();
  const float* dyp = in.dy.data<float>();
  double ydy = 0;
  for (int64_t i = 0; i < y.numel(); ++i) ydy += double(yp[i]) * dyp[i];
  std::printf("loss: sum(y*dy) %.9g + mean(aux) %.9g + mean(z) %.9g = %.9g\n", ydy,
              stats.aux_mean(), stats.z_mean(), ydy + stats.aux_mean() + stats.z_mean());
}

// ---- The command ---------------------------------------------------------------------

// `x` on `device` (undefined stays undefined).
Tensor OnDevice(const Tensor& x, const Device& device, DeviceContext* ctx) {
  return x.defined() ? x.To(device, ctx) : Tensor();
}

// This rank's MoE layer on `device`: the router (and expert bias), its experts (a view of
// the global tensors, dim 0 [first, first + E_l)) and the shared experts. The experts'
// error first, then the shared experts'.
StatusOr<std::unique_ptr<moe::MoELayer>> BuildLayer(const Inputs& in, const moe::MoEConfig& c,
                                                    int layer_id, Communicator& ep,
                                                    const Device& device, DeviceContext* ctx) {
  auto on_device = [&](const Tensor& x) { return OnDevice(x, device, ctx); };
  const int64_t per_rank = c.num_experts / ep.size(), first = ep.rank() * per_rank;
  auto rows = [&](const Tensor& all) {
    return all.defined() ? all.Slice(first, first + per_rank) : Tensor();
  };
  moe::ExpertsParams local{on_device(rows(in.experts.w1)), on_device(rows(in.experts.w2)),
                           on_device(rows(in.experts.w3)), on_device(rows(in.experts.b1)),
                           on_device(rows(in.experts.b2))};
  StatusOr<moe::Experts> experts = moe::Experts::FromTensors(
      moe::RoutedExpertsOptions(c, first, per_rank, device), local, ctx);
  std::optional<moe::DenseMlp> shared;
  Status shared_status;
  if (c.num_shared_experts > 0) {
    // The file's 2-d shared tensors as one expert: (d, H) -> (1, d, H), ...
    auto one = [&](const Tensor& x) {
      if (!x.defined()) return Tensor();
      Shape s = x.shape();
      s.insert(s.begin(), 1);
      return on_device(x.Reshape(s));
    };
    StatusOr<moe::Experts> s = moe::Experts::FromTensors(
        moe::SharedExpertsOptions(c, device),
        {one(in.shared.w1), one(in.shared.w2), one(in.shared.w3), one(in.shared.b1),
         one(in.shared.b2)},
        ctx);
    if (s.ok()) shared.emplace(std::move(*s));
    shared_status = s.status();
  }
  SY_RETURN_IF_ERROR(experts.ok() ? shared_status : experts.status());
  return std::make_unique<moe::MoELayer>(c, layer_id, &ep, on_device(in.router_weight),
                                         std::move(*experts), std::move(shared),
                                         on_device(in.expert_bias), ctx);
}

// Every output whole on every rank (only rank 0 writes them): y and grad.x gathered over
// the groups, the parameter gradients summed over the ranks that share them, the per-group
// losses and counts. `gl` groups of `t` tokens on this rank, `g` in all.
SafetensorsFile GatherOutputs(Communicator& world, dist::ParallelContext& pc,
                              moe::MoELayer& layer, const moe::MoEForward& fwd, const Tensor& dh,
                              int64_t g, int64_t gl, int64_t t, DeviceContext* ctx) {
  auto on_host = [&](const Tensor& x) { return x.To(Device::Cpu(), ctx); };
  const int64_t d = dh.dim(1), e = layer.config().num_experts;
  SafetensorsFile out;
  out.tensors["y"] = Gather(world, on_host(fwd.y)).Reshape({g, t, d});
  out.tensors["grad.x"] = Gather(world, on_host(dh)).Reshape({g, t, d});
  Tensor grad_router = on_host(layer.grad_router_weight());
  world.AllReduce(grad_router, ReduceOp::kSum);
  out.tensors["grad.router.weight"] = grad_router;
  for (parallel::Parameter& param : layer.experts().Parameters()) {
    Tensor grad = on_host(param.grad);
    pc.edp().AllReduce(grad, ReduceOp::kSum);  // same experts, other tokens
    out.tensors["grad.experts." + param.name] = Gather(pc.ep(), grad);
  }
  if (moe::DenseMlp* mlp = layer.shared()) {
    for (parallel::Parameter& param : mlp->experts().Parameters()) {
      Tensor grad = on_host(param.grad);
      world.AllReduce(grad, ReduceOp::kSum);
      Shape s(grad.shape().begin() + 1, grad.shape().end());
      out.tensors["grad.shared." + param.name] = grad.Reshape(s);
    }
  }
  std::vector<float> aux(fwd.groups.aux.begin(), fwd.groups.aux.end());  // f32 values
  out.tensors["aux_loss"] = Gather(world, Tensor::FromVector(aux, {gl}));
  std::vector<float> z(fwd.groups.z.begin(), fwd.groups.z.end());  // f32 values, exactly
  out.tensors["z_loss"] = Gather(world, Tensor::FromVector(z, {gl}));
  out.tensors["tokens_per_expert"] =
      Gather(world, Tensor::FromVector(fwd.groups.tokens_per_expert_kept, {gl, e}));
  out.tensors["dropped"] = Gather(world, Tensor::FromVector(fwd.groups.dropped, {gl}));
  return out;
}

// The first output (y, a gradient, a loss) holding a NaN or Inf, named: finite inputs whose
// forward overflows (a router weight of 3e38) are not written as results (exit 3, as eval).
Status CheckFiniteOutputs(const SafetensorsFile& out, const std::string& input) {
  for (const auto& [name, t] : out.tensors) {
    if (t.dtype() != DType::kF32) continue;
    const float* v = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (std::isfinite(v[i])) continue;
      return FailedPrecondition(input, ": the layer's output '", name, "' is not finite (", v[i],
                                " at flat index ", i,
                                "): the inputs are finite but too large "
                                "(a router weight of 3e38?); nothing written");
    }
  }
  return OkStatus();
}

// Rank 0: the metadata, the summary on stdout and the output file.
Status WriteOutputs(const Inputs& in, const config::Config& config, const Flags& f,
                    const dist::Mesh& mesh, int ranks, const moe::MoEStats& stats,
                    SafetensorsFile& out) {
  out.metadata = {{"command", "switchyard moe-layer"},
                  {"mode", f.mode},
                  {"step", std::to_string(f.step)},
                  {"layer", std::to_string(f.layer)},
                  {"ranks", std::to_string(ranks)},
                  {"ep", std::to_string(mesh.ep())},
                  {"edp", std::to_string(mesh.edp())},
                  {"config", config.ToYaml()}};
  PrintSummary(in, config, f, mesh, out, stats);
  Status written = WriteSafetensors(f.out, out);
  if (written.ok()) {
    std::printf("wrote %s (%zu tensors)\n", f.out.c_str(), out.tensors.size());
  }
  std::fflush(stdout);
  return written;
}

int Run(const std::vector<std::string>& args) {
  std::unique_ptr<Communicator> world = dist::WorldCommunicator();
  const int rank = world->rank(), ranks = world->size();

  Flags f;
  if (int rc = Agree(*world, ParseFlags(args, &f), kExitUsage); rc != kExitOk) return rc;
  if (f.help) {
    if (rank == 0) std::fputs(f.usage.c_str(), stdout);
    return kExitOk;
  }
  StatusOr<config::Config> config = LoadLayerConfig(f, ranks);
  if (int rc = Agree(*world, config.status(), kExitUsage); rc != kExitOk) return rc;
  const moe::MoEConfig& c = config->moe;
  const config::ParallelConfig& p = config->parallel;
  StatusOr<dist::Mesh> mesh =
      dist::Mesh::Create(ranks, {.tp = 1, .cp = 1, .ep = p.ep, .etp = 1, .pp = 1,
                                 .ranks_per_node = p.ranks_per_node}, p.order);
  if (int rc = Agree(*world, mesh.status(), kExitUsage); rc != kExitOk) return rc;

  // --out can be written: said now, before the layer runs.
  if (int rc = Agree(*world, CheckOutputFile("out", f.out), kExitFailure); rc != kExitOk) return rc;
  // Every rank reads and checks the whole input the same way.
  StatusOr<Inputs> inputs = [&]() -> StatusOr<Inputs> {
    SY_ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensors(f.input));
    return LoadInputs(file, f.input, c, ranks);
  }();
  if (int rc = Agree(*world, inputs.status(), kExitFailure); rc != kExitOk) return rc;
  Inputs& in = *inputs;

  StatusOr<std::unique_ptr<dist::ParallelContext>> pc_or =
      dist::ParallelContext::Create(*world, *mesh);
  if (int rc = Agree(*world, pc_or.status(), kExitUsage); rc != kExitOk) return rc;
  dist::ParallelContext& pc = **pc_or;
  // runtime.device / runtime.precision (one rank on a GPU): the layer and its inputs move
  // there; the results come back to the host before they are gathered and written.
  StatusOr<train::Runtime> rt = train::MakeRuntime(config->runtime, *world, *mesh);
  if (int rc = Agree(*world, rt.status(), kExitUsage); rc != kExitOk) return rc;
  DeviceContext* ctx = rt->ctx.get();
  const Device device = rt->device();
  // moe.dispatcher: the token exchange flat, or hierarchical over parallel.ranks_per_node.
  StatusOr<dist::Communicator*> ep = c.dispatcher == moe::Dispatcher::kHierarchical
                                         ? pc.ep_hierarchical()
                                         : StatusOr<dist::Communicator*>(&pc.ep());
  if (int rc = Agree(*world, ep.status(), kExitUsage); rc != kExitOk) return rc;
  StatusOr<std::unique_ptr<moe::MoELayer>> layer = BuildLayer(in, c, f.layer, **ep, device, ctx);
  if (int rc = Agree(*world, layer.status(), kExitFailure); rc != kExitOk) return rc;

  // This rank's groups [g0, g0 + gl): forward, then backward of
  // L = sum(y * dy) + mean over all G groups of (aux + z).
  const int64_t d = c.d_model, t = in.tokens, g = in.groups;
  const int64_t gl = g / ranks, g0 = rank * gl;
  const bool training = f.mode == "train";
  Tensor h = OnDevice(in.x.Slice(g0, g0 + gl).Reshape({gl * t, d}), device, ctx);
  Tensor dy = OnDevice(in.dy.Slice(g0, g0 + gl).Reshape({gl * t, d}), device, ctx);
  moe::MoEForward fwd = (*layer)->Forward(h, t, training, f.step, g0 * t, ctx);
  const std::vector<float> dloss(gl, 1.0f / static_cast<float>(g));
  Tensor dh = (*layer)->Backward(fwd.acts, dy, dloss, dloss, ctx);

  SafetensorsFile out = GatherOutputs(*world, pc, **layer, fwd, dh, g, gl, t, ctx);
  moe::MoEStats stats = fwd.stats;
  stats.AllReduce(*world);
  Status finite = CheckFiniteOutputs(out, f.input);
  if (int rc = Agree(*world, finite, kExitNonFinite); rc != kExitOk) return rc;
  Status written;
  if (rank == 0) written = WriteOutputs(in, *config, f, *mesh, ranks, stats, out);
  return Agree(*world, written, kExitFailure);
}

}  // namespace

int RunMoELayer(const std::vector<std::string>& args) {
  return RunInProcess(kCommand, Run, args);
}

}  // namespace switchyard::cli
