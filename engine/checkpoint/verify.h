// Checking a step directory beyond its structure (docs/checkpoints.md "Verification"): the
// CRC-32 of every file the index lists under "files", the trainer state's step against the
// directory's name, and the values loaded (no NaN or Inf). Used by checkpoint.cc (loading,
// VerifyCheckpoint) and its tests; not a public API.
#pragma once

#include <cstdint>
#include <string>

#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/checkpoint/index.h"

namespace switchyard::checkpoint {

// One-line text of a FileSums and back (to gather every rank's sums on rank 0). Trusted
// input: the text comes from SerializeSums on another rank.
std::string SerializeSums(const FileSums& sums);
FileSums ParseSums(const std::string& text);

// Checks the files of `dir` against index.files, the share of rank `rank` of `world` (the
// files at positions rank, rank + world, ... of the sorted list: every byte is read once
// over the world). Every file a piece of the index names, trainer_state.json and
// config.yaml must be listed (DataLoss naming the index otherwise). Errors name the
// file: missing (FailedPrecondition: incomplete checkpoint), another size or checksum
// (DataLoss: damaged). An index without "files" (a checkpoint saved before checksums) is
// not checked: OK.
Status VerifyFileSums(const std::string& dir, const CheckpointIndex& index, int rank, int world);

// The step of trainer_state.json against the directory's name "step-XXXXXXXX" (a
// directory of another name is not checked). DataLoss naming the trainer state.
Status CheckStepOfDir(const std::string& dir, int64_t step);

// A loaded piece of tensor `name` (f32, bf16, f16 or f64; other dtypes pass) holds only
// finite values; the optimizer's second moments (`optimizer.exp_avg_sq.*`) none below 0, and
// its update count (`optimizer.step`, i64) is in [0, step], the checkpoint's step (below it
// by the steps skipped as non-finite). DataLoss naming the directory, the tensor and the
// first bad element.
Status CheckTensorValues(const Tensor& t, const std::string& name, const std::string& dir,
                         int64_t step);

}  // namespace switchyard::checkpoint
