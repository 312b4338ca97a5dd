// `switchyard prep`: turns text files (by default Debian's fortune files in several
// languages) into a SentencePiece tokenizer, token shards and index.json, then prints
// documents and tokens per label and split. See engine/data/prep.h and docs/data.md.
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "engine/cli/args.h"
#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "engine/data/corpus.h"
#include "engine/data/prep.h"
#include "engine/dist/process.h"

namespace switchyard::cli {
namespace {

constexpr char kCommand[] = "switchyard prep";

// Flags that take a value; needed to tell "--vocab 100" from a file named "100".
constexpr const char* kValueFlags[] = {
    "out",      "vocab",     "val-fraction", "seed",      "label",     "shard-tokens",
    "max-docs-per-label", "fortunes", "json-key", "label-key", "format", "tokenizer",
    "tokenizer-sample-bytes", "threads"};

bool TakesValue(const std::string& arg) {
  if (arg.find('=') != std::string::npos) return false;
  for (const char* name : kValueFlags) {
    if (arg == std::string("--") + name) return true;
  }
  return false;
}

// Splits args into flags (for FlagSet) and file names; "--" ends the flags.
void SplitArgs(const std::vector<std::string>& args, std::vector<std::string>* flags,
               std::vector<std::string>* files) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      files->insert(files->end(), args.begin() + i + 1, args.end());
      return;
    }
    if (arg.rfind("--", 0) == 0 || arg == "-h") {
      flags->push_back(arg);
      if (TakesValue(arg) && i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
        flags->push_back(args[++i]);
      }
      continue;
    }
    files->push_back(arg);
  }
}

Status ParseDouble(const std::string& flag, const std::string& text, double* value) {
  const char* end = text.data() + text.size();
  const auto [ptr, error] = std::from_chars(text.data(), end, *value);
  if (text.empty() || error != std::errc() || ptr != end) {
    return InvalidArgument("--", flag, " expects a number, got \"", text, "\"");
  }
  return OkStatus();
}

Status ParseUnsigned(const std::string& flag, const std::string& text, uint64_t* value) {
  const char* end = text.data() + text.size();
  const auto [ptr, error] = std::from_chars(text.data(), end, *value);
  if (text.empty() || error != std::errc() || ptr != end) {
    return InvalidArgument("--", flag, " expects a non-negative integer, got \"", text, "\"");
  }
  return OkStatus();
}

// "12.3 MB/s" style progress on a terminal: one line rewritten in place.
void PrintProgress(const data::EncodeProgress& p, bool tty) {
  if (!tty) return;
  const double mb = p.bytes / 1e6, rate = p.seconds > 0 ? mb / p.seconds : 0;
  const double left = rate > 0 ? (p.total_bytes - p.bytes) / 1e6 / rate : 0;
  std::printf("\rprep: encoded %.1f of %.1f MB, %llu documents, %.1f MB/s, ETA %.0f s   ", mb,
              p.total_bytes / 1e6, static_cast<unsigned long long>(p.documents), rate, left);
  std::fflush(stdout);
}

// The flags whose text is parsed after FlagSet (numbers FlagSet has no type for, and the
// format), with their defaults.
struct PrepFlagText {
  std::string val_fraction = "0.05", seed = "0", sample_bytes = "16777216", format = "auto";
  int max_docs = 0;
  int shard_tokens = 0;
};

// Declares every flag of `switchyard prep`, writing into options and text.
void AddPrepFlags(FlagSet& flags, data::PrepOptions& options, PrepFlagText& text) {
  flags.AddPath("out", &options.out_dir, "output folder", /*required=*/true);
  flags.AddInt("vocab", &options.vocab_size, "vocabulary size (default 2000)");
  flags.AddString("val-fraction", &text.val_fraction,
                  "expected share of documents in validation (default 0.05)");
  flags.AddString("seed", &text.seed,
                  "seed of the split, the sampling and the tokenizer (default 0)");
  flags.AddInt("max-docs-per-label", &text.max_docs,
               "keep at most N documents per label, a seeded sample (default 0: all)");
  flags.AddString("label", &options.label, "label of every FILE (default: each file's stem)");
  flags.AddInt("shard-tokens", &text.shard_tokens, "tokens per shard at most (default 16777216)");
  flags.AddString(
      "fortunes", &options.fortune_root,
      "the fortune folder read when no FILE is given (default /usr/share/games/fortunes)");
  flags.AddBool("force", &options.force, "replace a previous prep output in --out");
  flags.AddString("format", &text.format,
                  "auto, text or jsonl (default auto: *.jsonl, *.ndjson, *.json are JSONL)");
  flags.AddString("json-key", &options.read.json_key,
                  "JSONL: the key holding a document's text (default text)");
  flags.AddString("label-key", &options.read.label_key,
                  "JSONL: the key holding a document's label (default: the file's label)");
  flags.AddBool("strict", &options.read.strict, "a bad JSONL line is an error, not skipped");
  flags.AddPath("tokenizer", &options.tokenizer_path,
                "an existing SentencePiece model to use instead of training one (no --vocab)");
  flags.AddString("tokenizer-sample-bytes", &text.sample_bytes,
                  "text the tokenizer is trained on, a seeded sample (default 16777216)");
  flags.AddInt("threads", &options.threads, "encoding threads (default 0: every core)");
}

