// Hardware files (engine/plan/hardware.h): the shipped ones parse, and each mistake is one
// line naming the key (absurd values included: they made every step time inf).
#include <gtest/gtest.h>

#include <string>

#include "engine/plan/hardware.h"
#include "tests/engine/plan/round_hardware.h"

namespace switchyard::plan {
namespace {

TEST(HardwareTest, ShippedFilesParse) {
  for (const char* name : {"h100", "h200", "a100-80g", "a100-40g", "h800"}) {
    auto h = LoadHardware(name, SWITCHYARD_SOURCE_DIR "/configs/hardware");
    ASSERT_TRUE(h.ok()) << name << ": " << h.status();
    EXPECT_EQ(h->name, name);
    EXPECT_FALSE(h->source.empty()) << name;
    EXPECT_EQ(h->gpus_per_node, 8);
    EXPECT_GT(h->Peak("bf16"), h->Peak("fp32"));
  }
  auto missing = LoadHardware("b300", SWITCHYARD_SOURCE_DIR "/configs/hardware");
  EXPECT_NE(std::string(missing.status().message()).find("no such hardware (known in"), std::string::npos);
}

TEST(HardwareTest, MistakesNameTheKey) {
  const std::string good = kRoundHardware;
  const auto error = [](const std::string& yaml) {
    return std::string(ParseHardware(yaml, "hw.yaml").status().message());
  };
  EXPECT_EQ(error(good + "colour: red\n"), "hw.yaml: unknown key 'colour'");
  std::string no_bw = good;
  no_bw.replace(no_bw.find("memory_bandwidth"), 22, "");
  EXPECT_EQ(error(no_bw), "hw.yaml: missing key 'memory_bandwidth'");
  std::string negative = good;
  negative.replace(negative.find("bandwidth: 1e10"), 15, "bandwidth: -3");
  EXPECT_EQ(error(negative), "hw.yaml: intra_node.bandwidth=-3 must be a positive number");
  std::string word = good;
  word.replace(word.find("bf16: 1e12"), 10, "bf16: fast");
  EXPECT_EQ(error(word), "hw.yaml: peak_flops.bf16: expected a number");
  std::string over = good;
  over.replace(over.find("efficiency: 0.5"), 15, "efficiency: 1.5");
  EXPECT_EQ(error(over), "hw.yaml: gemm.efficiency=1.5 is out of range (1e-06 to 1: a share of the peak)");
  EXPECT_EQ(error(good + "cores_per_node: 1.5\n"), "hw.yaml: cores_per_node=1.5 must be a whole number");
  EXPECT_EQ(error(good + "cores_per_node: 3e9\n"),
            "hw.yaml: cores_per_node=3e+09 is out of range (0 to 1048576)");
  {  // a node beyond int (it read back as -2147483648)
    std::string huge = good;
    huge.replace(huge.find("gpus_per_node: 8"), 16, "gpus_per_node: 99999999999");
    EXPECT_EQ(error(huge), "hw.yaml: gpus_per_node=1e+11 is out of range (1 to 131072)");
  }
  EXPECT_EQ(error(good + "grouped_gemm_efficiency: 1.5\n"),
            "hw.yaml: grouped_gemm_efficiency=1.5 is out of range (1e-06 to 1: a share of the peak)");
  EXPECT_EQ(ParseHardware(good + "grouped_gemm_efficiency: 0.3\n", "g.yaml")->grouped_gemm_efficiency, 0.3);
  EXPECT_EQ(ParseHardware(good, "hw.yaml")->grouped_gemm_efficiency, 0);  // absent: gemm's
  EXPECT_EQ(error(good + "elementwise_efficiency: 2\n"),
            "hw.yaml: elementwise_efficiency=2 is out of range (1e-06 to 1: a share of the peak)");
  EXPECT_EQ(error(good + "elementwise_efficiency: 0\n"),
            "hw.yaml: elementwise_efficiency=0 must be a positive number");
  EXPECT_EQ(ParseHardware(good + "elementwise_efficiency: 0.4\n", "g.yaml")->elementwise_efficiency,
            0.4);
  EXPECT_EQ(ParseHardware(good, "hw.yaml")->elementwise_efficiency, 1);  // absent: the bandwidth's
  EXPECT_EQ(error(good + "op_latency: 0\n"), "hw.yaml: op_latency=0 must be a positive number");
  {  // positive but absurd: every step time overflowed to inf and printed NaN, with exit 0
    const auto with = [&](const char* from, const char* to) {
      std::string yaml = good;
      yaml.replace(yaml.find(from), std::string(from).size(), to);
      return error(yaml);
    };
    EXPECT_EQ(with("memory_bandwidth: 1e11", "memory_bandwidth: 1e-300"),
              "hw.yaml: memory_bandwidth=1e-300 is out of range (1000 to 1e+16 bytes/s)");
    EXPECT_EQ(with("bf16: 1e12", "bf16: 1e-300"),
              "hw.yaml: peak_flops.bf16=1e-300 is out of range (1e+06 to 1e+19 FLOP/s)");
    EXPECT_EQ(with("latency: 1e-5", "latency: 1e300"),
              "hw.yaml: intra_node.latency=1e300 is out of range (0 to 10 s)");
    EXPECT_EQ(with("memory_bytes: 1e10", "memory_bytes: 1e300"),
              "hw.yaml: memory_bytes=1e300 is out of range (1e+06 to 1e+16 bytes)");
    EXPECT_EQ(with("half_flops: 1e6", "half_flops: 1e300"),
              "hw.yaml: gemm.half_flops=1e300 is out of range (0 to 1e+18 FLOP)");
    EXPECT_EQ(error(good + "elementwise_efficiency: 1e-9\n"),
              "hw.yaml: elementwise_efficiency=1e-9 is out of range (1e-06 to 1: a share of the peak)");
  }
  EXPECT_EQ(error(good + "graph_op_latency: -1\n"),
            "hw.yaml: graph_op_latency=-1 must be a positive number");
  auto graphs = ParseHardware(good + "op_latency: 9e-6\ngraph_op_latency: 2e-6\n", "g.yaml");
  ASSERT_TRUE(graphs.ok()) << graphs.status();
  EXPECT_EQ(graphs->graph_op_latency, 2e-6);
  EXPECT_LT(ParseHardware(good, "hw.yaml")->graph_op_latency, 0);  // absent
  auto cpu = ParseHardware(good + "cores_per_node: 2\nop_latency: 9e-6\n", "cpu.yaml");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->cores_per_node, 2);
  EXPECT_EQ(cpu->op_latency, 9e-6);
}

}  // namespace
}  // namespace switchyard::plan
