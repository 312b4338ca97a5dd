#include "engine/cli/common.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "engine/cli/args.h"
#include "engine/data/index.h"
#include "engine/data/tokenizer.h"
#include "engine/dist/process.h"

namespace switchyard::cli {

StatusOr<std::vector<std::string>> TakeOverrides(std::vector<std::string>& args) {
  std::vector<std::string> overrides, rest;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--set") {
      if (i + 1 == args.size() || args[i + 1].rfind("--", 0) == 0) {
        return InvalidArgument("--set needs a value (section.key=value)");
      }
      overrides.push_back(args[++i]);
    } else if (args[i].rfind("--set=", 0) == 0) {
      overrides.push_back(args[i].substr(6));
    } else {
      rest.push_back(args[i]);
    }
  }
  args = std::move(rest);
  return overrides;
}

Status CheckFreshOutput(const std::string& out) {
  std::error_code ec;
  if (!std::filesystem::exists(out, ec)) return OkStatus();
  if (!std::filesystem::is_directory(out, ec)) {
    return FailedPrecondition(out, ": exists and is a file, not a directory; choose a new output");
  }
  if (!std::filesystem::is_empty(out, ec)) {
    return FailedPrecondition(out, ": exists and is not an empty directory; choose a new output");
  }
  return OkStatus();
}

Status CheckOutputFile(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    return NotFound("--", flag, " ", path, ": is a directory; name the file to write");
  }
  const std::string dir = fs::absolute(path, ec).parent_path().string();
  struct stat st;
  int err = ::stat(dir.c_str(), &st) != 0 ? errno : !S_ISDIR(st.st_mode) ? ENOTDIR : 0;
  if (err == 0 && ::access(dir.c_str(), W_OK | X_OK) != 0) err = errno;
  if (err == 0) return OkStatus();
  return NotFound("--", flag, " ", path, ": cannot create it (", dir, ": ", std::strerror(err), ")");
}

namespace {

// Rank 0's `text` on every rank. Collective over world.
std::string BroadcastText(dist::Communicator& world, const std::string& text) {
  Tensor length = Tensor::FromVector<int64_t>({static_cast<int64_t>(text.size())}, {1});
  world.Broadcast(length, 0);
  const int64_t n = length.data<int64_t>()[0];
  Tensor bytes = Tensor::Zeros({std::max<int64_t>(n, 1)}, DType::kU8);
  if (world.rank() == 0) std::memcpy(bytes.raw_data(), text.data(), text.size());
  world.Broadcast(bytes, 0);
  return std::string(static_cast<const char*>(bytes.raw_data()), n);
}

// The words of a command line joined by NUL (no argument holds one), and back.
std::string JoinArgs(const std::vector<std::string>& words) {
  std::string joined;
  for (const std::string& w : words) joined += w + '\0';
  return joined;
}
std::vector<std::string> SplitArgs(const std::string& joined) {
  std::vector<std::string> words;
  size_t begin = 0;
  for (size_t end; (end = joined.find('\0', begin)) != std::string::npos; begin = end + 1) {
    words.push_back(joined.substr(begin, end - begin));
  }
  return words;
}

}  // namespace

Status CheckSameConfig(dist::Communicator& world, const config::Config& config) {
  if (world.size() == 1) return OkStatus();
  const std::string mine = config.ToYaml();
  const std::string first = BroadcastText(world, mine);
  if (first == mine) return OkStatus();
  std::string which;
  if (auto theirs = config::ParseConfig(first, "rank 0's config"); theirs.ok()) {
    const auto every = [](const std::string&, const std::string&) { return true; };
    if (auto d = config::FirstDifference(config, *theirs, every)) {
      which = StrCat(": ", d->key, " is ", d->a, " here, ", d->b, " on rank 0");
    }
  }
  return InvalidArgument("rank ", world.rank(), "'s config differs from rank 0's", which,
                         " (every rank must load the same config file and --set overrides)");
}

