#include "engine/model/recompute.h"

namespace switchyard::model {

StatusOr<Recompute> ParseRecompute(const std::string& name) {
  if (name == "none") return Recompute::kNone;
  if (name == "selective") return Recompute::kSelective;
  if (name == "full") return Recompute::kFull;
  return InvalidArgument("train.recompute='", name, "' is not one of none, selective, full");
}

const char* RecomputeName(Recompute mode) {
  switch (mode) {
    case Recompute::kNone: return "none";
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
  }
  return "?";
}

}  // namespace switchyard::model
