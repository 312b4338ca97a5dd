// How an op writes its output tensor, for the kernels that can do either.
#pragma once

namespace switchyard::kernels {

// kSet: out = the op's result, over whatever out held (out need not be initialised).
// kAdd: out += the op's result, in the op's own pass: the bits of writing a fresh tensor and
//       then adding it in (kernels::Axpy(1, ...)), with one pass over out fewer. An op
//       that reads its input while adding into out says when the two may not share memory.
enum class Write { kSet, kAdd };

}  // namespace switchyard::kernels
