// Which files prep reads, and their labels; see corpus.h.
#include "engine/data/corpus.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <system_error>
#include <tuple>

namespace switchyard::data {
namespace {

namespace fs = std::filesystem;

// Length of the valid UTF-8 sequence at s[i], or 0 if it is not one (RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF).
size_t Utf8SequenceLength(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return n;
}

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix.data(), suffix.size()) == 0;
}

// A fortune data file: a regular file (not a link) that is not an index.
bool IsFortuneFile(const fs::directory_entry& entry) {
  std::error_code ec;
  if (entry.is_symlink(ec) || !entry.is_regular_file(ec)) return false;
  const std::string name = entry.path().filename().string();
  return !EndsWith(name, ".dat") && !EndsWith(name, ".u8") && name[0] != '.';
}

}  // namespace

std::string SanitizeUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const size_t n = Utf8SequenceLength(text, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

StatusOr<std::vector<CorpusFile>> FortuneCorpusFiles(const std::string& root) {
  const std::string hint = StrCat("fortune files not found in ", root,
                                  "; install them with `bash scripts/setup.sh` (Debian "
                                  "packages fortunes, fortunes-de, -es, -it, -br) or pass "
                                  "text files to prep");
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return NotFound(hint);
  std::vector<CorpusFile> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (IsFortuneFile(entry)) {
      files.push_back({entry.path().string(), name == "brasil" ? "pt" : "en"});
      continue;
    }
    std::error_code dir_ec;
    if (entry.is_symlink(dir_ec) || !entry.is_directory(dir_ec) || name == "off") continue;
    for (const fs::directory_entry& inner : fs::directory_iterator(entry.path(), dir_ec)) {
      if (IsFortuneFile(inner)) files.push_back({inner.path().string(), name});
    }
    if (dir_ec) return FailedPrecondition(entry.path().string(), ": ", dir_ec.message());
  }
  if (ec) return FailedPrecondition(root, ": ", ec.message());
  if (files.empty()) return NotFound(hint);
  std::sort(files.begin(), files.end(), [](const CorpusFile& a, const CorpusFile& b) {
    return std::tie(a.label, a.path) < std::tie(b.label, b.path);
  });
  return files;
}

bool IsValidLabel(const std::string& label) {
  return !label.empty() && label.find_first_of(" \t\r\n\f\v") == std::string::npos;
}

std::string FileStem(const std::string& path) {
  std::string name = fs::path(path).filename().string();
  for (const char* suffix : {".gz", ".zst", ".zstd"}) {
    if (EndsWith(name, suffix)) name.resize(name.size() - std::strlen(suffix));
  }
  const size_t dot = name.rfind('.');
  return dot == std::string::npos || dot == 0 ? name : name.substr(0, dot);
}

Status CheckDistinctFiles(const std::vector<CorpusFile>& files) {
  // By device and inode: two paths of one file (a symbolic or a hard link, ./x and x) are one.
  std::map<std::pair<dev_t, ino_t>, const std::string*> seen;  // the file -> its first mention
  for (const CorpusFile& file : files) {
    struct stat st;
    if (::stat(file.path.c_str(), &st) != 0) continue;  // reading it will say what is wrong
    const auto [it, fresh] = seen.emplace(std::make_pair(st.st_dev, st.st_ino), &file.path);
    if (!fresh) {
      return InvalidArgument(file.path, " is given twice (also as ", *it->second,
                             "); each of its documents would be read twice, into both splits; "
                             "give each file once");
    }
  }
  return OkStatus();
}

StatusOr<std::vector<CorpusFile>> UserCorpusFiles(const std::vector<std::string>& paths,
                                                  const std::string& label) {
  if (!label.empty() && !IsValidLabel(label)) {
    return InvalidArgument("--label \"", label, "\" is not a label (non-empty, no whitespace)");
  }
  std::vector<CorpusFile> files;
  const auto add = [&](const std::string& path) -> Status {
    CorpusFile file{path, label.empty() ? FileStem(path) : label};
    if (!IsValidLabel(file.label)) {
      return InvalidArgument(path, ": bad label \"", file.label,
                             "\" (labels are non-empty and hold no whitespace); pass --label");
    }
    files.push_back(std::move(file));
    return OkStatus();
  };
  for (const std::string& path : paths) {
    std::error_code ec;
    if (!fs::exists(path, ec) && path.find_first_of("*?[") != std::string::npos) {
      // A glob the shell did not expand (quoted): matches sorted by glob(3).
      glob_t matches{};
      const int rc = ::glob(path.c_str(), GLOB_ERR, nullptr, &matches);
      std::vector<std::string> found(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
      ::globfree(&matches);
      if (rc != 0 || found.empty()) return NotFound(path, ": the pattern matches no file");
      for (const std::string& match : found) {
        if (fs::is_regular_file(match, ec)) SY_RETURN_IF_ERROR(add(match));
      }
      continue;
    }
    if (!fs::exists(path, ec)) return NotFound(path, ": no such file");
    if (fs::is_directory(path, ec)) {
      // Every regular file below the folder, sorted by path; hidden names are skipped.
      std::vector<std::string> found;
      for (auto it = fs::recursive_directory_iterator(path, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (!name.empty() && name[0] == '.') {
          if (it->is_directory(ec)) it.disable_recursion_pending();
          continue;
        }
        if (it->is_regular_file(ec)) found.push_back(it->path().string());
      }
      if (ec) return FailedPrecondition(path, ": cannot list the folder (", ec.message(), ")");
      if (found.empty()) return NotFound(path, ": the folder holds no file");
      std::sort(found.begin(), found.end());
      for (const std::string& file : found) SY_RETURN_IF_ERROR(add(file));
      continue;
    }
    if (!fs::is_regular_file(path, ec)) return InvalidArgument(path, ": not a regular file");
    SY_RETURN_IF_ERROR(add(path));
  }
  return files;
}

}  // namespace switchyard::data
