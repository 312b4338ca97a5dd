// For death tests of what a host under an address-space limit (`ulimit -v`) refuses: caps
// the process's RLIMIT_AS `headroom` bytes above what it maps now (/proc/self/statm). Ends
// the process with status 9 (no status under test) when it cannot read or set the limit.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>

namespace switchyard::test_util {

inline void CapAddressSpace(size_t headroom) {
  long pages = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr || std::fscanf(f, "%ld", &pages) != 1) std::_Exit(9);
  std::fclose(f);
  const rlim_t cap = static_cast<rlim_t>(pages) * sysconf(_SC_PAGESIZE) + headroom;
  const rlimit limit{cap, cap};
  if (setrlimit(RLIMIT_AS, &limit) != 0) std::_Exit(9);
}

}  // namespace switchyard::test_util
