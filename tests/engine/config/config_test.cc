#include "engine/config/config.h"

#include <gtest/gtest.h>

#include "engine/train/optimizer.h"
#include "engine/train/schedule.h"
#include "tests/engine/config/config_error.h"

namespace switchyard::train {
namespace {

constexpr char kYaml[] = R"(
model:
  d_model: 16
moe:
  num_experts: 8
  top_k: 2
  d_expert: 32
  activation: swiglu
  drop_policy: probability
  capacity_factor: 1.5
  normalize_gates: true
parallel:
  ep: 4
)";

TEST(ConfigTest, ParsesTypedSectionsWithDefaults) {
  auto c = config::ParseConfig(kYaml, "x.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.d_model, 16);
  EXPECT_EQ(c->moe.d_model, 16);
  EXPECT_EQ(c->moe.top_k, 2);
  EXPECT_EQ(c->moe.activation, moe::Activation::kSwiglu);
  EXPECT_EQ(c->moe.drop_policy, moe::DropPolicy::kProbability);
  EXPECT_FLOAT_EQ(c->moe.capacity_factor, 1.5f);
  EXPECT_TRUE(c->moe.normalize_gates);
  EXPECT_FLOAT_EQ(c->moe.eval_capacity_factor, 2.0f);  // default
  EXPECT_EQ(c->parallel.ep, 4);
  EXPECT_TRUE(c->Validate(8).ok());
}

TEST(ConfigTest, OverridesApplyInOrder) {
  auto c = config::ParseConfig(kYaml, "x.yaml", {"moe.top_k=1", "parallel.ep=2", "moe.top_k=3"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->moe.top_k, 3);
  EXPECT_EQ(c->parallel.ep, 2);
}

TEST(ConfigTest, ResolvedYamlParsesBackToTheSameConfig) {
  auto c = config::ParseConfig(kYaml, "x.yaml", {"moe.jitter_eps=0.01"});
  ASSERT_TRUE(c.ok());
  auto again = config::ParseConfig(c->ToYaml(), "resolved");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->ToYaml(), c->ToYaml());
  EXPECT_FLOAT_EQ(again->moe.jitter_eps, 0.01f);
}

TEST(ConfigTest, EveryBadInputNamesTheKeyAndValue) {
  EXPECT_EQ(Error("moe:\n  topk: 2\n"), "x.yaml: unknown key 'moe.topk'");
  EXPECT_EQ(Error("optim:\n  lr: 1\n"), "x.yaml: unknown section 'optim'");
  EXPECT_EQ(Error("moe:\n  top_k: two\n"), "x.yaml: moe.top_k: expected an integer, got 'two'");
  EXPECT_EQ(Error("moe:\n  normalize_gates: maybe\n"),
            "x.yaml: moe.normalize_gates: expected true or false, got 'maybe'");
  EXPECT_EQ(Error("moe:\n  activation: tanh\n"),
            "x.yaml: moe.activation='tanh' is not one of gelu, relu, swiglu");
  EXPECT_EQ(Error("moe: [1, 2]\n"), "x.yaml: section 'moe' must be a mapping");
  EXPECT_NE(Error("moe:\n  top_k: [1\n").find("YAML syntax error"), std::string::npos);
  EXPECT_EQ(Error(kYaml, {"moe.top_k=9"}), "moe.top_k=9 exceeds moe.num_experts=8");
  EXPECT_EQ(Error(kYaml, {"parallel.ep=3"}), "moe.num_experts=8 is not divisible by parallel.ep=3");
  EXPECT_EQ(Error(kYaml, {"parallel.ep=8", "parallel.pp=2"}),
            "parallel.tp=1 cp=1 pp=2 ep=8 etp=1 needs 16 ranks (or a multiple), but 8 were "
            "launched; launch with mpirun -np 16 switchyard ...");
  // Pipeline settings the layers or the schedule cannot take.
  const std::vector<std::string> pp2 = {"parallel.ep=1", "parallel.pp=2", "model.n_layers=4",
                                        "train.grad_accum=4"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), pp2.begin(), pp2.end());
    return Error(kYaml, extra);
  };
  EXPECT_EQ(with({}), "");
  EXPECT_EQ(with({"parallel.pp=8", "parallel.ep=1"}),
            "8 pipeline stages (parallel.pp x parallel.virtual_stages) for 4 layers: every "
            "stage needs at least one layer");
  EXPECT_EQ(with({"parallel.pipeline_schedule=zigzag"}),
            "--set: parallel.pipeline_schedule='zigzag' is not one of gpipe, 1f1b, interleaved");
  EXPECT_NE(with({"parallel.pipeline_schedule=interleaved", "parallel.virtual_stages=2",
                  "train.grad_accum=3"})
                .find("train.grad_accum=3 (the micro-batches): "),
            std::string::npos);
  EXPECT_NE(with({"parallel.virtual_stages=2"}).find("parallel.virtual_stages=2"),
            std::string::npos);
  EXPECT_EQ(with({"parallel.pipeline_layers=[1,1]"}),
            "parallel.pipeline_layers sums to 2 layers, the model has model.n_layers=4");
  EXPECT_EQ(with({"parallel.pipeline_layers=[4]"}),
            "parallel.pipeline_layers lists 1 stages, the layout has 2 (parallel.pp x "
            "parallel.virtual_stages)");
  EXPECT_EQ(with({"parallel.pipeline_layers=3"}),
            "--set: parallel.pipeline_layers: expected a list of integers, got '3'");
  EXPECT_EQ(Error(kYaml, {"moe.routed_scaling_factor=2.5"}), "");
  for (const char* bad : {"0", "-1"}) {
    EXPECT_EQ(Error(kYaml, {StrCat("moe.routed_scaling_factor=", bad)}),
              StrCat("moe.routed_scaling_factor=", bad,
                     " must be a finite number > 0 (1 leaves the gates as routed)"));
  }
  EXPECT_EQ(Error(kYaml, {"moe.router_lr_scale=10"}), "");
  for (const char* bad : {"0", "-2"}) {
    EXPECT_EQ(Error(kYaml, {StrCat("moe.router_lr_scale=", bad)}),
              StrCat("moe.router_lr_scale=", bad,
                     " must be a finite number > 0 (1: the routers at train.lr)"));
  }
  // Overlap chunks hold whole experts: at most E / ep of them.
  EXPECT_EQ(Error(kYaml, {"moe.overlap_chunks=2"}), "");
  EXPECT_EQ(Error(kYaml, {"moe.overlap_chunks=0"}),
            "moe.overlap_chunks=0 must be >= 1 (1: no chunks)");
  EXPECT_EQ(Error(kYaml, {"moe.overlap_chunks=3"}),
            "moe.overlap_chunks=3 exceeds the 2 experts per ep rank (moe.num_experts=8 / "
            "parallel.ep=4): each chunk holds whole experts");
  EXPECT_EQ(Error(kYaml, {"moe.second_expert_policy=random", "moe.top_k=1"}),
            "moe.second_expert_policy=random needs moe.top_k=2, got 1");
  EXPECT_EQ(Error(kYaml, {"top_k=2"}), "--set 'top_k=2': expected section.key=value");
  EXPECT_EQ(Error(kYaml, {"moe.nope=2"}), "--set: unknown key 'moe.nope'");
  EXPECT_EQ(Error("model:\n  d_model: 0\n"), "model.d_model=0 must be positive");
  EXPECT_EQ(Error(kYaml, {"logging.routing_every=-1"}),
            "logging.routing_every=-1 must be >= 0 (0: only at the last step)");
  EXPECT_EQ(Error(kYaml, {"logging.routing_every=x"}),
            "--set: logging.routing_every: expected an integer, got 'x'");
  auto missing = config::LoadConfig("/nonexistent/c.yaml");
  EXPECT_EQ(missing.status().message(),
            "/nonexistent/c.yaml: cannot open (No such file or directory)");
}

