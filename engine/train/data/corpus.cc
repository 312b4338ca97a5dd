// Text files and fortune files into labelled documents; see corpus.h.
#include "engine/train/data/corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <tuple>

namespace switchyard::data {
namespace {

namespace fs = std::filesystem;

// The lines of `contents` without their "\n" (and a "\r" before it).
std::vector<std::string_view> Lines(std::string_view contents) {
  std::vector<std::string_view> lines;
  size_t begin = 0;
  while (begin < contents.size()) {
    size_t end = contents.find('\n', begin);
    if (end == std::string_view::npos) end = contents.size();
    std::string_view line = contents.substr(begin, end - begin);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    begin = end + 1;
  }
  return lines;
}

bool IsBlank(std::string_view line) {
  return line.find_first_not_of(" \t\f\v") == std::string_view::npos;
}

// Joins lines [begin, end) without leading or trailing blank lines; "" if all are blank.
std::string JoinTrimmed(const std::vector<std::string_view>& lines, size_t begin, size_t end) {
  while (begin < end && IsBlank(lines[begin])) ++begin;
  while (end > begin && IsBlank(lines[end - 1])) --end;
  std::string text;
  for (size_t i = begin; i < end; ++i) {
    if (i > begin) text += '\n';
    text.append(lines[i]);
  }
  return text;
}

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

std::vector<std::string> SplitDocuments(std::string_view contents) {
  const std::vector<std::string_view> lines = Lines(contents);
  const bool fortune =
      std::any_of(lines.begin(), lines.end(), [](std::string_view line) { return line == "%"; });
  std::vector<std::string> documents;
  size_t begin = 0;
  for (size_t i = 0; i <= lines.size(); ++i) {
    const bool boundary = i == lines.size() || (fortune ? lines[i] == "%" : IsBlank(lines[i]));
    if (!boundary) continue;
    std::string text = JoinTrimmed(lines, begin, i);
    if (!text.empty()) documents.push_back(std::move(text));
    begin = i + 1;
  }
  return documents;
}

StatusOr<std::vector<Document>> ReadDocuments(const CorpusFile& file) {
  std::ifstream in(file.path, std::ios::binary);
  if (!in) return NotFound(file.path, ": cannot open for reading");
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return DataLoss(file.path, ": read failed");
  std::vector<Document> documents;
  for (std::string& text : SplitDocuments(SanitizeUtf8(contents.str()))) {
    documents.push_back(Document{std::move(text), file.label, file.path});
  }
  return documents;
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

StatusOr<std::vector<CorpusFile>> UserCorpusFiles(const std::vector<std::string>& paths,
                                                  const std::string& label) {
  std::vector<CorpusFile> files;
  for (const std::string& path : paths) {
    std::error_code ec;
    if (!fs::exists(path, ec)) return NotFound(path, ": no such file");
    if (!fs::is_regular_file(path, ec)) return InvalidArgument(path, ": not a regular file");
    files.push_back({path, label.empty() ? fs::path(path).stem().string() : label});
  }
  return files;
}

StatusOr<std::vector<Document>> ReadCorpus(const std::vector<CorpusFile>& files) {
  std::vector<Document> documents;
  for (const CorpusFile& file : files) {
    const bool bad_label =
        file.label.empty() || file.label.find_first_of(" \t\r\n\f\v") != std::string::npos;
    if (bad_label) {
      return InvalidArgument(file.path, ": bad label \"", file.label,
                             "\" (labels are non-empty and hold no whitespace)");
    }
    SY_ASSIGN_OR_RETURN(std::vector<Document> docs, ReadDocuments(file));
    for (Document& doc : docs) documents.push_back(std::move(doc));
  }
  return documents;
}

}  // namespace switchyard::data