Status CheckSameArgs(dist::Communicator& world, const std::string& command,
                     const std::vector<std::string>& args) {
  if (world.size() == 1) return OkStatus();
  std::vector<std::string> mine = {command};
  mine.insert(mine.end(), args.begin(), args.end());
  const std::vector<std::string> first = SplitArgs(BroadcastText(world, JoinArgs(mine)));
  if (first == mine) return OkStatus();
  const std::string why = StrCat("rank ", world.rank(), "'s command line differs from rank 0's: ");
  const char* const kSame = " (every rank must be launched with the same command and flags)";
  if (first.empty() || first[0] != command) {
    return InvalidArgument(why, "this rank runs ", command, ", rank 0 ",
                           first.empty() ? "nothing" : first[0], kSame);
  }
  size_t i = 1;
  while (i < mine.size() && i < first.size() && mine[i] == first[i]) ++i;
  const auto quoted = [](const std::vector<std::string>& words, size_t i) {
    return i < words.size() ? StrCat("'", words[i], "'") : std::string("absent");
  };
  return InvalidArgument(why, "argument ", i, " is ", quoted(mine, i), " here, ",
                         quoted(first, i), " on rank 0", kSame);
}

int RunInProcess(const std::string& command, int (*run)(const std::vector<std::string>&),
                 const std::vector<std::string>& args) {
  if (Status s = dist::InitProcess(nullptr, nullptr, dist::MpiStart::kIfLaunched); !s.ok()) {
    PrintError(command, std::string(s.message()));
    // A bad SWITCHYARD_MPI value is bad configuration (2); MPI failing to start is 1.
    return s.code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitFailure;
  }
  int rc = kExitOk;
  if (dist::WorldSize() > 1) {  // every rank launched alike, before any work
    auto world = dist::WorldCommunicator();
    rc = Agree(*world, CheckSameArgs(*world, command, args), kExitUsage, command);
  }
  if (rc == kExitOk) rc = run(args);
  dist::FinalizeProcess();
  return rc;
}

void PrintError(const std::string& command, const std::string& message) {
  // A message may echo a file's bytes (a YAML value, a tensor name): no raw control byte
  // reaches the terminal.
  std::fprintf(stderr, "%s: error: %s\n", command.c_str(), PrintableText(message).c_str());
  std::fflush(stderr);
}

int Agree(dist::Communicator& world, const Status& status, int code, const std::string& command) {
  // The lowest failing rank and its code in one number (codes are below 256).
  const int64_t none = int64_t{world.size()} * 256;
  const int64_t mine = status.ok() ? none : int64_t{world.rank()} * 256 + code;
  Tensor t = Tensor::FromVector<int64_t>({mine}, {1});
  world.AllReduce(t, dist::ReduceOp::kMin);
  const int64_t first = t.data<int64_t>()[0];
  if (first == none) return kExitOk;
  if (first / 256 == world.rank()) PrintError(command, std::string(status.message()));
  return static_cast<int>(first % 256);
}

Status CheckSameTokenizer(const std::string& trained, const std::string& data) {
  const std::string theirs = trained + "/" + data::kTokenizerFile;
  const std::string mine = data + "/" + data::kTokenizerFile;
  std::error_code ec;
  if (trained.empty() || !std::filesystem::is_regular_file(theirs, ec) ||
      !std::filesystem::is_regular_file(mine, ec)) {
    return OkStatus();
  }
  StatusOr<std::string> a = data::ReadTokenizerModel(theirs), b = data::ReadTokenizerModel(mine);
  if (!a.ok() || !b.ok() || *a == *b) return OkStatus();
  return FailedPrecondition("--data ", data, ": its tokenizer ", mine, " is not the one the "
                            "checkpoint's data was cut with, ", theirs, " (other token ids: the "
                            "results would mean nothing); prep the text with --tokenizer ", theirs);
}

StatusOr<data::Tokenizer> LoadDataTokenizer(const std::string& dir, int64_t model_vocab) {
  const std::string path = dir + "/" + data::kTokenizerFile;
  SY_ASSIGN_OR_RETURN(data::Tokenizer tok, data::Tokenizer::Load(path));
  if (tok.vocab_size() > model_vocab) {
    return FailedPrecondition(path, ": ", tok.vocab_size(), " pieces, more than the model's "
                              "model.vocab_size=", model_vocab, " (a tokenizer of other data: its "
                              "larger ids have no embedding)");
  }
  return tok;
}

}  // namespace switchyard::cli