// The router keys of DeepSeek-V3 and global-batch balancing: they parse, round-trip, reach
// moe (with model.seq_len), and each bad value is one line naming the key.
TEST(ConfigTest, RouterScoreGroupsAndAuxScope) {
  auto c = config::ParseConfig(kYaml, "x.yaml",
                               {"moe.score=sigmoid", "moe.route_groups=4",
                                "moe.route_group_topk=2", "moe.aux_loss_scope=sequence",
                                "model.seq_len=64", "data.dir=d"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->moe.score, moe::ScoreFunction::kSigmoid);
  EXPECT_EQ(c->moe.route_groups, 4);
  EXPECT_EQ(c->moe.route_group_topk, 2);
  EXPECT_EQ(c->moe.aux_loss_scope, moe::AuxLossScope::kSequence);
  EXPECT_EQ(c->moe.seq_len, 64);
  EXPECT_TRUE(c->Validate(8).ok()) << c->Validate(8);
  auto again = config::ParseConfig(c->ToYaml(), "resolved");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->ToYaml(), c->ToYaml());
  EXPECT_EQ(Error(kYaml, {"moe.score=tanh"}),
            "--set: moe.score='tanh' is not one of softmax, sigmoid");
  EXPECT_EQ(Error(kYaml, {"moe.aux_loss_scope=batch"}),
            "--set: moe.aux_loss_scope='batch' is not one of group, sequence, global");
  EXPECT_EQ(Error(kYaml, {"moe.route_groups=3", "moe.route_group_topk=1"}),
            "moe.route_groups=3 does not divide moe.num_experts=8");
  EXPECT_EQ(Error(kYaml, {"moe.route_groups=4", "moe.route_group_topk=5"}),
            "moe.route_group_topk=5 must be in [1, 4] (moe.route_groups=4)");
  EXPECT_EQ(Error(kYaml, {"moe.route_groups=8", "moe.route_group_topk=1"}),
            "moe.top_k=2 exceeds the 1 experts of moe.route_group_topk=1 groups of 1 "
            "(moe.num_experts / moe.route_groups)");
  EXPECT_EQ(Error(kYaml, {"moe.route_group_topk=1"}),
            "moe.route_group_topk=1 needs moe.route_groups > 0 (node-limited routing is off)");
  EXPECT_EQ(Error(kYaml, {"moe.score=sigmoid", "runtime.device=cuda"}),
            "moe.score=sigmoid runs on the CPU only (runtime.device=cuda)");
  EXPECT_EQ(Error(kYaml, {"moe.route_groups=2", "moe.route_group_topk=1", "runtime.device=cuda"}),
            "moe.route_groups=2 (node-limited routing) runs on the CPU only (runtime.device=cuda)");
}

