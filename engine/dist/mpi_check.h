// SY_MPI_CHECK: the MPI counterpart of SY_CUDA_CHECK. A failed call prints the rank,
// file:line, the call and MPI's own error string, then aborts (which ends every rank under
// mpirun). Only for translation units built with MPI (SY_HAVE_MPI).
//
//   SY_MPI_CHECK(MPI_Barrier(comm_));
//
// InitProcess sets MPI_ERRORS_RETURN on MPI_COMM_WORLD (inherited by every communicator
// derived from it) so that errors reach this macro instead of MPI's own abort.
#pragma once

#include <mpi.h>

#include <string>

#include "engine/core/check.h"

namespace switchyard::dist::internal {

// MPI's text for an error code: "MPI_ERR_TRUNCATE: message truncated".
inline std::string MpiErrorString(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    return "unknown MPI error " + std::to_string(code);
  }
  return std::string(text, static_cast<size_t>(length));
}

}  // namespace switchyard::dist::internal

#define SY_MPI_CHECK(expr)                                                          \
  do {                                                                              \
    const int sy_mpi_err_ = (expr);                                                 \
    SY_CHECK(sy_mpi_err_ == MPI_SUCCESS)                                            \
        << "MPI error in " #expr ": "                                               \
        << ::switchyard::dist::internal::MpiErrorString(sy_mpi_err_);               \
  } while (0)
