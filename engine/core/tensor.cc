#include "engine/core/tensor.h"

#include <cstring>
#include <sstream>

#include "engine/core/counters.h"
#include "engine/core/device_context.h"
#include "engine/core/thread_pool.h"

#ifdef SY_HAVE_CUDA
#include "engine/core/cuda_check.h"
#endif

namespace switchyard {

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const Shape& shape) {
  std::ostringstream out;
  out << '(';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ')';
  return out.str();
}

Buffer::Buffer(Allocator* allocator, size_t bytes)
    : allocator_(allocator),
      data_(bytes ? allocator->Allocate(bytes) : nullptr),
      bytes_(bytes),
      device_(allocator->device()) {
  internal::CountMemory(device_, kind_, static_cast<int64_t>(bytes_));
}

Buffer::Buffer(void* external, size_t bytes, Device device)
    : allocator_(nullptr), data_(external), bytes_(bytes), device_(device) {}

Buffer::~Buffer() {
  if (allocator_ != nullptr && data_ != nullptr) {
    allocator_->Deallocate(data_, bytes_);
    internal::CountMemory(device_, kind_, -static_cast<int64_t>(bytes_));
  }
}

void Buffer::Release() {
  SY_CHECK(allocator_ != nullptr) << "Release() of external memory";
  if (data_ == nullptr) return;
  allocator_->Deallocate(data_, bytes_);
  internal::CountMemory(device_, kind_, -static_cast<int64_t>(bytes_));
  data_ = nullptr;
}

void Buffer::Materialize() {
  SY_CHECK(allocator_ != nullptr) << "Materialize() of external memory";
  if (data_ != nullptr || bytes_ == 0) return;
  data_ = allocator_->Allocate(bytes_);
  internal::CountMemory(device_, kind_, static_cast<int64_t>(bytes_));
}

void Buffer::SetKind(MemoryKind kind) {
  if (kind == kind_) return;
  if (allocator_ != nullptr && data_ != nullptr) {
    internal::CountMemory(device_, kind_, -static_cast<int64_t>(bytes_));
    internal::CountMemory(device_, kind, static_cast<int64_t>(bytes_));
  }
  kind_ = kind;
}

Tensor Tensor::Empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) SY_CHECK_GE(d, 0) << "negative dimension in " << ShapeString(shape);
  size_t bytes = static_cast<size_t>(NumElements(shape)) * SizeOf(dtype);
  return Tensor(std::make_shared<Buffer>(GetAllocator(device), bytes), 0, shape, dtype);
}

Tensor Tensor::Zeros(const Shape& shape, DType dtype, Device device, DeviceContext* ctx) {
  Tensor t = Empty(shape, dtype, device);
  t.SetZero(ctx);
  return t;
}

Tensor Tensor::Wrap(void* data, const Shape& shape, DType dtype, Device device) {
  size_t bytes = static_cast<size_t>(NumElements(shape)) * SizeOf(dtype);
  return Tensor(std::make_shared<Buffer>(data, bytes, device), 0, shape, dtype);
}

int64_t Tensor::dim(int i) const {
  int n = ndim();
  if (i < 0) i += n;
  SY_CHECK(i >= 0 && i < n) << "dim " << i << " of a " << n << "-d tensor";
  return shape_[i];
}

int64_t Tensor::row_size() const {
  if (ndim() <= 1) return 1;
  int64_t n = 1;
  for (size_t i = 1; i < shape_.size(); ++i) n *= shape_[i];
  return n;
}

void* Tensor::raw_data() const {
  SY_CHECK(defined()) << "raw_data() of an undefined tensor";
  SY_CHECK(buffer_->resident()) << "raw_data() of a released buffer (ZeRO frees it between uses)";
  char* base = static_cast<char*>(buffer_->data());
  return base == nullptr ? nullptr : base + offset_ * static_cast<int64_t>(SizeOf(dtype_));
}

Tensor Tensor::Slice(int64_t begin, int64_t end) const {
  SY_CHECK_GE(ndim(), 1) << "Slice of a 0-d tensor";
  SY_CHECK(0 <= begin && begin <= end && end <= shape_[0])
      << "Slice [" << begin << ", " << end << ") of " << ShapeString(shape_);
  Shape shape = shape_;
  shape[0] = end - begin;
  return Tensor(buffer_, offset_ + begin * row_size(), std::move(shape), dtype_);
}

Tensor Tensor::Reshape(const Shape& shape) const {
  SY_CHECK_EQ(NumElements(shape), numel())
      << "Reshape " << ShapeString(shape_) << " -> " << ShapeString(shape);
  return Tensor(buffer_, offset_, shape, dtype_);
}

Tensor Tensor::View(const Shape& shape, int64_t element_offset) const {
  SY_CHECK(element_offset >= 0 && element_offset + NumElements(shape) <= numel())
      << "View " << ShapeString(shape) << " at offset " << element_offset << " of "
      << ShapeString(shape_);
  return Tensor(buffer_, offset_ + element_offset, shape, dtype_);
}