// The expert bias's update rule: sign (the default) or proportional, which parses,
// round-trips and needs a positive rate.
TEST(ConfigTest, ExpertBiasUpdate) {
  auto d = config::ParseConfig(kYaml, "x.yaml", {"data.dir=d"});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->moe.expert_bias_update, moe::ExpertBiasUpdate::kSign);
  auto c = config::ParseConfig(kYaml, "x.yaml",
                               {"moe.expert_bias_rate=0.0003",
                                "moe.expert_bias_update=proportional", "data.dir=d"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->moe.expert_bias_update, moe::ExpertBiasUpdate::kProportional);
  EXPECT_TRUE(c->Validate(8).ok()) << c->Validate(8);
  auto again = config::ParseConfig(c->ToYaml(), "resolved");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->moe.expert_bias_update, moe::ExpertBiasUpdate::kProportional);
  EXPECT_EQ(again->ToYaml(), c->ToYaml());
  EXPECT_EQ(Error(kYaml, {"moe.expert_bias_update=linear"}),
            "--set: moe.expert_bias_update='linear' is not one of sign, proportional");
  EXPECT_EQ(Error(kYaml, {"moe.expert_bias_update=proportional"}),
            "moe.expert_bias_update=proportional needs moe.expert_bias_rate > 0 (0: no expert bias)");
}

// ---- train: optimizer, schedule, clipping, buckets -------------------------------------

