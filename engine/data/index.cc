// index.json writer and checked reader; see index.h.
#include "engine/data/index.h"

#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/core/json_check.h"

namespace switchyard::data {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// Reads fields of one JSON object; every error names the file and the field's path.
class Fields {
 public:
  Fields(const json& object, std::string path, std::string where)
      : object_(object), path_(std::move(path)), where_(std::move(where)) {}

  Status Error(const std::string& key, const std::string& what) const {
    return DataLoss(path_, ": ", where_, key, ": ", what);
  }
  StatusOr<const json*> Get(const std::string& key) const {
    auto it = object_.find(key);
    if (it == object_.end()) return Error(key, "missing");
    return &*it;
  }
  StatusOr<uint64_t> Unsigned(const std::string& key) const {
    SY_ASSIGN_OR_RETURN(const json* value, Get(key));
    if (!value->is_number_unsigned()) {
      return Error(key, "expected an unsigned integer, got " + value->dump());
    }
    return value->get<uint64_t>();
  }
  StatusOr<std::string> String(const std::string& key) const {
    SY_ASSIGN_OR_RETURN(const json* value, Get(key));
    if (!value->is_string()) return Error(key, "expected a string, got " + value->dump());
    return value->get<std::string>();
  }
  StatusOr<Split> SplitField(const std::string& key) const {
    SY_ASSIGN_OR_RETURN(std::string name, String(key));
    if (name == "train") return Split::kTrain;
    if (name == "val") return Split::kVal;
    return Error(key, "expected \"train\" or \"val\", got \"" + name + "\"");
  }

 private:
  const json& object_;
  std::string path_;
  std::string where_;  // "documents[3]." prefix
};

StatusOr<std::vector<json>> Array(const Fields& fields, const std::string& key) {
  SY_ASSIGN_OR_RETURN(const json* value, fields.Get(key));
  if (!value->is_array()) return fields.Error(key, "expected an array");
  return std::vector<json>(value->begin(), value->end());
}

// Takes the objects of the top-level "documents" array out of the JSON tree while it is
// parsed (nlohmann's parser callback), keeping a DocumentEntry each: an index of millions
// of documents never exists as a tree. Field types are checked here; what depends on the
// shards and labels is checked after the parse. The first bad document stops collection.
class DocumentCollector {
 public:
  explicit DocumentCollector(std::string path) : path_(std::move(path)) {}

  // The parser callback; returns false to drop a document from the tree.
  bool operator()(int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key) {
      top_key_ = parsed.is_string() ? parsed.get<std::string>() : std::string();
      return true;
    }
    if (depth != 2 || event != json::parse_event_t::object_end || top_key_ != "documents") {
      return true;
    }
    if (status_.ok()) status_ = Collect(parsed);
    return false;
  }

  // The documents (label: an index into labels()), and the first type error, which
  // concerns document docs().size().
  std::vector<DocumentEntry>& docs() { return docs_; }
  const std::vector<std::string>& labels() const { return labels_; }
  const Status& status() const { return status_; }

 private:
  Status Collect(const json& object) {
    const Fields fields(object, path_, StrCat("documents[", docs_.size(), "]."));
    DocumentEntry doc;
    SY_ASSIGN_OR_RETURN(doc.split, fields.SplitField("split"));
    SY_ASSIGN_OR_RETURN(uint64_t shard, fields.Unsigned("shard"));
    doc.shard = shard > static_cast<uint64_t>(INT32_MAX) ? INT32_MAX : static_cast<int>(shard);
    SY_ASSIGN_OR_RETURN(doc.offset, fields.Unsigned("offset"));
    SY_ASSIGN_OR_RETURN(doc.tokens, fields.Unsigned("tokens"));
    SY_ASSIGN_OR_RETURN(std::string label, fields.String("label"));
    auto [it, added] = label_ids_.emplace(label, static_cast<int>(labels_.size()));
    if (added) labels_.push_back(label);
    doc.label = it->second;
    SY_ASSIGN_OR_RETURN(doc.source, fields.String("source"));
    docs_.push_back(std::move(doc));
    return OkStatus();
  }

  std::string path_;
  std::string top_key_;
  std::vector<DocumentEntry> docs_;
  std::vector<std::string> labels_;
  std::map<std::string, int> label_ids_;
  Status status_;
};

// ParseIndex on any input nlohmann reads (a string or a stream).
template <typename Input>
StatusOr<Index> ParseIndexFrom(Input&& input, const std::string& path,
                               const std::function<std::string()>& why_not_json);

}  // namespace