// The parsed flag text into options, then options.Validate(); the first error.
Status ApplyFlagText(const PrepFlagText& text, data::PrepOptions* options) {
  Status status = ParseDouble("val-fraction", text.val_fraction, &options->val_fraction);
  if (status.ok()) status = ParseUnsigned("seed", text.seed, &options->seed);
  if (status.ok()) {
    status = ParseUnsigned("tokenizer-sample-bytes", text.sample_bytes,
                           &options->tokenizer_sample_bytes);
  }
  if (status.ok()) {
    if (text.format == "auto") {
      options->read.format = data::InputFormat::kAuto;
    } else if (text.format == "text") {
      options->read.format = data::InputFormat::kText;
    } else if (text.format == "jsonl") {
      options->read.format = data::InputFormat::kJsonl;
    } else {
      status = InvalidArgument("--format must be auto, text or jsonl, got \"", text.format, "\"");
    }
  }
  options->max_docs_per_label = text.max_docs;
  options->shard_tokens = text.shard_tokens;
  if (status.ok()) status = options->Validate();
  return status;
}

// Runs prep with its progress on stdout (one line rewritten in place on a terminal), then
// the summary table; the exit code.
int PrepareAndReport(const data::PrepOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const bool tty = ::isatty(STDOUT_FILENO) == 1;
  bool progress_shown = false;
  data::PrepCallbacks callbacks;
  callbacks.progress = [&](const std::string& line) {
    std::printf("%sprep: %s\n", progress_shown ? "\n" : "", line.c_str());
    progress_shown = false;
    std::fflush(stdout);
  };
  callbacks.warning = [](const std::string& line) {
    std::fprintf(stderr, "%s: warning: %s\n", kCommand, line.c_str());
  };
  data::EncodeProgress last;
  callbacks.encoding = [&](const data::EncodeProgress& p) {
    PrintProgress(p, tty);
    progress_shown = tty;
    last = p;
  };
  StatusOr<data::Index> index = data::Prepare(options, callbacks);
  if (progress_shown) std::printf("\n");
  if (index.ok()) {
    std::printf("prep: encoded %llu documents (%.1f MB) in %.1f s, %.1f MB/s on %d threads\n",
                static_cast<unsigned long long>(last.documents), last.bytes / 1e6, last.seconds,
                last.seconds > 0 ? last.bytes / 1e6 / last.seconds : 0.0,
                options.threads > 0
                    ? options.threads
                    : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  }
  if (!index.ok()) {
    std::fprintf(stderr, "%s: error: %s\n", kCommand,
                 PrintableText(std::string(index.status().message())).c_str());
    return kExitFailure;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("\n%s", data::SummaryTable(*index).c_str());
  std::printf("wrote %s in %.1f s\n", options.out_dir.c_str(), seconds);
  return kExitOk;
}

// What FlagSet cannot see: a flag given with nothing to do, and the same file twice (each
// of its documents would be read twice, into both splits). Usage errors.
Status CheckFlagUse(const FlagSet& flags, const data::PrepOptions& options) {
  if (flags.IsSet("label") && options.label.empty()) {
    return InvalidArgument("--label is empty; give a label (non-empty, no whitespace) or leave "
                           "it out for each file's stem");
  }
  if (flags.IsSet("label") && flags.IsSet("label-key")) {
    return InvalidArgument("--label ", options.label, " and --label-key ", options.read.label_key,
                           " are both given; --label-key reads each JSONL line's label, --label "
                           "names every file's: give one");
  }
  if (flags.IsSet("tokenizer") && flags.IsSet("vocab")) {
    return InvalidArgument("--vocab ", options.vocab_size, " and --tokenizer ",
                           options.tokenizer_path, " are both given; the vocabulary is the "
                           "tokenizer's: leave --vocab out");
  }
  if (options.files.empty()) return OkStatus();
  // Missing files and the like are the run's to report (exit 1).
  StatusOr<std::vector<data::CorpusFile>> files =
      data::UserCorpusFiles(options.files, options.label);
  return files.ok() ? data::CheckDistinctFiles(*files) : OkStatus();
}

// The command on this process; RunPrep runs it under RunInProcess (one rank).
int Run(const std::vector<std::string>& args) {
  if (dist::WorldSize() > 1) {  // several ranks would all write --out
    auto world = dist::WorldCommunicator();
    return Agree(*world,
                 InvalidArgument("runs on one rank (launch it without mpirun; it uses every "
                                 "core by itself, see --threads)"),
                 kExitUsage, kCommand);
  }
  data::PrepOptions options;
  PrepFlagText text;
  text.shard_tokens = static_cast<int>(options.shard_tokens);
  FlagSet flags(kCommand,
                "Trains a SentencePiece BPE tokenizer on a sample of text or JSONL files (or "
                "uses --tokenizer)\nand writes token shards and index.json into --out. FILEs "
                "(files, folders, globs; plain,\ngzip or zstd) are split into documents at "
                "lines holding only \"%\" (fortune files) or else\nat blank lines; JSONL "
                "lines are documents. A file's label is its stem (de.txt.gz -> de)\nunless "
                "--label or --label-key is given. Without FILEs it reads Debian's fortune "
                "files in\nseveral languages from /usr/share/games/fortunes (bash "
                "scripts/setup.sh installs them).\nusage: switchyard prep --out DIR [flags] "
                "[FILE ...]. See docs/data.md.");
  AddPrepFlags(flags, options, text);

  std::vector<std::string> flag_args;
  SplitArgs(args, &flag_args, &options.files);
  if (Status status = flags.Parse(flag_args); !status.ok()) {
    return UsageError(kCommand, std::string(status.message()));
  }
  if (flags.help_requested()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return kExitOk;
  }
  Status usage = ApplyFlagText(text, &options);
  if (usage.ok()) usage = CheckFlagUse(flags, options);
  if (!usage.ok()) return UsageError(kCommand, std::string(usage.message()));
  return PrepareAndReport(options);
}

}  // namespace

int RunPrep(const std::vector<std::string>& args) { return RunInProcess(kCommand, Run, args); }

}  // namespace switchyard::cli