TEST(ConfigTest, TrainDefaults) {
  auto c = config::ParseConfig("", "x.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  const config::TrainConfig& t = c->train;
  EXPECT_EQ(t.optimizer, config::OptimizerKind::kAdamW);
  EXPECT_FLOAT_EQ(t.lr, 3e-4f);
  EXPECT_FLOAT_EQ(t.min_lr, -1.0f);  // unset: 0.1 * lr
  EXPECT_FLOAT_EQ(t.resolved_min_lr(), 3e-5f);
  EXPECT_EQ(t.warmup_steps, 0);
  EXPECT_EQ(t.max_steps, 1000);
  EXPECT_FLOAT_EQ(t.weight_decay, 0.1f);
  EXPECT_FLOAT_EQ(t.beta1, 0.9f);
  EXPECT_FLOAT_EQ(t.beta2, 0.95f);
  EXPECT_FLOAT_EQ(t.eps, 1e-8f);
  EXPECT_FLOAT_EQ(t.momentum, 0.9f);
  EXPECT_FLOAT_EQ(t.grad_clip, 1.0f);
  EXPECT_FLOAT_EQ(t.bucket_mb, 25.0f);
  EXPECT_EQ(t.bucket_bytes(), 25 * 1024 * 1024);
  EXPECT_EQ(t.recompute, model::Recompute::kNone);
  EXPECT_TRUE(t.Validate().ok());
  // A TrainConfig built in code keeps -1 and resolves it when asked.
  config::TrainConfig code;
  EXPECT_FLOAT_EQ(code.min_lr, -1.0f);
  EXPECT_FLOAT_EQ(train::ScheduleFor(code).min_lr, 3e-5f);
  EXPECT_TRUE(code.Validate().ok());
}

TEST(ConfigTest, TrainKeysParseAndFeedTheOptimizerAndSchedule) {
  auto c = config::ParseConfig(R"(
train:
  optimizer: sgd
  lr: 1.0e-2
  min_lr: 0
  warmup_steps: 100
  max_steps: 2000
  weight_decay: 0.01
  beta1: 0.8
  beta2: 0.999
  eps: 1.0e-6
  momentum: 0.5
  grad_clip: 0
  bucket_mb: 0.5
)", "x.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  const config::TrainConfig& t = c->train;
  EXPECT_TRUE(t.Validate().ok());
  EXPECT_EQ(t.optimizer, config::OptimizerKind::kSgd);
  EXPECT_FLOAT_EQ(t.min_lr, 0.0f);  // 0 is 0: decay to zero
  EXPECT_EQ(t.bucket_bytes(), 512 * 1024);
  const train::OptimizerOptions o = train::OptimizerOptionsFor(t);
  EXPECT_EQ(o.kind, config::OptimizerKind::kSgd);
  EXPECT_FLOAT_EQ(o.weight_decay, 0.01f);
  EXPECT_FLOAT_EQ(o.beta1, 0.8f);
  EXPECT_FLOAT_EQ(o.beta2, 0.999f);
  EXPECT_FLOAT_EQ(o.eps, 1e-6f);
  EXPECT_FLOAT_EQ(o.momentum, 0.5f);
  const train::LrSchedule s = train::ScheduleFor(t);
  EXPECT_FLOAT_EQ(s.lr, 1e-2f);
  EXPECT_FLOAT_EQ(s.min_lr, 0.0f);
  EXPECT_EQ(s.warmup_steps, 100);
  EXPECT_EQ(s.max_steps, 2000);
  EXPECT_FLOAT_EQ(s.LrAt(99), 1e-2f);
  EXPECT_FLOAT_EQ(s.LrAt(2000), 0.0f);
}

TEST(ConfigTest, TrainRecomputeParsesAndRoundTrips) {
  for (auto [name, mode] : {std::pair<const char*, model::Recompute>{"none", model::Recompute::kNone},
                            {"selective", model::Recompute::kSelective},
                            {"full", model::Recompute::kFull}}) {
    auto c = config::ParseConfig("", "x.yaml", {std::string("train.recompute=") + name});
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->train.recompute, mode);
    const std::string yaml = c->ToYaml();
    EXPECT_NE(yaml.find(std::string("\n  recompute: ") + name + "\n"), std::string::npos) << yaml;
    auto again = config::ParseConfig(yaml, "resolved");
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->train.recompute, mode);
  }
}

TEST(ConfigTest, TrainLrDecayStyleParsesFeedsTheScheduleAndRoundTrips) {
  auto c = config::ParseConfig("train:\n  lr_decay_style: wsd\n  lr_decay_steps: 30\n", "x.yaml",
                               {"train.max_steps=100", "train.warmup_steps=10"});
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->train.Validate().ok()) << c->train.Validate();
  EXPECT_EQ(c->train.lr_decay_style, config::LrDecayStyle::kWsd);
  const train::LrSchedule s = train::ScheduleFor(c->train);
  EXPECT_EQ(s.style, config::LrDecayStyle::kWsd);
  EXPECT_EQ(s.decay_steps, 30);
  const std::string yaml = c->ToYaml();
  EXPECT_NE(yaml.find("\n  lr_decay_style: wsd\n  lr_decay_steps: 30\n"), std::string::npos) << yaml;
  auto again = config::ParseConfig(yaml, "resolved");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->ToYaml(), yaml);
  auto defaults = config::ParseConfig("", "x.yaml");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->train.lr_decay_style, config::LrDecayStyle::kCosine);
  EXPECT_EQ(defaults->train.lr_decay_steps, 0);
}

