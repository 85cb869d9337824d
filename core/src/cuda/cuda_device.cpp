// The CUDA device of the ground types: device discovery, one stream per
// thread and device, the caching allocator over cudaMalloc, and copies.
// The device loops live in tensor_kernels.cu.
#include <array>
#include <mutex>

#include <fmt/format.h>

#include "dtensor/core/detail/caching_allocator.h"
#include "dtensor/core/detail/cuda_check.h"
#include "dtensor/core/error.h"

namespace dtensor::cuda {

void throw_cuda_error(cudaError_t status, const char* call) {
  throw DeviceError(fmt::format("[cuda] {}: {} ({})", call, cudaGetErrorString(status), cudaGetErrorName(status)));
}

namespace {

constexpr int kMaxDevices = 64;

struct Discovery {
  int count = 0;
  std::string why_none;
};

const Discovery& discovery() {
  static const Discovery d = [] {
    Discovery out;
    const cudaError_t status = cudaGetDeviceCount(&out.count);
    if (status != cudaSuccess) {
      out.count = 0;
      out.why_none = fmt::format("{} ({})", cudaGetErrorString(status), cudaGetErrorName(status));
      (void)cudaGetLastError();  // clear the sticky error the query left
    } else if (out.count == 0) {
      out.why_none = "the driver reports no devices";
    }
    if (out.count > kMaxDevices) out.count = kMaxDevices;
    return out;
  }();
  return d;
}

// Streams are per thread and device and live as long as the thread; a thread
// rank therefore never shares a stream with another rank.
// At thread exit each stream is drained before it is destroyed
// (cudaStreamDestroy does not wait): the thread's queued work must be done
// when join() returns, since whoever reads its results next does so on
// another stream; and blocks cached under this stream's handle must be idle
// before a later stream that gets the same handle value reuses them.
struct ThreadStreams {
  std::array<cudaStream_t, kMaxDevices> streams{};
  ~ThreadStreams() {
    for (cudaStream_t s : streams)
      if (s) {
        // The runtime may be gone at exit: errors ignored.
        (void)cudaStreamSynchronize(s);
        (void)cudaStreamDestroy(s);
      }
    (void)cudaGetLastError();
  }
};
thread_local ThreadStreams thread_streams;

// One allocator per device, never destroyed: tensors held by other static
// objects may be freed after main returns.
CachingAllocator& allocator_for(int device) {
  static std::array<CachingAllocator*, kMaxDevices>* allocators = new std::array<CachingAllocator*, kMaxDevices>{};
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  CachingAllocator*& a = (*allocators)[device];
  if (!a) {
    a = new CachingAllocator(
        [device](std::size_t bytes) -> void* {
          int previous = 0;
          DTENSOR_CUDA_CHECK(cudaGetDevice(&previous));
          DTENSOR_CUDA_CHECK(cudaSetDevice(device));
          void* p = nullptr;
          const cudaError_t status = cudaMalloc(&p, bytes);
          (void)cudaSetDevice(previous);
          if (status == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            return nullptr;
          }
          check(status, "cudaMalloc");
          return p;
        },
        [](void* p) { (void)cudaFree(p); });
  }
  return *a;
}

}  // namespace

bool built() { return true; }

int device_count() { return discovery().count; }

void require(std::string_view what) {
  if (device_count() == 0)
    throw DeviceError(fmt::format("[cuda] {} needs a CUDA device, and none is usable: {}", what, discovery().why_none));
}

int current_device() {
  int d = 0;
  DTENSOR_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

void set_device(int device) {
  require("set_device");
  if (device < 0 || device >= device_count())
    throw ValueError(
        fmt::format("[cuda] device {} out of range: this process sees {} device(s)", device, device_count()));
  DTENSOR_CUDA_CHECK(cudaSetDevice(device));
}

void* current_stream() {
  require("a CUDA stream");
  const int device = current_device();
  cudaStream_t& s = thread_streams.streams[device];
  if (!s) DTENSOR_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void synchronize() { DTENSOR_CUDA_CHECK(cudaStreamSynchronize(stream())); }

std::shared_ptr<std::byte[]> allocate(std::size_t bytes) {
  require("a CUDA tensor");
  const int device = current_device();
  const void* key = current_stream();
  CachingAllocator& a = allocator_for(device);
  void* p = a.allocate(bytes, key);
  if (p == nullptr)
    throw DeviceError(fmt::format("[cuda] out of memory on device {}: {} bytes requested, {} in use by tensors", device,
                                  bytes, a.stats().bytes_in_use));
  return std::shared_ptr<std::byte[]>(static_cast<std::byte*>(p), [&a](std::byte* q) { a.free(q); });
}

AllocatorStats allocator_stats() {
  AllocatorStats out;
  for (int d = 0; d < device_count(); ++d) {
    const auto s = allocator_for(d).stats();
    out.device_allocations += s.source_allocations;
    out.cache_hits += s.cache_hits;
    out.bytes_in_use += s.bytes_in_use;
    out.bytes_cached += s.bytes_cached;
  }
  return out;
}

void empty_cache() {
  for (int d = 0; d < device_count(); ++d) allocator_for(d).empty_cache();
}

void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
  if (bytes == 0) return;
  // Unified addressing tells the runtime the direction (cudaMemcpyDefault).
  DTENSOR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream()));
  if (dst_device == Device::CPU || src_device == Device::CPU) synchronize();
}

std::string describe_device(int device) {
  if (device_count() == 0) return fmt::format("no CUDA device: {}", discovery().why_none);
  cudaDeviceProp p{};
  DTENSOR_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  return fmt::format("{} (sm_{}{}, {} GiB)", p.name, p.major, p.minor, p.totalGlobalMem >> 30);
}

}  // namespace dtensor::cuda
