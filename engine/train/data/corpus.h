// Reading text into labelled documents for `switchyard prep`.
//
// A file is split into documents at lines holding only "%" (the fortune format) or, when
// it has no such line, at blank lines. Each document keeps its lines ("\n" between them,
// none at the end); "\r" before a line end is dropped, invalid UTF-8 bytes become U+FFFD,
// and empty documents are skipped.
//
// The default corpus is Debian's fortune files (scripts/setup.sh installs them), labelled
// by language: files directly in the fortune folder are "en", except "brasil" ("pt", from
// fortunes-br); files in a subfolder take its name ("de", "es", "it", ...). Index files
// (*.dat, *.u8), symbolic links (the top-level links into it/) and the "off" folders
// (offensive fortunes) are skipped.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/core/status.h"

namespace switchyard::data {

// Where Debian installs the fortune files.
inline constexpr char kDefaultFortuneRoot[] = "/usr/share/games/fortunes";

// One document: its text, its label (a language for the fortune corpus) and its file.
struct Document {
  std::string text;
  std::string label;
  std::string source;  // the path it was read from
};

// A file to read and the label its documents get.
struct CorpusFile {
  std::string path;
  std::string label;
};

// Splits file contents into documents (see the header comment).
std::vector<std::string> SplitDocuments(std::string_view contents);

// `text` with every invalid UTF-8 sequence replaced by U+FFFD.
std::string SanitizeUtf8(std::string_view text);

// Reads one file and splits it; errors name the path.
StatusOr<std::vector<Document>> ReadDocuments(const CorpusFile& file);

// The fortune files under `root`, sorted by (label, path). Fails with one line naming
// `root` and `bash scripts/setup.sh` when the folder is missing or holds no fortune file.
StatusOr<std::vector<CorpusFile>> FortuneCorpusFiles(const std::string& root);

// User files: the label is `label` when not empty, else the file's stem ("de.txt" -> "de").
// Keeps the order given; errors name a path that is missing or not a regular file.
StatusOr<std::vector<CorpusFile>> UserCorpusFiles(const std::vector<std::string>& paths,
                                                  const std::string& label);

// Reads every file, in order. A label must be non-empty and hold no whitespace.
StatusOr<std::vector<Document>> ReadCorpus(const std::vector<CorpusFile>& files);

}  // namespace switchyard::data