TEST(ConfigTest, TrainMinLrFollowsOverriddenLrAndRoundTrips) {
  auto c = config::ParseConfig("train:\n  lr: 1.0e-3\n", "x.yaml", {"train.lr=0.02"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FLOAT_EQ(c->train.lr, 0.02f);
  EXPECT_FLOAT_EQ(c->train.resolved_min_lr(), 0.002f);
  const std::string yaml = c->ToYaml();
  EXPECT_NE(yaml.find("train:\n  optimizer: adamw\n  lr: 0.0199999996\n"
                      "  min_lr: -1  # 0.1 * lr = 0.00200000009\n"),
            std::string::npos)
      << yaml;
  auto again = config::ParseConfig(yaml, "resolved");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->ToYaml(), yaml);
  EXPECT_FLOAT_EQ(again->train.resolved_min_lr(), 0.002f);
  // A saved config read with a lower lr (a resumed run's, eval's --set): min_lr follows it,
  // where a resolved 0.002 would be above the new lr and refused.
  auto lower = config::ParseConfig(yaml, "resolved", {"train.lr=0.0001"});
  ASSERT_TRUE(lower.ok()) << lower.status();
  EXPECT_TRUE(lower->train.Validate().ok()) << lower->train.Validate();
  EXPECT_FLOAT_EQ(lower->train.resolved_min_lr(), 1e-5f);
}

// Every string a config holds is written so that it reads back the same: paths with ": ",
// " #", quotes, backslashes, newlines, a leading space or dash, "null", the empty string.
TEST(ConfigTest, StringValuesRoundTripThroughToYaml) {
  for (const std::string dir :
       {"data/fortunes", "corpus: v2", "data/x #1", "a \"quoted\" \\ path", "line\nbreak\ttab",
        " leading", "-dash", "null", "~", "", "caf\xc3\xa9/\x01ctl", "[x]", "{a: b}", "*alias",
        "&anchor", "!tag", "%percent", "@at", "`tick`", "'single'", "x,y", "?q", "|pipe"}) {
    config::Config c;
    c.data.dir = dir;
    c.data.paths = {{.dir = dir, .weight = 2}};
    const std::string yaml = c.ToYaml();
    auto again = config::ParseConfig(yaml, "saved");
    ASSERT_TRUE(again.ok()) << "'" << dir << "': " << again.status() << "\n" << yaml;
    EXPECT_EQ(again->data.dir, dir);
    ASSERT_EQ(again->data.paths.size(), 1u);
    EXPECT_EQ(again->data.paths[0].dir, dir);
    EXPECT_EQ(again->ToYaml(), yaml);
  }
  config::Config plain;
  plain.data.dir = "data/fortunes";
  EXPECT_NE(plain.ToYaml().find("\n  dir: data/fortunes\n"), std::string::npos);
  EXPECT_NE(plain.ToYaml().find("\n  order: tp-cp-ep-dp-pp\n"), std::string::npos);
}

// Booleans are true or false (YAML 1.2's core schema: also True, TRUE, False, FALSE); YAML
// 1.1's yes, no, on, off, y and n are refused, as 010 is.
TEST(ConfigTest, BooleansAreTrueOrFalse) {
  for (const char* text : {"true", "True", "TRUE"}) {
    auto c = config::ParseConfig("", "x.yaml", {std::string("model.bias=") + text});
    ASSERT_TRUE(c.ok()) << text << ": " << c.status();
    EXPECT_TRUE(c->model.bias) << text;
  }
  for (const char* text : {"false", "False", "FALSE"}) {
    auto c = config::ParseConfig("model:\n  bias: " + std::string(text) + "\n", "x.yaml");
    ASSERT_TRUE(c.ok()) << text << ": " << c.status();
    EXPECT_FALSE(c->model.bias) << text;
  }
  for (const char* text : {"y", "n", "yes", "no", "on", "off", "NO", "Yes", "1", "0"}) {
    auto c = config::ParseConfig("", "x.yaml", {std::string("model.bias=") + text});
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_EQ(c.status().message(),
              std::string("--set: model.bias: expected true or false, got '") + text + "'");
  }
}

TEST(ConfigTest, BadTrainKeysNameTheKeyAndValue) {
  auto parse_error = [](const std::string& yaml) {
    auto c = config::ParseConfig(yaml, "x.yaml");
    return c.ok() ? std::string() : std::string(c.status().message());
  };
  EXPECT_EQ(parse_error("train:\n  optimizer: adam\n"),
            "x.yaml: train.optimizer='adam' is not one of adamw, sgd");
  EXPECT_EQ(parse_error("train:\n  lr: fast\n"), "x.yaml: train.lr: expected a number, got 'fast'");
  EXPECT_EQ(parse_error("train:\n  warmup_steps: 1.5\n"),
            "x.yaml: train.warmup_steps: expected an integer, got '1.5'");
  EXPECT_EQ(parse_error("train:\n  learning_rate: 1\n"), "x.yaml: unknown key 'train.learning_rate'");
  EXPECT_EQ(parse_error("train:\n  recompute: partial\n"),
            "x.yaml: train.recompute='partial' is not one of none, selective, full");
  EXPECT_EQ(parse_error("train:\n  recompute: [full]\n"),
            "x.yaml: train.recompute: expected a name, got '[...]'");

  auto invalid = [](std::vector<std::string> overrides) {
    auto c = config::ParseConfig("", "x.yaml", overrides);
    if (!c.ok()) return std::string(c.status().message());
    Status s = c->train.Validate();
    return s.ok() ? std::string() : std::string(s.message());
  };
  EXPECT_EQ(invalid({"train.lr=0"}), "train.lr=0 must be > 0");
  EXPECT_EQ(invalid({"train.lr=0.1", "train.min_lr=0.5"}),
            "train.min_lr=0.5 must be in [0, train.lr=0.1] (or -1: 0.1 * lr)");
  EXPECT_EQ(invalid({"train.min_lr=-2"}),
            "train.min_lr=-2 must be in [0, train.lr=0.0003] (or -1: 0.1 * lr)");
  EXPECT_EQ(invalid({"train.warmup_steps=-1"}), "train.warmup_steps=-1 must be >= 0");
  EXPECT_EQ(invalid({"train.max_steps=0"}), "train.max_steps=0 must be >= 1");
  EXPECT_EQ(invalid({"train.warmup_steps=20", "train.max_steps=10"}),
            "train.warmup_steps=20 exceeds train.max_steps=10");
  EXPECT_EQ(parse_error("train:\n  lr_decay_style: exponential\n"),
            "x.yaml: train.lr_decay_style='exponential' is not one of cosine, linear, constant, wsd");
  EXPECT_EQ(invalid({"train.lr_decay_style=wsd"}),
            "train.lr_decay_steps=0 must be in [1, train.max_steps - train.warmup_steps = 1000] "
            "under train.lr_decay_style=wsd (the final decay's length)");
  EXPECT_EQ(invalid({"train.lr_decay_style=wsd", "train.warmup_steps=10", "train.max_steps=100",
                     "train.lr_decay_steps=91"}),
            "train.lr_decay_steps=91 must be in [1, train.max_steps - train.warmup_steps = 90] "
            "under train.lr_decay_style=wsd (the final decay's length)");
  EXPECT_EQ(invalid({"train.lr_decay_steps=5"}),
            "train.lr_decay_steps=5 is read only under train.lr_decay_style=wsd (this config's is "
            "cosine)");
  EXPECT_EQ(invalid({"train.weight_decay=-0.1"}), "train.weight_decay=-0.1 must be >= 0");
  EXPECT_EQ(invalid({"train.beta1=-0.5"}), "train.beta1=-0.5 must be in [0, 1)");
  EXPECT_EQ(invalid({"train.beta2=1"}), "train.beta2=1 must be in [0, 1)");
  EXPECT_EQ(invalid({"train.momentum=1.5"}), "train.momentum=1.5 must be in [0, 1)");
  EXPECT_EQ(invalid({"train.eps=0"}), "train.eps=0 must be > 0");
  EXPECT_EQ(invalid({"train.grad_clip=-1"}), "train.grad_clip=-1 must be >= 0 (0: no clipping)");
  EXPECT_EQ(invalid({"train.bucket_mb=0"}), "train.bucket_mb=0 must be in (0, 1e6]");
  EXPECT_EQ(invalid({"train.head_chunk_tokens=-1"}),
            "train.head_chunk_tokens=-1 must be >= 0 (0: the whole micro-batch at once)");
  // Config::Validate checks the train section too.
  EXPECT_EQ(Error(kYaml, {"train.beta2=1"}), "train.beta2=1 must be in [0, 1)");
}

}  // namespace
// The closed choices (parallel.pipeline_schedule, runtime.device and runtime.precision,
// train.on_nonfinite): every name parses to its value and prints back as the same text in the
// resolved YAML, which parses again to the same config.
TEST(ConfigTest, ChoicesPrintBackAsTheirNames) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> choices = {
      {"parallel.pipeline_schedule", {"gpipe", "1f1b", "interleaved"}},
      {"runtime.device", {"cpu", "cuda", "cuda:0", "cuda:3"}},
      {"runtime.precision", {"auto", "fp32", "bf16"}},
      {"train.on_nonfinite", {"stop", "skip"}},
  };
  for (const auto& [key, names] : choices) {
    for (const std::string& name : names) {
      auto c = config::ParseConfig("", "x.yaml", {key + "=" + name});
      ASSERT_TRUE(c.ok()) << key << "=" << name << ": " << c.status();
      const std::string yaml = c->ToYaml();
      const std::string line = "  " + key.substr(key.find('.') + 1) + ": " + name + "\n";
      EXPECT_NE(yaml.find(line), std::string::npos) << key << "=" << name << "\n" << yaml;
      auto again = config::ParseConfig(yaml, "resolved");
      ASSERT_TRUE(again.ok()) << again.status();
      EXPECT_EQ(again->ToYaml(), yaml);
    }
  }
  auto c = config::ParseConfig("", "x.yaml",
                               {"parallel.pipeline_schedule=gpipe", "runtime.device=cuda",
                                "train.on_nonfinite=skip"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->parallel.pipeline_schedule, parallel::PipelineSchedule::kGPipe);
  EXPECT_TRUE(c->runtime.device.is_local_cuda());  // plain cuda: the rank's local GPU
  EXPECT_EQ(c->train.on_nonfinite, config::NonFiniteAction::kSkip);
  auto d = config::ParseConfig("", "x.yaml", {"runtime.device=cuda:0"});
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->runtime.device.is_local_cuda());  // cuda:0 is exactly GPU 0
  EXPECT_EQ(d->runtime.device.index, 0);
  // Defaults.
  auto e = config::ParseConfig("", "x.yaml");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->parallel.pipeline_schedule, parallel::PipelineSchedule::kOneFOneB);
  EXPECT_EQ(e->train.on_nonfinite, config::NonFiniteAction::kStop);
  EXPECT_EQ(Error("train:\n  on_nonfinite: halt\n"),
            "x.yaml: train.on_nonfinite='halt' is not one of stop, skip");
  EXPECT_EQ(Error("train:\n  on_nonfinite: [stop]\n"),
            "x.yaml: train.on_nonfinite: expected a name, got '[...]'");
}

