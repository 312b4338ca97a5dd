// checkpoint::ReadTrainerState on an arbitrary trainer_state.json beside a valid config.yaml
// (tests/data/checkpoint-v2's): an error or a checkpoint state, never a crash.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>

#include "engine/checkpoint/trainer_state.h"
#include "tests/fuzz/fuzz_util.h"

using namespace switchyard;
namespace fs = std::filesystem;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fs::path dir = [] {
    const fs::path d = fs::temp_directory_path() / ("sy-fuzz-" + std::to_string(getpid()) + "-step");
    fs::create_directories(d);
    fs::copy_file(SWITCHYARD_SOURCE_DIR "/tests/data/checkpoint-v2/step-00000003/config.yaml",
                  d / "config.yaml", fs::copy_options::overwrite_existing);
    return d;
  }();
  {
    std::ofstream out(dir / "trainer_state.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    if (!out) fuzz::Fail("cannot write " + (dir / "trainer_state.json").string());
  }
  int version = 0;
  (void)checkpoint::ReadTrainerState(dir.string(), &version);
  return 0;
}
