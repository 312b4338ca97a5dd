// `switchyard route --checkpoint DIR (--text S | --file F) [--data DIR] [--json] [--color
// auto|always|never] [--set k=v ...]`: token-level routing of a text through a checkpoint's
// model. The text is tokenized with the tokenizer of the checkpoint's data.dir (or --data),
// run forward in eval mode (as `switchyard eval`: the checkpoint's step keys any random
// second-expert draw, no jitter) and, for each token and MoE layer, the chosen experts,
// their gates and whether capacity dropped each assignment are printed.
//
// Capacity: the text's tokens are one routing group at moe.eval_capacity_factor, C =
// ceil(cf * T * k / E) with T the text's token count. A text longer than model.seq_len is
// cut into windows of seq_len tokens, each its own sequence and routing group (as a
// validation micro-batch of one sequence would be). One rank; a text of at most 1 MiB.
// Exit status: 0 ok, 1 a missing or corrupt checkpoint, data directory or file (a FIFO or
// device refused), 2 bad flags or a text over 1 MiB.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/cli/args.h"
#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "engine/core/file.h"
#include "engine/dist/process.h"
#include "engine/data/index.h"
#include "engine/data/tokenizer.h"
#include "engine/train/evaluator.h"
#include "moe/capacity.h"

namespace switchyard::cli {
namespace {

constexpr char kCommand[] = "switchyard route";

// The longest text routed: 1 MiB, a short book. The forward runs window by window (a
// 2-layer toy model takes about 40 s per MiB on one core) and every token is a line of the
// listing or an object of --json, so a larger text is refused (docs/route.md).
constexpr uint64_t kMaxTextBytes = uint64_t{1} << 20;

struct Flags {
  std::string checkpoint, text, file, data, color = "auto";
  bool json = false, help = false, text_set = false;
  std::vector<std::string> overrides;
  std::string usage;
};

Status ParseFlags(const std::vector<std::string>& args, Flags* f) {
  std::vector<std::string> rest = args;
  SY_ASSIGN_OR_RETURN(f->overrides, TakeOverrides(rest));
  FlagSet flags(kCommand,
                "Routes a text through a checkpoint's model in eval mode and prints, for each\n"
                "token and MoE layer, the chosen experts, their gates and whether capacity\n"
                "dropped the assignment (the text is one routing group at\n"
                "moe.eval_capacity_factor; longer than model.seq_len: one group per window).");
  flags.AddPath("checkpoint", &f->checkpoint,
                "a step-* checkpoint directory, or a training output directory (its latest)", true);
  flags.AddString("text", &f->text, "the text to route");
  flags.AddPath("file", &f->file, "a file holding the text to route");
  flags.AddPath("data", &f->data, "a `switchyard prep` folder (default: the config's data.dir)");
  flags.AddBool("json", &f->json, "print one JSON object instead of the coloured listing");
  flags.AddString("color", &f->color, "auto (when stdout is a terminal), always or never");
  std::string unused;
  flags.AddString("set", &unused, "section.key=value override of the saved config; repeatable");
  f->usage = flags.Usage();
  SY_RETURN_IF_ERROR(flags.Parse(rest));
  f->help = flags.help_requested();
  if (f->help) return OkStatus();
  f->text_set = flags.IsSet("text");
  if (f->text_set == flags.IsSet("file")) return InvalidArgument("give exactly one of --text and --file");
  if (f->color != "auto" && f->color != "always" && f->color != "never") {
    return InvalidArgument("--color=", f->color, " is not one of auto, always, never");
  }
  return OkStatus();
}

// One token's routing in one MoE layer.
struct TokenRoute {
  std::vector<int32_t> experts;  // (k)
  std::vector<float> gates;      // (k)
  std::vector<bool> dropped;     // (k)
};

struct Routed {
  std::vector<int32_t> ids;
  std::vector<int64_t> group;                    // per token: its routing group (window)
  std::vector<int64_t> capacity;                 // per group: C (-1 dropless)
  std::vector<std::vector<TokenRoute>> layers;   // per MoE layer, per token
};

// Eval-mode forward of each window of `ids` as a (1, n) micro-batch; the routing of every
// MoE layer from its activations.
Routed Route(model::Decoder& decoder, const std::vector<int32_t>& ids, int64_t step) {
  const model::ModelConfig& m = decoder.config();
  const moe::MoEConfig& mc = decoder.moe_config();
  Routed r;
  r.ids = ids;
  r.layers.resize(decoder.moe_layer_ids().size());
  DeviceContext* ctx = decoder.ctx();
  for (size_t begin = 0, g = 0; begin < ids.size(); begin += m.seq_len, ++g) {
    const int64_t n = std::min<int64_t>(m.seq_len, ids.size() - begin);
    std::vector<int32_t> tokens(ids.begin() + begin, ids.begin() + begin + n);
    std::vector<int32_t> targets(n, -1);
    for (int64_t i = 0; i + 1 < n; ++i) targets[i] = tokens[i + 1];
    model::DecoderInput in;
    in.tokens = Tensor::FromVector(tokens, {1, n}).To(decoder.device(), ctx);
    in.targets = Tensor::FromVector(targets, {1, n}).To(decoder.device(), ctx);
    in.step = step;
    in.training = false;
    model::DecoderOutput out = decoder.Forward(in);
    r.capacity.push_back(moe::ExpertCapacity(mc.eval_capacity_factor, n, mc.top_k, mc.num_experts));
    size_t l = 0;
    for (const model::BlockActivations& b : out.acts.blocks) {
      if (!b.moe) continue;
      const moe::MoEActivations& a = b.moe->acts;
      const std::vector<int32_t> e = a.experts_all.To(Device::Cpu(), ctx).ToVector<int32_t>();
      const std::vector<float> gate = a.gates.To(Device::Cpu(), ctx).ToVector<float>();
      const std::vector<uint8_t> kept = a.kept_all.To(Device::Cpu(), ctx).ToVector<uint8_t>();
      const int64_t k = mc.top_k;
      for (int64_t t = 0; t < n; ++t) {
        TokenRoute tr;
        for (int64_t j = 0; j < k; ++j) {
          tr.experts.push_back(e[t * k + j]);
          tr.gates.push_back(gate[t * k + j]);
          tr.dropped.push_back(kept[t * k + j] == 0);
        }
        r.layers[l].push_back(tr);
      }
      ++l;
    }
    r.group.insert(r.group.end(), n, static_cast<int64_t>(g));
  }
  return r;
}

// Prints the --json object token by token: the whole text's JSON tree at once took about
// 800 bytes of memory per byte of text.
void PrintJson(const Routed& r, const data::Tokenizer& tok, const checkpoint::LoadedCheckpoint& ck,
               const std::vector<int64_t>& layer_ids, const moe::MoEConfig& mc) {
  nlohmann::ordered_json j;
  j["checkpoint"] = ck.dir;
  j["step"] = ck.step;
  j["eval_capacity_factor"] = mc.eval_capacity_factor;
  j["top_k"] = mc.top_k;
  j["num_experts"] = mc.num_experts;
  j["capacity"] = r.capacity;
  j["layers"] = layer_ids;
  j["tokens"] = nlohmann::ordered_json::array();
  std::string head = j.dump();
  head.resize(head.size() - 2);  // "...,"tokens":[" without its "]}"
  std::fputs(head.c_str(), stdout);
  for (size_t t = 0; t < r.ids.size(); ++t) {
    nlohmann::ordered_json tj;
    tj["id"] = r.ids[t];
    tj["text"] = tok.Piece(r.ids[t]);
    tj["group"] = r.group[t];
    nlohmann::ordered_json ls = nlohmann::ordered_json::array();
    for (const auto& layer : r.layers) {
      const TokenRoute& tr = layer[t];
      ls.push_back({{"experts", tr.experts}, {"gates", tr.gates}, {"dropped", tr.dropped}});
    }
    tj["layers"] = ls;
    if (t > 0) std::fputc(',', stdout);
    std::fputs(tj.dump().c_str(), stdout);
  }
  std::fputs("]}\n", stdout);
}

// The listing: per layer, the text with each token in its first expert's colour (a dropped
// first choice struck through), then one row per token.
std::string Listing(const Routed& r, const data::Tokenizer& tok, const checkpoint::LoadedCheckpoint& ck,
                    const std::vector<int64_t>& layer_ids, const moe::MoEConfig& mc, bool color) {
  static constexpr int kPalette[] = {196, 46, 21, 226, 201, 51, 208, 93, 118, 27, 214, 129, 40, 160, 33, 220};
  auto paint = [&](const std::string& s, int expert, bool dropped) {
    if (!color) return dropped ? "[" + s + "]x" : s;
    const int c = kPalette[expert % (sizeof(kPalette) / sizeof(kPalette[0]))];
    return "\033[" + std::string(dropped ? "9;" : "") + "38;5;" + std::to_string(c) + "m" + s + "\033[0m";
  };
  std::ostringstream out;
  out << "checkpoint " << ck.dir << " (step " << ck.step << "), " << r.ids.size() << " tokens, top-"
      << mc.top_k << " of " << mc.num_experts << " experts, eval_capacity_factor "
      << mc.eval_capacity_factor << " (capacity per expert";
  for (int64_t c : r.capacity) out << " " << (c < 0 ? std::string("dropless") : std::to_string(c));
  out << ")\n";
  for (size_t l = 0; l < r.layers.size(); ++l) {
    out << "\nlayer " << layer_ids[l] << " (colour: first expert" << (color ? "; struck: dropped" : "; [..]x: dropped") << ")\n  ";
    for (size_t t = 0; t < r.ids.size(); ++t) {
      std::string piece = tok.Piece(r.ids[t]);
      std::replace(piece.begin(), piece.end(), '\n', ' ');
      out << paint(piece, r.layers[l][t].experts[0], r.layers[l][t].dropped[0]);
    }
    out << "\n";
  }
  out << "\n  token       ";
  for (int64_t id : layer_ids) out << "  | layer " << id << " expert:gate";
  out << "   (* dropped by capacity)\n";
  for (size_t t = 0; t < r.ids.size(); ++t) {
    std::string piece = tok.Piece(r.ids[t]);
    if (piece == "\n") piece = "\\n";
    // Padded to 12 characters (code points: "▁" is three bytes).
    const auto width = std::count_if(piece.begin(), piece.end(), [](char c) { return (c & 0xC0) != 0x80; });
    out << "  " << piece << std::string(width < 12 ? 12 - width : 1, ' ');
    for (const auto& layer : r.layers) {
      const TokenRoute& tr = layer[t];
      out << "  |";
      for (size_t j = 0; j < tr.experts.size(); ++j) {
        char cell[48];
        std::snprintf(cell, sizeof(cell), " e%d:%.3f%s", tr.experts[j], tr.gates[j], tr.dropped[j] ? "*" : "");
        out << paint(cell, tr.experts[j], false);
      }
    }
    out << "\n";
  }
  return out.str();
}

// --text, or the bytes of --file (a regular file). Longer than kMaxTextBytes: an error
// with *code kExitUsage (the work and the output grow with the text; /dev/zero never ends).
StatusOr<std::string> TextToRoute(const Flags& f, int* code) {
  const std::string limit = StrCat("more than the ", kMaxTextBytes >> 20,
                                   " MiB route takes; route a part of it (head -c 1M)");
  if (f.text_set) {
    if (f.text.size() <= kMaxTextBytes) return f.text;
    *code = kExitUsage;
    return InvalidArgument("--text: ", f.text.size(), " bytes, ", limit);
  }
  StatusOr<std::string> text = ReadFile(f.file, kMaxTextBytes);
  if (text.status().code() != absl::StatusCode::kOutOfRange) return text;
  *code = kExitUsage;
  return InvalidArgument("--file ", text.status().message(), ", ", limit);
}

int Run(const std::vector<std::string>& args) {
  auto world = dist::WorldCommunicator();
  Flags f;
  if (int rc = Agree(*world, ParseFlags(args, &f), kExitUsage, kCommand); rc != kExitOk) return rc;
  if (f.help) {
    std::printf("%s", f.usage.c_str());
    return kExitOk;
  }
  if (world->size() != 1) {
    return Agree(*world, InvalidArgument("runs on one rank (launch it without mpirun)"), kExitUsage, kCommand);
  }
  int code = kExitFailure;
  StatusOr<std::string> text = TextToRoute(f, &code);
  if (!text.ok()) return Agree(*world, text.status(), code, kCommand);
  auto saved = train::ReadCheckpointConfig(f.checkpoint);
  if (int rc = Agree(*world, saved.status(), kExitFailure, kCommand); rc != kExitOk) return rc;
  // One rank: the saved layout folds onto it (a checkpoint loads under any layout).
  std::vector<std::string> overrides = {"parallel.tp=1", "parallel.cp=1", "parallel.ep=1",
                                        "parallel.etp=0", "parallel.pp=1", "parallel.virtual_stages=1",
                                        "parallel.pipeline_layers=[]", "parallel.zero_stage=0",
                                        "parallel.offload_optimizer=false"};
  overrides.insert(overrides.end(), f.overrides.begin(), f.overrides.end());
  auto cc = train::ReadCheckpointConfig(f.checkpoint, overrides);
  if (int rc = Agree(*world, cc.status(), kExitUsage, kCommand); rc != kExitOk) return rc;
  config::Config& config = cc->config;
  if (!f.data.empty()) {
    const Status same = CheckSameTokenizer(config.data.FirstDir(), f.data);
    if (int rc = Agree(*world, same, kExitFailure, kCommand); rc != kExitOk) return rc;
    config.data.dir = f.data;
    config.data.paths.clear();
  }
  Status valid = config.Validate(1);
  if (valid.ok()) valid = config.ValidateModel();
  if (int rc = Agree(*world, valid, kExitUsage, kCommand); rc != kExitOk) return rc;
  auto tok = LoadDataTokenizer(config.data.FirstDir(), config.model.vocab_size);
  if (int rc = Agree(*world, tok.status(), kExitFailure, kCommand); rc != kExitOk) return rc;
  const std::vector<int32_t> ids = tok->Encode(*text);
  if (ids.empty()) return Agree(*world, InvalidArgument("the text has no tokens"), kExitUsage, kCommand);
  auto evaluator = train::Evaluator::Create(config, *world);
  if (int rc = Agree(*world, evaluator.status(), kExitFailure, kCommand); rc != kExitOk) return rc;
  auto ck = (*evaluator)->Load(cc->dir);
  const Status load = train::BlameModelOverride(ck.status(), saved->config, config);
  const bool blamed = load.message() != ck.status().message();
  if (int rc = Agree(*world, load, blamed ? kExitUsage : kExitFailure, kCommand);
      rc != kExitOk) {
    return rc;
  }
  model::Decoder& decoder = (*evaluator)->decoder();
  const Routed routed = Route(decoder, ids, ck->step);
  if (f.json) {
    PrintJson(routed, *tok, *ck, decoder.moe_layer_ids(), config.moe);
  } else {
    const bool color = f.color == "always" || (f.color == "auto" && isatty(STDOUT_FILENO));
    std::printf("%s", Listing(routed, *tok, *ck, decoder.moe_layer_ids(), config.moe, color).c_str());
  }
  std::fflush(stdout);
  return kExitOk;
}

}  // namespace

int RunRoute(const std::vector<std::string>& args) {
  return RunInProcess(kCommand, Run, args);
}

}  // namespace switchyard::cli
