#include "engine/cli/project_script.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

extern char** environ;

namespace switchyard::cli {

StatusOr<std::string> ProjectScript(const std::string& name) {
  const char* dir = std::getenv("SWITCHYARD_SCRIPTS_DIR");
  const std::string path = std::string(dir != nullptr ? dir : SWITCHYARD_SOURCE_DIR "/scripts") + "/" + name;
  if (!std::filesystem::is_regular_file(path)) {
    return NotFound(path, ": the project's script is missing (set SWITCHYARD_SCRIPTS_DIR to the "
                          "scripts/ folder of a Switchyard checkout)");
  }
  return path;
}

StatusOr<int> RunPython(const std::string& script, const std::vector<std::string>& args) {
  const char* py = std::getenv("SWITCHYARD_PYTHON");
  const std::string python = py != nullptr ? py : "/usr/bin/python3";
  std::vector<std::string> argv_s = {python, script};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, python.c_str(), nullptr, nullptr, argv.data(), environ);
  if (rc != 0) return FailedPrecondition(python, ": cannot start (", std::strerror(rc), ")");
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return FailedPrecondition(python, ": waitpid failed (", std::strerror(errno), ")");
  }
  if (WIFSIGNALED(status)) return FailedPrecondition(script, " died by signal ", WTERMSIG(status));
  return WEXITSTATUS(status);
}

}  // namespace switchyard::cli
