#include "engine/core/dtype.h"

namespace switchyard {

size_t SizeOf(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
    case DType::kF64: return 8;
  }
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
    case DType::kF64: return "f64";
  }
  return "?";
}

StatusOr<DType> ParseDType(std::string_view name) {
  if (name == "f32" || name == "float32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "f16" || name == "float16") return DType::kF16;
  if (name == "i32" || name == "int32") return DType::kI32;
  if (name == "i64" || name == "int64") return DType::kI64;
  if (name == "u8" || name == "uint8") return DType::kU8;
  if (name == "f64" || name == "float64") return DType::kF64;
  return InvalidArgument("unknown dtype '", name,
                         "' (expected f32, bf16, f16, i32, i64, u8 or f64)");
}

bool IsFloating(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16 ||
         dtype == DType::kF64;
}

}  // namespace switchyard
