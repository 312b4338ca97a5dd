#include "engine/core/file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace switchyard {

StatusOr<std::string> ReadFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return InvalidArgument(path, ": is a directory, not a file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path, ": cannot open (", std::strerror(errno), ")");
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return DataLoss(path, ": read failed");
  return s.str();
}

}  // namespace switchyard