Tensor Tensor::Clone(DeviceContext* ctx) const { return To(device(), ctx); }

Tensor Tensor::To(Device device, DeviceContext* ctx) const {
  Tensor out = Empty(shape_, dtype_, device);
  out.CopyFrom(*this, ctx);
  return out;
}

Tensor Tensor::ToHost(const char* site, DeviceContext* ctx) const {
  counters::CountReadback(site);
  return device().is_cpu() ? *this : To(Device::Cpu(), ctx);
}

void Tensor::CopyFrom(const Tensor& src, DeviceContext* ctx) {
  SY_CHECK_EQ(src.dtype(), dtype_) << "CopyFrom between dtypes " << DTypeName(src.dtype())
                                   << " and " << DTypeName(dtype_);
  SY_CHECK_EQ(src.numel(), numel()) << "CopyFrom " << ShapeString(src.shape()) << " into "
                                    << ShapeString(shape_);
  size_t bytes = nbytes();
  if (bytes == 0 || raw_data() == src.raw_data()) return;
  counters::CountTensorOp("CopyFrom");  // a memcpy on the device: counted as launches are
  if (device().is_cpu() && src.device().is_cpu()) {
    if (ctx != nullptr && ctx->capturing()) {  // engine/core/captured_work.h
      ctx->Record([dst = *this, src, bytes] { std::memmove(dst.raw_data(), src.raw_data(), bytes); });
      return;
    }
    std::memmove(raw_data(), src.raw_data(), bytes);
    return;
  }
#ifdef SY_HAVE_CUDA
  cudaStream_t stream = ctx ? static_cast<cudaStream_t>(ctx->stream()) : nullptr;
  if (ctx != nullptr && ctx->capturing()) {
    // A CUDA graph records the source's address: a host source is copied into pinned memory
    // the graph keeps (its value at capture is what every replay copies).
    SY_CHECK(!device().is_cpu()) << "a device-to-host copy while the step is captured";
    if (src.device().is_cpu()) {
      void* pinned = nullptr;
      SY_CUDA_CHECK(cudaMallocHost(&pinned, bytes));
      std::memcpy(pinned, src.raw_data(), bytes);
      ctx->KeepWithCapture(std::shared_ptr<void>(pinned, [](void* p) { cudaFreeHost(p); }));
      SY_CUDA_CHECK(cudaMemcpyAsync(raw_data(), pinned, bytes, cudaMemcpyHostToDevice, stream));
      return;
    }
  }
  // From the host on a context: through pinned memory, so the host does not wait for the
  // stream (DeviceContext::StageToDevice).
  if (ctx != nullptr && src.device().is_cpu() && ctx->StageToDevice(raw_data(), src.raw_data(), bytes)) {
    return;
  }
  // Without a context no stream orders the copy against the contexts' streams (created
  // non-blocking: the legacy default stream does not wait for them, nor they for it), so the
  // device is synchronised on both sides of it: checkpoint loads, tests.
  if (ctx == nullptr) SY_CUDA_CHECK(cudaDeviceSynchronize());
  SY_CUDA_CHECK(cudaMemcpyAsync(raw_data(), src.raw_data(), bytes, cudaMemcpyDefault, stream));
  if (ctx == nullptr) {
    SY_CUDA_CHECK(cudaDeviceSynchronize());
  } else if (device().is_cpu()) {
    SY_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
#else
  SY_LOG(FATAL) << "copy involving a CUDA tensor in a build without the CUDA backend";
#endif
}

void Tensor::SetZero(DeviceContext* ctx) {
  size_t bytes = nbytes();
  if (bytes == 0) return;
  counters::CountTensorOp("SetZero");  // a memset on the device: counted as launches are
  if (device().is_cpu()) {
    if (ctx != nullptr && ctx->capturing()) {  // engine/core/captured_work.h
      ctx->Record([t = *this] { Tensor(t).SetZero(nullptr); });
      return;
    }
    // Large tensors (the gradients zeroed every step) over the compute threads.
    char* p = static_cast<char*>(raw_data());
    ParallelFor(static_cast<int64_t>(bytes), int64_t{1} << 20, [p](int64_t b, int64_t e) {
      std::memset(p + b, 0, static_cast<size_t>(e - b));
    });
    return;
  }
#ifdef SY_HAVE_CUDA
  cudaStream_t stream = ctx ? static_cast<cudaStream_t>(ctx->stream()) : nullptr;
  if (ctx == nullptr) SY_CUDA_CHECK(cudaDeviceSynchronize());  // as CopyFrom without a context
  SY_CUDA_CHECK(cudaMemsetAsync(raw_data(), 0, bytes, stream));
  if (ctx == nullptr) SY_CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

std::string Tensor::DebugString() const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream out;
  out << "Tensor(" << DTypeName(dtype_) << ", " << ShapeString(shape_) << ", "
      << device().ToString() << ")";
  return out.str();
}

}  // namespace switchyard
