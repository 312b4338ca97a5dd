// The tests' precompiled header (tests/CMakeLists.txt, sy_test_pch): GoogleTest, Abseil's
// Status and the standard headers the test files include most. Every test file still
// includes what it uses; this only spares parsing them again.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
