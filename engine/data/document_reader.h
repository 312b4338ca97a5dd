// One input file as a stream of labelled documents, for `switchyard prep`.
//
// Text files are split into documents at lines holding only "%" (the fortune format) or,
// when the file has no such line, at blank lines. A document keeps its lines ("\n" between
// them, leading and trailing blank lines dropped); "\r" before a line end is dropped,
// invalid UTF-8 bytes become U+FFFD, and empty documents are skipped.
//
// JSONL files hold one JSON object per line; the document is the string under `json_key`
// (Megatron-LM's convention: "text"), taken as it is (an empty one is skipped), other
// fields are ignored; blank lines are skipped. With `label_key`, the document's label is
// that field's value instead of the file's label. A line that is not a JSON object, lacks
// a key or holds a value of the wrong type is a bad line: counted and reported with the
// file and line number ("de.jsonl:17: not valid JSON"), or, with `strict`, an error.
//
// Either kind may be gzip- or zstd-compressed (input_file.h). Memory: the current line and
// the current document.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/status.h"
#include "engine/data/corpus.h"
#include "engine/data/input_file.h"

namespace switchyard::data {

// How the lines of a file are read.
enum class InputFormat { kAuto, kText, kJsonl };

// How documents are read from every file.
struct ReadOptions {
  InputFormat format = InputFormat::kAuto;  // auto: JSONL for *.jsonl, *.ndjson, *.json
                                            // (before a .gz/.zst suffix), else text
  std::string json_key = "text";            // JSONL: the document's text
  std::string label_key;                    // JSONL: the label's field; "": the file's label
  bool strict = false;                      // a bad JSONL line is an error
};

// The format `format` means for `path` (kAuto resolved from the name).
InputFormat ResolveFormat(InputFormat format, const std::string& path);

// Splits file contents into documents (text files; see the header comment).
std::vector<std::string> SplitDocuments(std::string_view contents);

// Splits a text into documents line by line (the rule of the header comment).
class TextSplitter {
 public:
  // `fortune`: documents end at "%" lines, else at blank lines.
  explicit TextSplitter(bool fortune) : fortune_(fortune) {}
  // Adds one line (without "\n"; a "\r" at its end is dropped); returns true when it
  // completed a non-empty document, which *out then holds.
  bool Add(std::string_view line, std::string* out);
  // Completes the current document (at the end of the file); true when it is not empty.
  bool Finish(std::string* out);

 private:
  bool fortune_;
  std::string current_;  // the document being assembled
  std::string pending_;  // blank lines after current_'s last line ("\n" + line each)
};

class DocumentReader {
 public:
  // How many bad lines of one file are reported one by one (the rest are only counted).
  static constexpr int kReportedBadLines = 5;

  // Opens `file`. A text file is read once here to find whether it has "%" lines.
  static StatusOr<std::unique_ptr<DocumentReader>> Open(const CorpusFile& file,
                                                        const ReadOptions& options);

  // Reads the next document into *doc; false at the end of the file.
  StatusOr<bool> Next(Document* doc);

  // Bad JSONL lines so far, and the messages of the first kReportedBadLines
  // ("path:line: reason").
  uint64_t bad_lines() const { return bad_lines_; }
  const std::vector<std::string>& bad_line_messages() const { return bad_messages_; }
  // Uncompressed bytes read so far.
  uint64_t bytes_read() const { return input_->bytes_read(); }

 private:
  DocumentReader() = default;
  // Parses one JSONL line into *doc; false for a blank or empty-text line. A bad line is
  // counted (or, strict, returned as the error).
  StatusOr<bool> ParseJsonLine(const std::string& line, Document* doc);

  CorpusFile file_;
  ReadOptions options_;
  InputFormat format_ = InputFormat::kText;
  std::unique_ptr<InputFile> input_;
  TextSplitter splitter_{false};
  std::string line_;
  bool done_ = false;
  uint64_t bad_lines_ = 0;
  std::vector<std::string> bad_messages_;
};

}  // namespace switchyard::data
