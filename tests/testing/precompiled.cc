// The program CMake compiles tests/testing/precompiled.h's precompiled header with (the
// tests reuse it: tests/CMakeLists.txt). It does nothing.
#include "tests/testing/precompiled.h"

int main() { return 0; }
