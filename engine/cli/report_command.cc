// `switchyard report RUN [RUN ...] --out FILE.html [--route FILE.json] [--title S]`: one
// self-contained HTML page of the runs' training and routing over the steps (loss and
// validation curves, per MoE layer heatmaps of each expert's token share before and after
// dropping, dropped fraction, router entropy, aux, z, maximal violation, cv, expert-bias
// trajectories, routing by language, throughput), several runs overlaid; see
// docs/report.md. The plots are drawn by scripts/report.py (matplotlib); this command
// checks the arguments and runs it. Exit status: 0 ok, 1 a run or the output cannot be
// read or written, 2 bad flags.
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/cli/args.h"
#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "engine/cli/project_script.h"

namespace switchyard::cli {
namespace {

constexpr char kCommand[] = "switchyard report";

// The files the report reads: each run's directory and its metrics.jsonl, routing.jsonl,
// routing_by_language.json and eval.json, and the --route file. --out must be none of them
// (writing the HTML over a run's metrics would destroy them).
Status CheckOutIsNoInput(const std::string& out, const std::vector<std::string>& runs,
                         const std::string& route) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path target = fs::weakly_canonical(out, ec);
  auto same = [&](const fs::path& input) {
    std::error_code e;
    return !ec && fs::weakly_canonical(input, e) == target && !e;
  };
  if (!route.empty() && same(route)) {
    return InvalidArgument("--out ", out, " is the --route file; write the report elsewhere");
  }
  for (const std::string& run : runs) {
    for (const char* name :
         {"", "metrics.jsonl", "routing.jsonl", "routing_by_language.json", "eval.json"}) {
      const fs::path input = *name ? fs::path(run) / name : fs::path(run);
      if (same(input)) {
        return InvalidArgument("--out ", out, " is ", *name ? "an input of the report (" : "",
                               input.string(), *name ? ")" : ", a run directory",
                               "; write the report elsewhere, e.g. report.html");
      }
    }
  }
  // Anything inside a run directory (its `latest`, a checkpoint's files) belongs to the run.
  for (const std::string& run : runs) {
    std::error_code e;
    const fs::path dir = fs::weakly_canonical(run, e);
    if (ec || e) continue;
    const auto [d, t] = std::mismatch(dir.begin(), dir.end(), target.begin(), target.end());
    if (d == dir.end()) {
      return InvalidArgument("--out ", out, " is inside the run directory ", run,
                             " (its checkpoints and logs); write the report elsewhere, e.g. "
                             "report.html");
    }
  }
  return OkStatus();
}

// The interpreter's name for messages: "SWITCHYARD_PYTHON=/bin/false" or "/usr/bin/python3".
std::string Interpreter() {
  const char* py = std::getenv("SWITCHYARD_PYTHON");
  return py != nullptr ? StrCat("SWITCHYARD_PYTHON=", py) : std::string("/usr/bin/python3");
}

// The identity of `path` (inode and modification time), or nullopt when there is none.
std::optional<std::pair<ino_t, int64_t>> FileIdentity(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return std::pair(st.st_ino, int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec);
}

// Runs scripts/report.py with `py_args`, which writes `out`. The script prints its own
// error line; what it cannot say is said here: an interpreter that is not Python 3 (checked
// first), one that stops without a line, or one that ends well without writing `out`.
int RunReportScript(const std::string& out, const std::vector<std::string>& py_args) {
  StatusOr<std::string> script = ProjectScript("report.py");
  if (!script.ok()) {
    PrintError(kCommand, std::string(script.status().message()));
    return kExitFailure;
  }
  StatusOr<int> rc =
      RunPython("-c", {"import sys; sys.exit(0 if sys.version_info[0] == 3 else 1)"});
  if (rc.ok() && *rc != 0) {
    PrintError(kCommand, StrCat(Interpreter(), ": not a Python 3 interpreter (`-c 'import sys'` ",
                                "exited with status ", *rc, "); scripts/report.py needs one"));
    return kExitFailure;
  }
  const auto before = FileIdentity(out);
  if (rc.ok()) rc = RunPython(*script, py_args);
  if (!rc.ok()) {
    PrintError(kCommand, StrCat(Interpreter(), ": ", rc.status().message()));
    return kExitFailure;
  }
  if (*rc != 0) return kExitFailure;  // report.py said what failed
  const auto after = FileIdentity(out);
  if (!after.has_value() || after == before) {
    PrintError(kCommand, StrCat(Interpreter(), " ran ", *script, " with exit status 0 but --out ",
                                out, " was not written"));
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace

int RunReport(const std::vector<std::string>& args) {
  std::string out, route, title;
  FlagSet flags(kCommand,
                "Writes one self-contained HTML page (no network needed to open it) of the\n"
                "training runs given as RUN directories (`switchyard train --out`): losses,\n"
                "throughput and every MoE layer's routing over the steps, runs overlaid.\n"
                "In full: switchyard report RUN [RUN ...] --out FILE.html");
  flags.AddPath("out", &out, "the HTML file to write", /*required=*/true);
  flags.AddPath("route", &route, "a `switchyard route --json` output to include as a sample");
  flags.AddString("title", &title, "the page's title");
  // Positional arguments are runs; the rest goes to the flag parser.
  std::vector<std::string> runs, rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) == 0 || a == "-h") {
      rest.push_back(a);
      const bool takes_value = a == "--out" || a == "--route" || a == "--title";
      if (takes_value && i + 1 < args.size()) rest.push_back(args[++i]);
    } else {
      runs.push_back(a);
    }
  }
  if (Status s = flags.Parse(rest); !s.ok()) return UsageError(kCommand, std::string(s.message()));
  if (flags.help_requested()) {
    std::printf("%s", flags.Usage().c_str());
    return kExitOk;
  }
  if (runs.empty()) return UsageError(kCommand, "no RUN directory given (switchyard report RUN ... --out FILE.html)");
  namespace fs = std::filesystem;
  for (const std::string& run : runs) {
    if (!fs::is_regular_file(fs::path(run) / "metrics.jsonl")) {
      PrintError(kCommand, run + ": no metrics.jsonl (not a `switchyard train` output directory)");
      return kExitFailure;
    }
  }
  if (Status s = CheckOutIsNoInput(out, runs, route); !s.ok()) {
    return UsageError(kCommand, std::string(s.message()));
  }
  const fs::path parent = fs::absolute(out).parent_path();
  if (!fs::is_directory(parent)) {
    PrintError(kCommand, "--out " + out + ": the directory " + parent.string() + " does not exist");
    return kExitFailure;
  }
  if (!route.empty() && !fs::is_regular_file(route)) {
    const std::string why = fs::is_directory(route) ? "a directory, not the file of a `switchyard "
                                                      "route --json` output"
                            : fs::exists(route)    ? "not a regular file"
                                                   : "no such file";
    PrintError(kCommand, "--route " + route + ": " + why);
    return kExitFailure;
  }
  std::vector<std::string> py_args = {"--out", out};
  if (!route.empty()) py_args.insert(py_args.end(), {"--route", route});
  if (!title.empty()) py_args.insert(py_args.end(), {"--title", title});
  py_args.insert(py_args.end(), runs.begin(), runs.end());
  return RunReportScript(out, py_args);
}

}  // namespace switchyard::cli
