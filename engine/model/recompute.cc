#include "engine/model/recompute.h"

namespace switchyard::model {

StatusOr<Recompute> ParseRecompute(const std::string& name) {
  return ParseByName(kRecomputeNames, name, "train.recompute");
}

const char* RecomputeName(Recompute mode) { return NameOf(kRecomputeNames, mode); }

}  // namespace switchyard::model
