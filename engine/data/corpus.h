// Which files `switchyard prep` reads and their labels (document_reader.h reads them).
//
// The default corpus is Debian's fortune files (scripts/setup.sh installs them), labelled
// by language: files directly in the fortune folder are "en", except "brasil" ("pt", from
// fortunes-br); files in a subfolder take its name ("de", "es", "it", ...). Index files
// (*.dat, *.u8), symbolic links (the top-level links into it/) and the "off" folders
// (offensive fortunes) are skipped.
//
// User inputs are files, folders (every regular file below, sorted by path, hidden names
// skipped) and glob patterns the shell left alone ("corpus/*.jsonl.gz", sorted). A file's
// label is its stem without a compression suffix ("de.jsonl.gz" -> "de").
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

// `text` with every invalid UTF-8 sequence replaced by U+FFFD.
std::string SanitizeUtf8(std::string_view text);

// Whether `label` may label documents: non-empty, no whitespace.
bool IsValidLabel(const std::string& label);

// A file's default label: its name without a compression suffix (.gz, .zst, .zstd) and
// without its last extension ("corpus/de.jsonl.gz" -> "de").
std::string FileStem(const std::string& path);

// The fortune files under `root`, sorted by (label, path). Fails with one line naming
// `root` and `bash scripts/setup.sh` when the folder is missing or holds no fortune file.
StatusOr<std::vector<CorpusFile>> FortuneCorpusFiles(const std::string& root);

// User inputs (files, folders, globs; see above), in the order given. The label is `label`
// when not empty, else each file's stem. Errors name a path that is missing, a pattern
// that matches nothing, an empty folder, or a label that is not one.
StatusOr<std::vector<CorpusFile>> UserCorpusFiles(const std::vector<std::string>& paths,
                                                  const std::string& label);

// OK when no file appears twice in `files` (the same file by device and inode: given twice,
// through a symbolic or hard link, or in a folder also given); else InvalidArgument naming
// both mentions. A file read twice would put every document in the corpus twice, in both
// splits.
Status CheckDistinctFiles(const std::vector<CorpusFile>& files);

}  // namespace switchyard::data