TEST(ConfigTest, RuntimeSectionParsesAndNamesBadValues) {
  auto c = config::ParseConfig("runtime:\n  device: cuda:1\n  precision: bf16\n", "x.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->runtime.device, (config::RuntimeDevice{DeviceType::kCUDA, 1}));
  EXPECT_EQ(c->runtime.precision, config::Precision::kBf16);
  EXPECT_TRUE(c->runtime.Validate().ok());
  auto d = config::ParseConfig("", "x.yaml");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->runtime.device, config::RuntimeDevice{});
  EXPECT_TRUE(d->runtime.device.is_cpu());
  EXPECT_EQ(d->runtime.precision, config::Precision::kAuto);
  EXPECT_NE(d->ToYaml().find("runtime:\n  device: cpu\n  precision: auto\n"), std::string::npos);
  EXPECT_EQ(Error("", {"runtime.device=gpu"}),
            "--set: runtime.device='gpu' is not one of cpu, cuda, cuda:N");
  EXPECT_EQ(Error("", {"runtime.device=cuda:x"}),
            "--set: runtime.device='cuda:x' is not one of cpu, cuda, cuda:N");
  EXPECT_EQ(Error("", {"runtime.precision=fp16"}),
            "--set: runtime.precision='fp16' is not one of auto, fp32, bf16");
  EXPECT_EQ(Error("runtime:\n  dtype: bf16\n"), "x.yaml: unknown key 'runtime.dtype'");
}

