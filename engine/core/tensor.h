// Tensor: a dtype, a shape and a device over a shared, reference-counted buffer. No
// autograd: layers have explicit Forward and Backward. Tensors are contiguous row-major;
// views (Slice along dim 0, Reshape, View) share the buffer at an element offset.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/allocator.h"
#include "engine/core/check.h"
#include "engine/core/dtype.h"

namespace switchyard {

class DeviceContext;

using Shape = std::vector<int64_t>;

// Product of the dimensions (1 for a scalar shape {}).
int64_t NumElements(const Shape& shape);
// "(2, 3, 4)".
std::string ShapeString(const Shape& shape);

// A block of memory on one device, freed through its allocator when the last tensor that
// views it goes away. A Buffer made from an external pointer does not free it.
class Buffer {
 public:
  Buffer(Allocator* allocator, size_t bytes);
  Buffer(void* external, size_t bytes, Device device);
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

  // ZeRO frees gradients and stage-3 parameters between uses while the layers keep their
  // tensors: Release() gives the memory back (data() is then null and raw_data() of any
  // tensor viewing it fails a check) and Materialize() allocates the same number of bytes
  // again, contents undefined. Both are no-ops when already in that state; allocator-owned
  // buffers only.
  void Release();
  void Materialize();
  bool resident() const { return data_ != nullptr || bytes_ == 0; }

  // What the bytes are for (allocator.h); re-tagging moves them between the kinds' counts.
  MemoryKind kind() const { return kind_; }
  void SetKind(MemoryKind kind);

 private:
  Allocator* allocator_;  // null for external memory
  void* data_;
  size_t bytes_;
  Device device_;
  MemoryKind kind_ = MemoryKind::kWorkspace;
};

class Tensor {
 public:
  // An undefined tensor (no buffer).
  Tensor() = default;

  // Uninitialised memory.
  static Tensor Empty(const Shape& shape, DType dtype, Device device = Device::Cpu());
  // Zero-filled. On CUDA the memset is ordered on ctx's stream (or the default stream).
  static Tensor Zeros(const Shape& shape, DType dtype, Device device = Device::Cpu(),
                      DeviceContext* ctx = nullptr);
  // A host tensor holding `values` (numel(shape) of them).
  template <typename T>
  static Tensor FromVector(const std::vector<T>& values, const Shape& shape);
  // Wraps memory the caller owns and keeps alive.
  static Tensor Wrap(void* data, const Shape& shape, DType dtype, Device device);

  bool defined() const { return buffer_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return buffer_ ? buffer_->device() : Device::Cpu(); }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  // Size of dimension i; negative i counts from the end.
  int64_t dim(int i) const;
  int64_t numel() const { return NumElements(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * SizeOf(dtype_); }
  // Elements per index of dim 0 (numel / dim(0)); 1 for a 0-d or 1-d tensor.
  int64_t row_size() const;

  void* raw_data() const;
  // Typed pointer; checks that T matches the dtype.
  template <typename T>
  T* data() const {
    SY_CHECK(DTypeOf<T>() == dtype_) << "tensor is " << DTypeName(dtype_) << ", asked for "
                                     << DTypeName(DTypeOf<T>());
    return static_cast<T*>(raw_data());
  }

  // Rows [begin, end) of dim 0, sharing storage.
  Tensor Slice(int64_t begin, int64_t end) const;
  // The same elements under another shape with the same number of elements.
  Tensor Reshape(const Shape& shape) const;
  // `shape` starting `element_offset` elements into this tensor's storage view.
  Tensor View(const Shape& shape, int64_t element_offset = 0) const;

  // A new tensor with its own copy of the data, on `device` (default: the same device).
  Tensor Clone(DeviceContext* ctx = nullptr) const;
  Tensor To(Device device, DeviceContext* ctx = nullptr) const;
  // The values for the host to read: this tensor itself when it is on the host (the same
  // storage: read it, do not write it), else a host copy (waits for ctx's stream). Counts one
  // device->host readback named `site` (engine/core/counters.h) on every device, so a CPU
  // run counts the readbacks a GPU run of the same config has. Host code reads device
  // values through it.
  Tensor ToHost(const char* site, DeviceContext* ctx = nullptr) const;
  // Copies src (same dtype and numel; any devices) into this tensor. Synchronous for
  // device->host copies; ordered on ctx's stream otherwise.
  void CopyFrom(const Tensor& src, DeviceContext* ctx = nullptr);
  // Sets every byte to zero.
  void SetZero(DeviceContext* ctx = nullptr);

  // Copies to the host and returns the values.
  template <typename T>
  std::vector<T> ToVector() const {
    Tensor host = device().is_cpu() ? *this : To(Device::Cpu());
    const T* p = host.data<T>();
    return std::vector<T>(p, p + numel());
  }

  // The buffer this tensor views (Buffer::Release/Materialize/SetKind act on it, hence on
  // every tensor viewing it).
  Buffer& buffer() const {
    SY_CHECK(defined()) << "buffer() of an undefined tensor";
    return *buffer_;
  }

  // Whether both tensors view the same buffer.
  bool SharesStorageWith(const Tensor& other) const { return buffer_ == other.buffer_; }
  // "Tensor(f32, (2, 3), cpu)".
  std::string DebugString() const;

 private:
  Tensor(std::shared_ptr<Buffer> buffer, int64_t offset, Shape shape, DType dtype)
      : buffer_(std::move(buffer)), offset_(offset), shape_(std::move(shape)), dtype_(dtype) {}

  std::shared_ptr<Buffer> buffer_;
  int64_t offset_ = 0;  // in elements
  Shape shape_;
  DType dtype_ = DType::kF32;
};

template <typename T>
Tensor Tensor::FromVector(const std::vector<T>& values, const Shape& shape) {
  SY_CHECK_EQ(static_cast<int64_t>(values.size()), NumElements(shape))
      << "FromVector: values do not fill shape " << ShapeString(shape);
  Tensor t = Empty(shape, DTypeOf<T>());
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(T));
  return t;
}

}  // namespace switchyard
