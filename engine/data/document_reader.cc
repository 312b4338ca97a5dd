// Text and JSONL files as documents; see document_reader.h.
#include "engine/data/document_reader.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace switchyard::data {
namespace {

bool IsBlank(std::string_view line) {
  return line.find_first_not_of(" \t\f\v") == std::string_view::npos;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool IsAscii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

}  // namespace

bool TextSplitter::Add(std::string_view line, std::string* out) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (fortune_ ? line == "%" : IsBlank(line)) return Finish(out);
  if (IsBlank(line)) {
    if (!current_.empty()) {
      pending_ += '\n';
      pending_.append(line);
    }
    return false;
  }
  if (!current_.empty()) {
    current_ += pending_;
    current_ += '\n';
  }
  pending_.clear();
  if (IsAscii(line)) {
    current_.append(line);
  } else {
    current_ += SanitizeUtf8(line);
  }
  return false;
}

bool TextSplitter::Finish(std::string* out) {
  pending_.clear();
  if (current_.empty()) return false;
  out->swap(current_);
  current_.clear();
  return true;
}

InputFormat ResolveFormat(InputFormat format, const std::string& path) {
  if (format != InputFormat::kAuto) return format;
  std::string_view name = path;
  for (std::string_view suffix : {".gz", ".zst", ".zstd"}) {
    if (EndsWith(name, suffix)) name.remove_suffix(suffix.size());
  }
  for (std::string_view suffix : {".jsonl", ".ndjson", ".json"}) {
    if (EndsWith(name, suffix)) return InputFormat::kJsonl;
  }
  return InputFormat::kText;
}

std::vector<std::string> SplitDocuments(std::string_view contents) {
  bool fortune = false;
  std::vector<std::string_view> lines;
  size_t begin = 0;
  while (begin < contents.size()) {
    size_t end = contents.find('\n', begin);
    if (end == std::string_view::npos) end = contents.size();
    std::string_view line = contents.substr(begin, end - begin);
    lines.push_back(line);
    if (line == "%" || line == "%\r") fortune = true;
    begin = end + 1;
  }
  TextSplitter splitter(fortune);
  std::vector<std::string> documents;
  std::string doc;
  for (std::string_view line : lines) {
    if (splitter.Add(line, &doc)) documents.push_back(std::move(doc));
  }
  if (splitter.Finish(&doc)) documents.push_back(std::move(doc));
  return documents;
}

StatusOr<std::unique_ptr<DocumentReader>> DocumentReader::Open(const CorpusFile& file,
                                                               const ReadOptions& options) {
  std::unique_ptr<DocumentReader> reader(new DocumentReader());
  reader->file_ = file;
  reader->options_ = options;
  reader->format_ = ResolveFormat(options.format, file.path);
  if (reader->format_ == InputFormat::kText) {
    // The fortune format is a property of the whole file: look for a "%" line first.
    SY_ASSIGN_OR_RETURN(std::unique_ptr<InputFile> scan, InputFile::Open(file.path));
    std::string line;
    while (true) {
      SY_ASSIGN_OR_RETURN(bool more, scan->ReadLine(&line));
      if (!more) break;
      if (line == "%" || line == "%\r") {
        reader->splitter_ = TextSplitter(/*fortune=*/true);
        break;
      }
    }
  }
  SY_ASSIGN_OR_RETURN(reader->input_, InputFile::Open(file.path));
  return reader;
}

StatusOr<bool> DocumentReader::ParseJsonLine(const std::string& line, Document* doc) {
  if (IsBlank(line)) return false;
  const auto bad = [&](const std::string& reason) -> StatusOr<bool> {
    const std::string message = StrCat(file_.path, ":", input_->line_number(), ": ", reason);
    if (options_.strict) {
      return InvalidArgument(message, " (without --strict, bad lines are skipped)");
    }
    ++bad_lines_;
    if (bad_messages_.size() < kReportedBadLines) bad_messages_.push_back(message);
    return false;
  };
  const nlohmann::json value = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return bad("not valid JSON");
  if (!value.is_object()) return bad("not a JSON object");
  auto text = value.find(options_.json_key);
  if (text == value.end()) return bad(StrCat("no \"", options_.json_key, "\" key"));
  if (!text->is_string()) return bad(StrCat("\"", options_.json_key, "\" is not a string"));
  std::string label = file_.label;
  if (!options_.label_key.empty()) {
    auto field = value.find(options_.label_key);
    if (field == value.end()) return bad(StrCat("no \"", options_.label_key, "\" key"));
    if (!field->is_string() || !IsValidLabel(field->get<std::string>())) {
      return bad(StrCat("\"", options_.label_key, "\" is ", field->dump(),
                        ", not a label (a non-empty string without whitespace)"));
    }
    label = field->get<std::string>();
  }
  doc->text = text->get<std::string>();
  if (doc->text.empty()) return false;
  doc->label = std::move(label);
  doc->source = file_.path;
  return true;
}

StatusOr<bool> DocumentReader::Next(Document* doc) {
  if (format_ == InputFormat::kJsonl) {
    while (true) {
      SY_ASSIGN_OR_RETURN(bool more, input_->ReadLine(&line_));
      if (!more) return false;
      SY_ASSIGN_OR_RETURN(bool got, ParseJsonLine(line_, doc));
      if (got) return true;
    }
  }
  while (!done_) {
    SY_ASSIGN_OR_RETURN(bool more, input_->ReadLine(&line_));
    bool got = false;
    if (more) {
      got = splitter_.Add(line_, &doc->text);
    } else {
      done_ = true;
      got = splitter_.Finish(&doc->text);
    }
    if (got) {
      doc->label = file_.label;
      doc->source = file_.path;
      return true;
    }
  }
  return false;
}

}  // namespace switchyard::data