const char* SplitName(Split split) { return split == Split::kTrain ? "train" : "val"; }

void ComputeTotals(Index* index) {
  index->totals.assign(index->labels.size(), LabelTotals{});
  for (const DocumentEntry& doc : index->documents) {
    LabelTotals& totals = index->totals[doc.label];
    totals.documents[static_cast<int>(doc.split)] += 1;
    totals.tokens[static_cast<int>(doc.split)] += doc.tokens;
  }
}

std::string IndexHeadJson(const Index& index) {
  ordered_json head;
  head["format"] = kIndexFormat;
  head["version"] = kIndexVersion;
  head["vocab_size"] = index.vocab_size;
  head["eos_id"] = index.eos_id;
  head["dtype"] = index.token_bytes == 2 ? "u16" : "u32";
  head["tokenizer"] = index.tokenizer;
  head["seed"] = index.seed;
  head["val_fraction"] = index.val_fraction;
  head["labels"] = index.labels;
  std::string out = "{\n";
  for (const auto& [key, value] : head.items()) {
    out += "  " + json(key).dump() + ": " + value.dump() + ",\n";
  }
  out += "  \"totals\": {\n";
  for (size_t l = 0; l < index.labels.size(); ++l) {
    ordered_json per_split;
    for (Split split : {Split::kTrain, Split::kVal}) {
      const int s = static_cast<int>(split);
      per_split[SplitName(split)] = {{"documents", index.totals[l].documents[s]},
                                     {"tokens", index.totals[l].tokens[s]}};
    }
    out += "    " + json(index.labels[l]).dump() + ": " + per_split.dump() +
           (l + 1 < index.labels.size() ? ",\n" : "\n");
  }
  out += "  },\n";
  out += "  \"shards\": [\n";
  for (size_t i = 0; i < index.shards.size(); ++i) {
    const ShardEntry& shard = index.shards[i];
    ordered_json entry = {
        {"name", shard.name}, {"split", SplitName(shard.split)}, {"tokens", shard.tokens}};
    out += "    " + entry.dump() + (i + 1 < index.shards.size() ? ",\n" : "\n");
  }
  out += "  ],\n  \"documents\": [\n";
  return out;
}

std::string DocumentJson(const Index& index, const DocumentEntry& doc, bool last) {
  ordered_json entry = {{"split", SplitName(doc.split)},
                        {"shard", doc.shard},
                        {"offset", doc.offset},
                        {"tokens", doc.tokens},
                        {"label", index.labels[doc.label]},
                        {"source", doc.source}};
  return "    " + entry.dump() + (last ? "\n" : ",\n");
}

const char* IndexTailJson() { return "  ]\n}\n"; }

std::string IndexToJson(const Index& index) {
  std::string out = IndexHeadJson(index);
  for (size_t i = 0; i < index.documents.size(); ++i) {
    out += DocumentJson(index, index.documents[i], i + 1 == index.documents.size());
  }
  return out + IndexTailJson();
}

StatusOr<Index> ParseIndex(const std::string& text, const std::string& path) {
  return ParseIndexFrom(text, path, [&text] { return JsonSyntaxError(text); });
}