// runtime.activation_dtype: fp32 by default; bf16 needs bf16 products (precision bf16, or
// auto on a GPU), and with fp32 products is one line naming both keys.
TEST(ConfigTest, ActivationDtypeNeedsBf16Products) {
  auto d = config::ParseConfig("", "x.yaml");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->runtime.activation_dtype, config::ActivationDtype::kFp32);
  EXPECT_NE(d->ToYaml().find("  precision: auto\n  activation_dtype: fp32\n"), std::string::npos);
  for (const char* ok : {"runtime.precision=bf16", "runtime.device=cuda"}) {
    auto c = config::ParseConfig("", "x.yaml", {"runtime.activation_dtype=bf16", ok});
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->runtime.activation_dtype, config::ActivationDtype::kBf16);
    EXPECT_TRUE(c->runtime.Validate().ok()) << ok << ": " << c->runtime.Validate();
    auto again = config::ParseConfig(c->ToYaml(), "resolved");
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->runtime.activation_dtype, config::ActivationDtype::kBf16);
  }
  EXPECT_EQ(Error("", {"runtime.activation_dtype=bf16"}),
            "runtime.activation_dtype=bf16 needs bf16 matrix products, but runtime.precision=auto "
            "resolves to fp32 on cpu; set runtime.precision=bf16 or runtime.activation_dtype=fp32");
  EXPECT_EQ(Error("", {"runtime.activation_dtype=bf16", "runtime.precision=fp32",
                       "runtime.device=cuda"}),
            "runtime.activation_dtype=bf16 needs bf16 matrix products, but runtime.precision=fp32 "
            "resolves to fp32 on cuda; set runtime.precision=bf16 or runtime.activation_dtype=fp32");
  EXPECT_EQ(Error("", {"runtime.activation_dtype=fp16"}),
            "--set: runtime.activation_dtype='fp16' is not one of fp32, bf16");
}

}  // namespace switchyard::train

