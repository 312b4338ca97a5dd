// StepReadback: the one device buffer a training step's host-bound values go to (issue
// #36: one device-to-host readback per step). Ops that produce a value the host needs only
// at the step's end (the loss sums, the router's z-loss and entropy, the gradient norm's
// partial sums) write it into f64 slots reserved here, on the device, without waiting; the
// trainer reads every slot back in one copy (counted as the readback site "step_end") and
// resolves the PendingSums (engine/core/pending_sum.h) that name the slots.
//
// The trainer opens the window on its DeviceContext for the step (DeviceContext::
// step_readback); code that finds no window open computes its values at once, as before
// (evaluation, the CLI tools, the tests of single ops).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/core/device.h"
#include "engine/core/tensor.h"

namespace switchyard {

class DeviceContext;

class StepReadback {
 public:
  // expected_slots: about how many slots the step will reserve (the trainer passes the most
  // an earlier step read back, last_read()), so that its first chunk holds them all and
  // ReadBack copies once, without laying chunks side by side first; 0 when unknown.
  explicit StepReadback(int64_t expected_slots = 0) : expected_(expected_slots) {}

  // n consecutive slots [first, first + n) of the buffer: values is their (n) f64 view on
  // the device, zeroed.
  struct Slots {
    int64_t first = 0;
    Tensor values;
  };
  Slots Reserve(int64_t n, Device device, DeviceContext* ctx);

  // The number of slots reserved since the last ReadBack.
  int64_t size() const { return size_; }
  // The device of the slots reserved so far (the CPU when none).
  Device device() const { return chunks_.empty() ? Device::Cpu() : chunks_[0].values.device(); }

  // Every slot's value, in slot order, read back in one device->host copy (none when no
  // slot was reserved); the buffer is empty again afterwards.
  std::vector<double> ReadBack(DeviceContext* ctx);
  // The number of slots the last ReadBack returned.
  int64_t last_read() const { return last_read_; }

 private:
  static constexpr int64_t kChunk = 256;  // slots per allocation
  struct Chunk {
    Tensor values;     // (capacity) f64
    int64_t used = 0;  // slots handed out
  };
  std::vector<Chunk> chunks_;
  int64_t size_ = 0;
  int64_t expected_ = 0;
  int64_t last_read_ = 0;
};

}  // namespace switchyard
