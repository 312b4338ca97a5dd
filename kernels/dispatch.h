// Device dispatch shared by every kernel family: kernels/<family>.h declares the op and
// its cpu:: and cuda:: implementations; kernels/<family>.cc picks one by the output
// tensor's device. Each dispatch is counted under the name of the function that dispatches
// (__func__: the op's wrapper, "Gemm", "Cast", ...), once, whatever memsets and copies its
// implementation makes (counters::DispatchScope), and an op that returns a host value counts a
// readback in its wrapper (engine/core/counters.h), so CPU and CUDA runs count alike. In a build without the CUDA backend the cuda:: branch is compiled out
// and a CUDA tensor is a fatal error.
#pragma once

#include "engine/core/check.h"
#include "engine/core/counters.h"
#include "engine/core/device_context.h"

#ifdef SY_HAVE_CUDA
#define SY_CUDA_BRANCH(call) call
#else
#define SY_CUDA_BRANCH(call) \
  SY_LOG(FATAL) << "CUDA tensor in a build without the CUDA backend"
#endif

// The CUDA side of both dispatch macros: `call_cuda` with the DeviceContext of `out`.
#define SY_DISPATCH_CUDA_(out, ctx, call_cuda)                                       \
  do {                                                                               \
    SY_CHECK((ctx) != nullptr && (ctx)->device() == (out).device())                  \
        << "a CUDA kernel needs the DeviceContext of " << (out).device().ToString(); \
    SY_CUDA_BRANCH(call_cuda);                                                       \
  } while (0)

// Runs `call_cpu` for a host tensor `out`, else `call_cuda` with a matching `ctx`; counts
// one kernel dispatch (engine/core/counters.h) either way. While a host `ctx` captures
// (engine/core/captured_work.h), `call_cpu` is recorded with copies of what it names and
// runs at each replay. So it writes through tensors only (an assignment to a host variable
// would be lost: ops that return a host value use SY_DISPATCH_DEVICE_NOW, readbacks that a
// capture refuses anyway); a host array it reads is an owned copy (a std::vector made before
// the dispatch, not a span of the caller's memory); and a value it takes from a tensor is
// read inside call_cpu, not before the dispatch.
#define SY_DISPATCH_DEVICE(out, ctx, call_cpu, call_cuda)                              \
  do {                                                                                 \
    ::switchyard::counters::CountDispatch(__func__);                                   \
    const ::switchyard::counters::DispatchScope sy_dispatch_scope;                     \
    if ((out).device().is_cpu()) {                                                     \
      ::switchyard::DeviceContext* const sy_dispatch_ctx = (ctx);                      \
      if (sy_dispatch_ctx != nullptr && sy_dispatch_ctx->capturing()) {               \
        sy_dispatch_ctx->Record([=]() mutable {                                        \
          const ::switchyard::counters::DispatchScope sy_replay_scope;                 \
          call_cpu;                                                                    \
        });                                                                            \
      } else {                                                                         \
        call_cpu;                                                                      \
      }                                                                                \
    } else {                                                                           \
      SY_DISPATCH_CUDA_(out, ctx, call_cuda);                                          \
    }                                                                                  \
  } while (0)

// SY_DISPATCH_DEVICE for an op whose result comes back to the host (it assigns a host
// variable): never recorded; the op counts its readback, which a capture refuses.
#define SY_DISPATCH_DEVICE_NOW(out, ctx, call_cpu, call_cuda)                          \
  do {                                                                                 \
    ::switchyard::counters::CountDispatch(__func__);                                   \
    const ::switchyard::counters::DispatchScope sy_dispatch_scope;                     \
    ::switchyard::capture::CheckNotCapturing("an op returning a host value");          \
    if ((out).device().is_cpu()) {                                                     \
      call_cpu;                                                                        \
    } else {                                                                           \
      SY_DISPATCH_CUDA_(out, ctx, call_cuda);                                          \
    }                                                                                  \
  } while (0)