namespace switchyard::train {
namespace {

// moe.replicate_hot_experts / moe.replicate_every: parsed, round-tripped, and every bad
// value or layout named in one line.
TEST(ConfigTest, ReplicationKeysParseAndNameBadValues) {
  auto c = config::ParseConfig(kYaml, "x.yaml",
                               {"moe.replicate_hot_experts=2", "moe.replicate_every=5"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->moe.replicate_hot_experts, 2);
  EXPECT_EQ(c->moe.replicate_every, 5);
  EXPECT_EQ(Error(kYaml, {"moe.replicate_hot_experts=2"}), "");
  auto back = config::ParseConfig(c->ToYaml(), "resolved.yaml");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->moe.replicate_hot_experts, 2);
  EXPECT_EQ(back->moe.replicate_every, 5);
  // Defaults: off, re-planned every step.
  auto d = config::ParseConfig(kYaml, "x.yaml");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->moe.replicate_hot_experts, 0);
  EXPECT_EQ(d->moe.replicate_every, 1);

  EXPECT_EQ(Error(kYaml, {"moe.replicate_hot_experts=-1"}),
            "moe.replicate_hot_experts=-1 must be in [0, moe.num_experts=8)");
  EXPECT_EQ(Error(kYaml, {"moe.replicate_hot_experts=8"}),
            "moe.replicate_hot_experts=8 must be in [0, moe.num_experts=8)");
  EXPECT_EQ(Error(kYaml, {"moe.replicate_every=0"}), "moe.replicate_every=0 must be >= 1");
  EXPECT_EQ(Error(kYaml, {"moe.replicate_hot_experts=1", "parallel.ep=1"}),
            "moe.replicate_hot_experts=1 needs parallel.ep > 1 (replicas live on the other "
            "ranks of an ep group), got parallel.ep=1");
  EXPECT_EQ(Error(kYaml, {"moe.replicate_hot_experts=1", "parallel.ep=2", "parallel.etp=2"}),
            "moe.replicate_hot_experts=1 does not support split experts: expert tensor "
            "parallelism is 2 (set parallel.etp=1)");
  EXPECT_EQ(Error(kYaml, {"moe.replicate_hot_experts=1", "parallel.zero_stage=3"}),
            "moe.replicate_hot_experts=1 does not support parallel.zero_stage=3 (use 0, 1 or 2)");
  EXPECT_EQ(Error(kYaml, {"moe.replicate_hot_experts=1", "moe.overlap_chunks=2"}),
            "moe.replicate_hot_experts=1 does not combine with moe.overlap_chunks=2 yet (the "
            "chunks cut this rank's own experts; set one of them off)");
}

}  // namespace
}  // namespace switchyard::train
