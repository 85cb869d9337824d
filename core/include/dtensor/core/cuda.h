#pragma once
// The CUDA device as the ground types see it: devices, per-thread streams,
// the caching allocator and the few device loops that Tensor itself needs
// (fill, cast, box copies, seeded random values, elementwise reduction).
// Implemented in core/src/cuda/ when meson finds CUDA; otherwise a
// stub answers built() == false, device_count() == 0 and throws
// UnsupportedError from everything else, so no code above needs an #ifdef.
//
// Streams. Each thread has its own stream per device, created on first use
// (cudaStreamNonBlocking). A thread rank therefore works on its own stream,
// and the simulated multi-rank mode (several thread ranks on one GPU) runs
// their kernels concurrently. Library calls that hand data to the host
// (copies to the CPU, get()) synchronise that stream first.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "dtensor/core/dtype.h"
#include "dtensor/core/reduce_op.h"

namespace dtensor::cuda {

/// True when this build was compiled with CUDA (meson -Dcuda).
bool built();
/// CUDA devices this process can use: 0 in a build without CUDA, without a
/// driver or without a device (never throws).
int device_count();
/// Throws UnsupportedError (no CUDA in this build) or DeviceError (no
/// device or driver) naming `what` needs it; returns when a device is usable.
void require(std::string_view what);

/// The device the calling thread works on (cudaSetDevice is per thread).
int current_device();
void set_device(int device);
/// The calling thread's stream on its current device, as a cudaStream_t.
void* current_stream();
/// Waits for the calling thread's stream.
void synchronize();

/// Device memory of at least `bytes` on the current device from the caching
/// allocator: freed blocks go back to a per-device, per-stream pool and are
/// reused by later allocations on the same stream without cudaMalloc.
std::shared_ptr<std::byte[]> allocate(std::size_t bytes);

struct AllocatorStats {
  std::uint64_t device_allocations = 0;  // cudaMalloc calls made
  std::uint64_t cache_hits = 0;          // allocations served from the pool
  std::uint64_t bytes_in_use = 0;        // handed out and not yet freed
  std::uint64_t bytes_cached = 0;        // held in the pool, free
};
AllocatorStats allocator_stats();
/// Returns the pool's free blocks to the driver (cudaFree).
void empty_cache();

/// Copies `bytes` between any two of host and device memory, in stream order
/// on the calling thread's stream; returns after the copy when either side
/// is the host.
void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes);

/// Device loops over device memory, all on the calling thread's stream.
/// Copies the box (src_offset, size) of a row-major [src_shape] array into
/// the box (dst_offset, size) of a row-major [dst_shape] array.
void copy_box(const std::byte* src, std::span<const std::int64_t> src_shape, std::span<const std::int64_t> src_offset,
              std::byte* dst, std::span<const std::int64_t> dst_shape, std::span<const std::int64_t> dst_offset,
              std::span<const std::int64_t> size, std::size_t itemsize);
/// Sets `count` elements to `value` converted to `dtype`.
void fill(void* data, std::int64_t count, DType dtype, double value);
/// 0, 1, ..., count-1.
void arange(void* data, std::int64_t count, DType dtype);
/// Converts `count` elements from `from` to `to` (rounding to nearest even).
void cast(const void* src, DType from, void* dst, DType to, std::int64_t count);
/// The values Tensor::rand (normal: Tensor::randn) has at the box
/// (offset, size) of a [global_shape] tensor, from the same Philox counters:
/// rand gives the CPU's bits exactly; randn goes through the device's own
/// log and cos, so an element may differ from the CPU's in the last place.
void fill_random(void* data, DType dtype, std::uint64_t seed, std::span<const std::int64_t> global_shape,
                 std::span<const std::int64_t> offset, std::span<const std::int64_t> size, bool normal);
/// acc = op(acc, x) elementwise (Avg as Sum), and acc /= divisor.
void reduce_into(void* acc, const void* x, std::size_t count, DType dtype, ReduceOp op);
void divide_by(void* acc, std::size_t count, DType dtype, std::int64_t divisor);
/// acc = own op peers[0] op peers[1] ... (Avg as Sum), in that order and with
/// the bits of a copy followed by reduce_into per peer, in one pass over
/// memory (one launch per 7 peers) where those make one per peer. acc may
/// be own.
void fold_into(void* acc, const void* own, std::span<const void* const> peers, std::size_t count, DType dtype,
               ReduceOp op);
/// The device forms of dtensor::average_split and average_finish.
void average_split(const std::int64_t* x, std::int64_t* pairs, std::size_t count, std::int64_t n);
void average_finish(const std::int64_t* pairs, std::int64_t* out, std::size_t count, std::int64_t n);
/// The NCCL fix-up for floating max/min (ncclMax drops NaN): order_keys
/// writes each value's key, a signed integer (int32 for f32, bf16 and f16,
/// int64 for f64) that orders as combine::max_nan / min_nan do, NaN above
/// (max) or below (min) every number; from_order_keys turns reduced keys
/// back into values (a NaN key into a NaN).
void order_keys(const void* x, void* keys, std::size_t count, DType dtype, ReduceOp op);
void from_order_keys(const void* keys, void* out, std::size_t count, DType dtype);

/// "NVIDIA H200 (sm_90, 139 GiB)" for device `device`, or why there is none.
std::string describe_device(int device = 0);

}  // namespace dtensor::cuda