namespace {

// The head of the index: format, version, vocab_size, eos_id, dtype, tokenizer, seed and
// val_fraction.
Status ParseHead(const Fields& top, Index* index) {
  SY_ASSIGN_OR_RETURN(std::string format, top.String("format"));
  if (format != kIndexFormat) {
    return top.Error("format", StrCat("expected \"", kIndexFormat, "\", got \"", format, "\""));
  }
  SY_ASSIGN_OR_RETURN(uint64_t version, top.Unsigned("version"));
  if (version != kIndexVersion) {
    return top.Error("version", StrCat(version, " (this build reads ", kIndexVersion, ")"));
  }
  SY_ASSIGN_OR_RETURN(uint64_t vocab, top.Unsigned("vocab_size"));
  SY_ASSIGN_OR_RETURN(uint64_t eos, top.Unsigned("eos_id"));
  if (vocab == 0 || vocab > static_cast<uint64_t>(INT32_MAX)) {
    return top.Error("vocab_size", StrCat("out of range: ", vocab));
  }
  if (eos >= vocab) return top.Error("eos_id", StrCat(eos, " is not below vocab_size ", vocab));
  index->vocab_size = static_cast<int>(vocab);
  index->eos_id = static_cast<int>(eos);
  SY_ASSIGN_OR_RETURN(std::string dtype, top.String("dtype"));
  if (dtype != "u16" && dtype != "u32") {
    return top.Error("dtype", "expected \"u16\" or \"u32\", got \"" + dtype + "\"");
  }
  index->token_bytes = dtype == "u16" ? 2 : 4;
  if (index->token_bytes == 2 && vocab > 65536) {
    return top.Error("dtype", "u16 cannot hold vocab_size " + std::to_string(vocab));
  }
  SY_ASSIGN_OR_RETURN(index->tokenizer, top.String("tokenizer"));
  SY_ASSIGN_OR_RETURN(index->seed, top.Unsigned("seed"));
  SY_ASSIGN_OR_RETURN(const json* fraction, top.Get("val_fraction"));
  if (!fraction->is_number()) return top.Error("val_fraction", "expected a number");
  index->val_fraction = fraction->get<double>();
  return OkStatus();
}

// The "labels" array into index->labels, and each label's id into *label_ids.
Status ParseLabels(const Fields& top, Index* index, std::map<std::string, int>* label_ids) {
  SY_ASSIGN_OR_RETURN(std::vector<json> labels, Array(top, "labels"));
  for (const json& label : labels) {
    if (!label.is_string() || label.get<std::string>().empty()) {
      return top.Error("labels", "expected non-empty strings");
    }
    const int id = static_cast<int>(index->labels.size());
    if (!label_ids->emplace(label.get<std::string>(), id).second) {
      return top.Error("labels", "duplicate label " + label.dump());
    }
    index->labels.push_back(label.get<std::string>());
  }
  return OkStatus();
}

// The "shards" array into index->shards.
Status ParseShards(const Fields& top, const std::string& path, Index* index) {
  SY_ASSIGN_OR_RETURN(std::vector<json> shards, Array(top, "shards"));
  for (size_t i = 0; i < shards.size(); ++i) {
    if (!shards[i].is_object()) return top.Error("shards", "expected objects");
    const Fields fields(shards[i], path, StrCat("shards[", i, "]."));
    ShardEntry shard;
    SY_ASSIGN_OR_RETURN(shard.name, fields.String("name"));
    if (shard.name.empty() || shard.name.find('/') != std::string::npos || shard.name[0] == '.') {
      return fields.Error("name", "expected a plain file name, got \"" + shard.name + "\"");
    }
    SY_ASSIGN_OR_RETURN(shard.split, fields.SplitField("split"));
    SY_ASSIGN_OR_RETURN(shard.tokens, fields.Unsigned("tokens"));
    index->shards.push_back(std::move(shard));
  }
  return OkStatus();
}

// Where a document goes in its shard: documents fill each shard from offset 0, contiguously
// and in order, and a split's documents go through its shards in index order (the loader's
// stream). filled[shard]: the tokens placed in each shard so far; current_shard[split]: the
// last shard of each split.
Status PlaceDocument(const Fields& fields, const DocumentEntry& doc, const Index& index,
                     std::vector<uint64_t>& filled, int current_shard[2]) {
  const uint64_t shard = static_cast<uint64_t>(doc.shard);
  if (shard >= index.shards.size()) {
    return fields.Error("shard",
                        StrCat(shard, " is not below the ", index.shards.size(), " shards"));
  }
  if (index.shards[shard].split != doc.split) {
    return fields.Error("split", "differs from its shard's split");
  }
  if (doc.offset != filled[shard]) {
    return fields.Error("offset", StrCat(doc.offset, ", expected ", filled[shard],
                                         " (documents are contiguous in their shard)"));
  }
  if (doc.tokens == 0) return fields.Error("tokens", "0 (every document ends with </s>)");
  if (doc.tokens > index.shards[shard].tokens - filled[shard]) {  // no overflow
    return fields.Error("tokens", StrCat(doc.tokens, " runs past the end of shard ",
                                         index.shards[shard].name, " (",
                                         index.shards[shard].tokens, " tokens)"));
  }
  filled[shard] += doc.tokens;
  int& current = current_shard[static_cast<int>(doc.split)];
  if (static_cast<int>(shard) < current) {
    return fields.Error("shard", StrCat(shard, " comes after shard ", current,
                                        " of the same split (documents are in shard order)"));
  }
  current = static_cast<int>(shard);
  return OkStatus();
}

// The documents the collector took out of the tree into index->documents, each checked
// against the shards and labels; then every shard must be filled exactly.
Status PlaceDocuments(const Fields& top, const std::string& path, DocumentCollector& collector,
                      const std::map<std::string, int>& label_ids, Index* index) {
  std::vector<uint64_t> filled(index->shards.size(), 0);
  int current_shard[2] = {0, 0};
  // The tree keeps only what is not a document object: anything left is not one.
  SY_ASSIGN_OR_RETURN(std::vector<json> rest, Array(top, "documents"));
  if (!rest.empty()) return top.Error("documents", "expected objects");
  std::vector<DocumentEntry>& documents = collector.docs();
  index->documents.reserve(documents.size());
  static const json kNoFields = json::object();
  for (size_t i = 0; i < documents.size(); ++i) {
    const Fields fields(kNoFields, path, StrCat("documents[", i, "]."));
    DocumentEntry doc = std::move(documents[i]);
    SY_RETURN_IF_ERROR(PlaceDocument(fields, doc, *index, filled, current_shard));
    const std::string& label = collector.labels()[doc.label];
    auto it = label_ids.find(label);
    if (it == label_ids.end()) return fields.Error("label", "\"" + label + "\" is not in labels");
    doc.label = it->second;
    index->documents.push_back(std::move(doc));
  }
  SY_RETURN_IF_ERROR(collector.status());
  for (size_t s = 0; s < index->shards.size(); ++s) {
    if (filled[s] != index->shards[s].tokens) {
      return DataLoss(path, ": shards[", s, "] (", index->shards[s].name, ") holds ",
                      index->shards[s].tokens, " tokens but its documents add up to ", filled[s]);
    }
  }
  return OkStatus();
}

// The "totals" object must agree with the documents (index->totals, computed).
Status CheckTotals(const Fields& top, const std::string& path, const Index& index) {
  SY_ASSIGN_OR_RETURN(const json* totals, top.Get("totals"));
  for (size_t l = 0; l < index.labels.size(); ++l) {
    for (Split split : {Split::kTrain, Split::kVal}) {
      const int s = static_cast<int>(split);
      const json* entry = nullptr;
      if (totals->is_object() && totals->contains(index.labels[l]) &&
          (*totals)[index.labels[l]].is_object() &&
          (*totals)[index.labels[l]].contains(SplitName(split))) {
        entry = &(*totals)[index.labels[l]][SplitName(split)];
      }
      const std::string where = StrCat("totals.", index.labels[l], ".", SplitName(split));
      if (entry == nullptr || !entry->is_object()) return top.Error(where, "missing");
      const Fields fields(*entry, path, where + ".");
      SY_ASSIGN_OR_RETURN(uint64_t docs, fields.Unsigned("documents"));
      SY_ASSIGN_OR_RETURN(uint64_t tokens, fields.Unsigned("tokens"));
      if (docs != index.totals[l].documents[s] || tokens != index.totals[l].tokens[s]) {
        return top.Error(
            where,
            StrCat("says ", docs, " documents and ", tokens, " tokens, the documents add up to ",
                   index.totals[l].documents[s], " and ", index.totals[l].tokens[s]));
      }
    }
  }
  return OkStatus();
}

// why_not_json: where and why the input is not JSON (JsonSyntaxError), asked only when not.
template <typename Input>
StatusOr<Index> ParseIndexFrom(Input&& input, const std::string& path,
                               const std::function<std::string()>& why_not_json) {
  DocumentCollector collector(path);
  const json root = json::parse(
      std::forward<Input>(input),
      [&collector](int depth, json::parse_event_t event, json& parsed) {
        return collector(depth, event, parsed);
      },
      /*allow_exceptions=*/false);
  if (root.is_discarded()) return DataLoss(path, ": not JSON (", why_not_json(), ")");
  if (!root.is_object()) return DataLoss(path, ": not a JSON object");
  const Fields top(root, path, "");
  Index index;
  SY_RETURN_IF_ERROR(ParseHead(top, &index));
  std::map<std::string, int> label_ids;
  SY_RETURN_IF_ERROR(ParseLabels(top, &index, &label_ids));
  SY_RETURN_IF_ERROR(ParseShards(top, path, &index));
  SY_RETURN_IF_ERROR(PlaceDocuments(top, path, collector, label_ids, &index));
  ComputeTotals(&index);
  SY_RETURN_IF_ERROR(CheckTotals(top, path, index));
  return index;
}

}  // namespace

StatusOr<Index> ReadIndex(const std::string& dir) {
  const std::string path = dir + "/" + kIndexFile;
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path, ": cannot open (is ", dir, " the output of `switchyard prep`?)");
  return ParseIndexFrom(in, path, [&path] {
    std::ifstream again(path, std::ios::binary);
    return JsonSyntaxError(again);
  });
}

}  // namespace switchyard::data
