// Invariant checks. A failed check prints "[F r<rank> file:line] Check failed: ..." and
// aborts; under mpirun that ends every rank. For errors a user can cause, return a Status.
//
//   SY_CHECK(n > 0) << "n=" << n;
//   SY_CHECK_EQ(a.numel(), b.numel());
//
// The library checks (SY_CUDA_CHECK, SY_CUBLAS_CHECK, SY_NCCL_CHECK) live in
// engine/core/cuda_check.h, SY_MPI_CHECK in engine/dist/mpi_check.h; all print the rank,
// file:line and the library's own error string.
#pragma once

#include "engine/core/logging.h"

#define SY_CHECK(cond)                                         \
  (cond) ? (void)0                                             \
         : ::switchyard::internal::Voidify() &                 \
               SY_LOG(FATAL) << "Check failed: " #cond " "

#define SY_CHECK_OP(a, b, op)                                                  \
  ((a)op(b)) ? (void)0                                                         \
             : ::switchyard::internal::Voidify() &                             \
                   SY_LOG(FATAL) << "Check failed: " #a " " #op " " #b " (" << (a) \
                                 << " vs " << (b) << ") "

#define SY_CHECK_EQ(a, b) SY_CHECK_OP(a, b, ==)
#define SY_CHECK_NE(a, b) SY_CHECK_OP(a, b, !=)
#define SY_CHECK_LT(a, b) SY_CHECK_OP(a, b, <)
#define SY_CHECK_LE(a, b) SY_CHECK_OP(a, b, <=)
#define SY_CHECK_GT(a, b) SY_CHECK_OP(a, b, >)
#define SY_CHECK_GE(a, b) SY_CHECK_OP(a, b, >=)

// Checks that a Status is OK; for call sites where an error is a bug.
#define SY_CHECK_OK(expr)                                  \
  do {                                                     \
    const ::absl::Status sy_check_status_ = (expr);        \
    SY_CHECK(sy_check_status_.ok()) << sy_check_status_;   \
  } while (0)
