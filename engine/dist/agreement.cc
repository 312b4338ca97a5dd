#include "engine/dist/agreement.h"

#include <algorithm>
#include <cstring>

namespace switchyard::dist {

// Every rank's `mine`, in rank order. Collective.
std::vector<std::string> AllGatherStrings(const std::string& mine, dist::Communicator& world) {
  const int n = world.size();
  Tensor len = Tensor::FromVector<int64_t>({static_cast<int64_t>(mine.size())}, {1});
  Tensor lens = Tensor::Empty({n}, DType::kI64);
  world.AllGather(len, lens);
  const std::vector<int64_t> sizes = lens.ToVector<int64_t>();
  const int64_t width = *std::max_element(sizes.begin(), sizes.end());
  std::vector<std::string> out(n);
  if (width == 0) return out;
  Tensor in = Tensor::Zeros({width}, DType::kU8);
  std::memcpy(in.raw_data(), mine.data(), mine.size());
  Tensor all = Tensor::Empty({n * width}, DType::kU8);
  world.AllGather(in, all);
  const char* bytes = static_cast<const char*>(all.raw_data());
  for (int r = 0; r < n; ++r) out[r].assign(bytes + r * width, sizes[r]);
  return out;
}

// The error of the lowest failing rank, on every rank (OK when every rank is OK), so that
// every rank takes the same path afterwards. Collective.
Status AgreeOnStatus(const Status& local, dist::Communicator& world) {
  Tensor code = Tensor::FromVector<int32_t>({static_cast<int32_t>(local.code())}, {1});
  Tensor codes = Tensor::Empty({world.size()}, DType::kI32);
  world.AllGather(code, codes);
  const std::vector<int32_t> all = codes.ToVector<int32_t>();
  for (int r = 0; r < world.size(); ++r) {
    if (all[r] == 0) continue;
    std::string message = world.rank() == r ? std::string(local.message()) : std::string();
    Tensor len = Tensor::FromVector<int64_t>({static_cast<int64_t>(message.size())}, {1});
    world.Broadcast(len, r);
    message.resize(static_cast<size_t>(len.ToVector<int64_t>()[0]));
    if (!message.empty()) {
      Tensor bytes = Tensor::Empty({static_cast<int64_t>(message.size())}, DType::kU8);
      std::memcpy(bytes.raw_data(), message.data(), message.size());
      world.Broadcast(bytes, r);
      std::memcpy(message.data(), bytes.raw_data(), message.size());
    }
    return Status(static_cast<absl::StatusCode>(all[r]), message);
  }
  return OkStatus();
}

}  // namespace switchyard::dist
