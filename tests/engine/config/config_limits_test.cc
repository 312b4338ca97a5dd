// The limits every config key is held to: finite floats in their range, integers and their
// products that fit, the required decoder sizes, empty and multi-document files.
#include "engine/config/config.h"

#include <gtest/gtest.h>

#include "tests/engine/config/config_error.h"

namespace switchyard::train {
namespace {

// A whole model (switch-tiny's shape) for the checks that read the decoder's sizes.
constexpr char kModel[] = R"(
model: {vocab_size: 256, seq_len: 64, d_model: 64, n_layers: 4, n_heads: 4}
moe: {num_experts: 8, layer_freq: 2, top_k: 1, d_expert: 128}
)";

std::string ModelError(std::vector<std::string> overrides, int world = 1) {
  auto c = config::ParseConfig(kModel, "m.yaml", overrides);
  if (!c.ok()) return std::string(c.status().message());
  Status s = c->Validate(world);
  return s.ok() ? "" : std::string(s.message());
}

// Every float key refuses non-finite values, and f32 keys values f32 cannot hold, when read.
TEST(ConfigLimitsTest, FloatKeysAreFiniteAndInTheirRange) {
  for (const char* key :
       {"train.grad_clip", "model.norm_eps", "model.rope_base", "moe.expert_bias_rate",
        "moe.aux_loss_coef", "train.lr", "train.collective_timeout_s", "plan.device_memory_gib"}) {
    for (const char* bad : {".inf", "-.inf", ".nan", ".Inf"}) {
      EXPECT_EQ(ModelError({StrCat(key, "=", bad)}),
                StrCat("--set: ", key, "=", bad, " must be a finite number"));
    }
  }
  EXPECT_EQ(ModelError({"model.norm_eps=1e300"}),
            "--set: model.norm_eps=1e300 overflows f32 (the largest is 3.40282e+38)");
  EXPECT_EQ(ModelError({"train.lr=1e-50"}),
            "--set: train.lr=1e-50 underflows f32 (it would be 0; the smallest is 1.4013e-45)");
  EXPECT_EQ(ModelError({"train.collective_timeout_s=1e400"}),
            "--set: train.collective_timeout_s=1e400 overflows f64");
  EXPECT_EQ(ModelError({"train.lr=0"}), "train.lr=0 must be > 0");  // 0 is not an underflow
  EXPECT_EQ(ModelError({"data.paths=[{dir: a, weight: .inf}]"}),
            "--set: data.paths[0].weight=.inf must be a finite number");
  EXPECT_EQ(ModelError({"data.paths=[{dir: a, weight: 1, dir: b}]"}),
            "--set: data.paths[0]: 'dir' is set twice; keep one");
  EXPECT_EQ(ModelError({"data.paths=[{dir: a}, {dir: [b]}]"}),
            "--set: data.paths[1].dir: expected a string, got '[...]'");
  EXPECT_EQ(ModelError({"data.paths=[{? [x] : y}]"}),
            "--set: data.paths[0]: a key must be dir or weight, not '[...]'");
  EXPECT_EQ(ModelError({"model.init_std=2"}),
            "model.init_std=2 must be at most 1 (a weight's standard deviation; 0.02 is usual)");
  EXPECT_EQ(ModelError({"model.init_std=1"}), "");
  // A value that parses is written back by ToYaml in a form that parses again.
  auto c = config::ParseConfig(kModel, "m.yaml", {"model.rope_base=3.4e38", "train.lr=1.2e-38"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(config::ParseConfig(c->ToYaml(), "config.yaml").ok())
      << config::ParseConfig(c->ToYaml(), "config.yaml").status();
}

// Integers: decimal only, within their field's type; products and the pipeline bounded.
TEST(ConfigLimitsTest, IntegerKeysAndTheirProducts) {
  EXPECT_EQ(ModelError({"train.seed=-1"}),
            "--set: train.seed: expected an integer in [0, 18446744073709551615], got '-1'");
  EXPECT_EQ(ModelError({"moe.seed=18446744073709551615"}), "");
  EXPECT_EQ(ModelError({"parallel.tp=2147483648"}),
            "--set: parallel.tp: expected an integer in [-2147483648, 2147483647], got "
            "'2147483648'");
  EXPECT_EQ(ModelError({"train.grad_accum=9223372036854775808"}),
            "--set: train.grad_accum: expected an integer in [-9223372036854775808, "
            "9223372036854775807], got '9223372036854775808'");
  EXPECT_EQ(ModelError({"moe.top_k=010"}),
            "--set: moe.top_k='010' has a leading zero (YAML 1.1 reads it as octal); write the "
            "decimal number without it");
  EXPECT_EQ(ModelError({"moe.top_k=0x2"}),
            "--set: moe.top_k='0x2' is not a decimal integer (YAML reads 0x, 0o and 0b as "
            "hexadecimal, octal and binary); write it in decimal");
  EXPECT_EQ(ModelError({"moe.top_k=0o2"}).find("is not a decimal integer"), 23u);
  EXPECT_EQ(ModelError({"moe.top_k=+2", "moe.num_shared_experts=0"}), "");
  EXPECT_EQ(ModelError({"parallel.pipeline_layers=[2, 02]"}),
            "--set: parallel.pipeline_layers[1]='02' has a leading zero (YAML 1.1 reads it as "
            "octal); write the decimal number without it");
  for (const char* big : {"1048577", "2147483648"}) {
    EXPECT_EQ(ModelError({StrCat("train.grad_accum=", big)}),
              StrCat("parallel.pp=1 * parallel.virtual_stages=1 * train.grad_accum=", big, " = ",
                     big, " micro-batch forwards per step exceed the limit of 1048576"));
  }
  EXPECT_EQ(ModelError({"train.grad_accum=1048576"}), "");
  EXPECT_EQ(ModelError({"train.micro_batch_size=144115188075855872"}),
            "train.micro_batch_size=144115188075855872 * model.seq_len=64 is more than 2^53 "
            "tokens per micro-batch (the largest count the engine forms)");
  EXPECT_EQ(ModelError({"model.seq_len=1152921504606846976"}),
            "train.micro_batch_size=4 * model.seq_len=1152921504606846976 is more than 2^53 "
            "tokens per micro-batch (the largest count the engine forms)");
  EXPECT_NE(ModelError({"model.vocab_size=100000000000000"}).find("logits per micro-batch"),
            std::string::npos);
  EXPECT_NE(ModelError({"train.max_steps=4611686018427387904"}).find("sequences over the run"),
            std::string::npos);
  EXPECT_NE(ModelError({"moe.num_experts=1000000000000", "moe.d_expert=1000000"})
                .find("parameters, more than 2^53"),
            std::string::npos);
  EXPECT_EQ(ModelError({"model.n_layers=1025"}),
            "model.n_layers=1025 exceeds 1024 (8x the deepest published models, about 100-130 "
            "layers)");
}

// Required keys, the key rope_base is read under, empty values, a second document, MoE layers.
TEST(ConfigLimitsTest, RequiredEmptyRopeDocumentsAndMoELayers) {
  EXPECT_EQ(Error("model:\n  vocab_size: 100\n"), "model.d_model is required (docs/config.md)");
  EXPECT_EQ(Error("model:\n  d_model: 8\n"), "moe.d_expert is required (docs/config.md)");
  EXPECT_EQ(Error("model:\n  d_model: 0\n"), "model.d_model=0 must be positive");
  EXPECT_EQ(ModelError({"model.position=rope", "model.rope_base=0"}),
            "model.rope_base=0 must be > 0 (model.position=rope)");
  EXPECT_EQ(ModelError({"model.vocab_size="}),
            "--set: model.vocab_size: the value is empty (expected an integer)");
  EXPECT_EQ(ModelError({"model.vocab_size=null"}),
            "--set: model.vocab_size: the value is empty (expected an integer)");
  EXPECT_EQ(Error("model:\n  norm_eps:\n"),
            "x.yaml: model.norm_eps: the value is empty (expected a number)");
  EXPECT_EQ(ModelError({"data.dir=~"}), "--set: data.dir: the value is empty (expected a string)");
  EXPECT_EQ(ModelError({"model.norm="}), "--set: model.norm: the value is empty (expected a name)");
  EXPECT_EQ(Error("model:\n  d_model: 8\n---\nmodel:\n  d_model: 16\n"),
            "x.yaml: holds a second YAML document (line 4); a config is one document (remove the "
            "'---' and merge the keys)");
  EXPECT_EQ(Error("---\nmodel: {d_model: 0}\n---\n"), "model.d_model=0 must be positive");
  // A document that starts with a flow indicator: yaml-cpp 0.7's LoadAll looped on it
  // forever, growing (found by tests/fuzz/config_fuzz).
  EXPECT_EQ(Error("model:\n  d_model: 8\n---\n,\n"),
            "x.yaml:4: YAML syntax error: unexpected ',' where a value starts");
  EXPECT_EQ(Error(","), "x.yaml:1: YAML syntax error: unexpected ',' where a value starts");
  EXPECT_EQ(Error("model:\n  d_model: 8\n--- ]\n"), "x.yaml:3: YAML syntax error: illegal flow end");
  // A layer_freq above n_layers is a dense model (the experiments' baseline sets 1000).
  EXPECT_EQ(ModelError({"moe.layer_freq=5"}), "");
  EXPECT_EQ(ModelError({"model.n_layers=1"}), "");
}

// The decoder's sizes (Config::ValidateModel): a key left out is named as required, a key
// given as 0 is "must be positive", with or without the rest of the config.
TEST(ConfigLimitsTest, TheDecoderSizesAreRequired) {
  const std::string full = "model: {vocab_size: 64, seq_len: 8, d_model: 16, n_layers: 2, n_heads: 2}\n"
                           "moe: {d_expert: 16}\n";
  auto model_error = [](const std::string& yaml) {
    auto c = config::ParseConfig(yaml, "x.yaml");
    if (!c.ok()) return std::string(c.status().message());
    Status s = c->Validate(1);
    if (s.ok()) s = c->ValidateModel();
    return s.ok() ? std::string() : std::string(s.message());
  };
  EXPECT_EQ(model_error(full), "");
  for (const char* key : {"vocab_size", "seq_len", "n_layers", "n_heads"}) {
    SCOPED_TRACE(key);
    const std::string given = StrCat(key, ": ");
    const size_t at = full.find(given);
    ASSERT_NE(at, std::string::npos);
    const size_t end = full.find_first_of(",}", at);
    std::string missing = full, zero = full;
    missing.erase(at, end - at + (full[end] == ',' ? 2 : 0));
    zero.replace(at + given.size(), end - at - given.size(), "0");
    EXPECT_EQ(model_error(missing), StrCat("model.", key, " is required (docs/config.md)"));
    EXPECT_EQ(model_error(zero), StrCat("model.", key, "=0 must be positive"));
  }
  // A layer-only config (moe-layer) needs none of them: Validate alone accepts it.
  auto layer = config::ParseConfig("model: {d_model: 16}\nmoe: {d_expert: 16}\n", "x.yaml");
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_TRUE(layer->Validate(1).ok());
}

}  // namespace
}  // namespace switchyard::train
