#include "engine/config/yaml_documents.h"

#include <sstream>
#include <utility>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

namespace switchyard::config {
namespace {

// Records each document's YamlDocument from the parser's events.
class DocumentScan : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    documents.push_back({.mark = mark});  // until its first content event
    started.push_back(false);
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { Content(mark, true); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { Content(mark, false); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    Content(mark, false);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    Content(mark, false);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    Content(mark, false);
  }
  void OnMapEnd() override {}

  std::vector<YamlDocument> documents;

 private:
  void Content(const YAML::Mark& mark, bool null) {
    YamlDocument& d = documents.back();
    if (!started.back()) d.mark = mark;
    d.null = !started.back() && null;
    started.back() = true;
  }

  std::vector<bool> started;  // per document: an event of its content seen
};

}  // namespace

StatusOr<std::vector<YamlDocument>> ScanYamlDocuments(const std::string& yaml,
                                                      const std::string& source) {
  std::istringstream in(yaml);
  DocumentScan scan;
  try {
    YAML::Parser parser(in);
    while (parser.HandleNextDocument(scan)) {
      const std::vector<YamlDocument>& d = scan.documents;
      const size_t n = d.size();
      const YAML::Mark& at = d[n - 1].mark;
      const std::string what =
          at.pos >= 0 && static_cast<size_t>(at.pos) < yaml.size() ? yaml.substr(at.pos, 1) : "";
      // yaml-cpp reads a document that starts with ',' as null: a value that is not there
      // (a second such document repeats forever, its LoadAll loop; a first one read as an
      // empty config). A null document at the same place twice is that loop, whatever it saw.
      const bool repeated = n >= 2 && d[n - 2].null && d[n - 2].mark.pos == at.pos;
      if (d[n - 1].null && (what == "," || repeated)) {
        return InvalidArgument(source, ":", at.line + 1, ": YAML syntax error: unexpected '",
                               PrintableText(what), "' where a value starts");
      }
    }
  } catch (const YAML::Exception& e) {
    return InvalidArgument(source, ":", e.mark.line + 1, ": YAML syntax error: ", PrintableText(e.msg));
  }
  return std::move(scan.documents);
}

}  // namespace switchyard::config
