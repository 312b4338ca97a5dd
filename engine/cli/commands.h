// The subcommands of `switchyard`. Each takes its arguments after the subcommand name and
// returns the process exit status (args.h: 0 ok, 1 failure, 2 usage error). main.cc lists
// them in its command table.
#pragma once

#include <string>
#include <vector>

namespace switchyard::cli {

// switchyard mesh --world N [--tp N] [--cp N] [--ep N] [--etp N] [--pp N] [--order S]
// [--json]: prints every group of the dense and expert views of a layout.
int RunMesh(const std::vector<std::string>& args);

// switchyard plan --config F --gpus N [--gpu NAME|FILE] [--gpus-per-node N] [--global-batch N]
// [--skew X|FILE] [--precision P] [--top N] [--config-layout] [--json]
// [--set k=v ...]: the fastest layouts that fit, by predicted step time; docs/plan.md.
int RunPlan(const std::vector<std::string>& args);

// switchyard pipeline --pp N --micro-batches N [--schedule gpipe|1f1b|interleaved]
// [--virtual-stages N] [--forward-cost N] [--backward-cost N] [--actions]: validates a
// pipeline schedule and prints its timeline, bubble and peak in-flight micro-batches per
// rank; see docs/pipeline.md.
int RunPipeline(const std::vector<std::string>& args);

// switchyard prep --out DIR [--vocab N] [--val-fraction F] [--seed S] [--max-docs-per-label N]
// [--label S] [--shard-tokens N] [--fortunes DIR] [--force] [FILE ...]: trains a tokenizer
// and writes token shards and index.json (default corpus: the fortune files); docs/data.md.
int RunPrep(const std::vector<std::string>& args);

// switchyard moe-layer --config FILE --input FILE --out FILE [--mode train|eval] [--step N]
// [--layer N] [--set section.key=value ...]: forward and backward of one MoE layer on the
// tensors of a safetensors file (any number of ranks under mpirun); see docs/moe-layer.md.
int RunTrain(const std::vector<std::string>& args);
int RunMoELayer(const std::vector<std::string>& args);

// switchyard eval --checkpoint DIR [--data DIR] [--batches N] [--json] [--set k=v ...]:
// validation loss, perplexity and per-MoE-layer routing statistics of a checkpoint in eval
// mode (one rank, or many under mpirun).
int RunEval(const std::vector<std::string>& args);

// switchyard report RUN [RUN ...] --out FILE.html [--route FILE.json] [--title S]: one
// self-contained HTML page of the runs' losses, throughput and routing over the steps,
// drawn by scripts/report.py; see docs/report.md.
int RunReport(const std::vector<std::string>& args);

// switchyard route --checkpoint DIR (--text S | --file F) [--data DIR] [--json]
// [--color auto|always|never] [--set k=v ...]: per token and MoE layer of a text, the
// chosen experts, their gates and whether capacity dropped them (eval mode, the text one
// routing group); see docs/route.md.
int RunRoute(const std::vector<std::string>& args);

// switchyard export --format hf-mixtral CHECKPOINT OUT and switchyard import --format
// hf-mixtral DIR OUT [--set k=v ...]: to and from Hugging Face's MixtralForCausalLM
// directories; see docs/hf.md.
int RunExport(const std::vector<std::string>& args);
int RunImport(const std::vector<std::string>& args);

// switchyard upcycle --checkpoint DIR --out DIR [--set k=v ...]: sparse upcycling, a
// step-0 checkpoint of an MoE model whose experts start as copies of a checkpoint's MLPs;
// see docs/upcycling.md.
int RunUpcycle(const std::vector<std::string>& args);

// switchyard checkpoint verify DIR [--json]: checks a checkpoint (checksums, step, pieces,
// finite values) without building a model; one process.
int RunCheckpoint(const std::vector<std::string>& args);
// What `checkpoint verify` and `eval --verify` print and return for `dir`; errors as
// "<command>: error: ..." on stderr.
int VerifyCheckpointDir(const std::string& command, const std::string& dir, bool json);

}  // namespace switchyard::cli
