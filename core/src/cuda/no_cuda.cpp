// Stub chosen by meson in a build without CUDA: no devices, and every call
// that needs one says so.
#include <fmt/format.h>

#include "dtensor/core/cuda.h"
#include "dtensor/core/error.h"

namespace dtensor::cuda {
namespace {
[[noreturn]] void unavailable(std::string_view what) {
  throw UnsupportedError(fmt::format(
      "[cuda] {} needs CUDA, and this build has none (configure with -Dcuda=enabled where nvcc is installed)", what));
}
}  // namespace

bool built() { return false; }
int device_count() { return 0; }
void require(std::string_view what) { unavailable(what); }
int current_device() { unavailable("current_device"); }
void set_device(int) { unavailable("set_device"); }
void* current_stream() { unavailable("current_stream"); }
void synchronize() { unavailable("synchronize"); }
std::shared_ptr<std::byte[]> allocate(std::size_t) { unavailable("a CUDA tensor"); }
AllocatorStats allocator_stats() { return {}; }
void empty_cache() {}
void copy(void*, Device, const void*, Device, std::size_t) { unavailable("a copy to or from the GPU"); }
void copy_box(const std::byte*, std::span<const std::int64_t>, std::span<const std::int64_t>, std::byte*,
              std::span<const std::int64_t>, std::span<const std::int64_t>, std::span<const std::int64_t>,
              std::size_t) {
  unavailable("copy_box");
}
void fill(void*, std::int64_t, DType, double) { unavailable("fill"); }
void arange(void*, std::int64_t, DType) { unavailable("arange"); }
void cast(const void*, DType, void*, DType, std::int64_t) { unavailable("cast"); }
void fill_random(void*, DType, std::uint64_t, std::span<const std::int64_t>, std::span<const std::int64_t>,
                 std::span<const std::int64_t>, bool) {
  unavailable("fill_random");
}
void reduce_into(void*, const void*, std::size_t, DType, ReduceOp) { unavailable("reduce_into"); }
void divide_by(void*, std::size_t, DType, std::int64_t) { unavailable("divide_by"); }
void fold_into(void*, const void*, std::span<const void* const>, std::size_t, DType, ReduceOp) {
  unavailable("fold_into");
}
void average_split(const std::int64_t*, std::int64_t*, std::size_t, std::int64_t) { unavailable("average_split"); }
void average_finish(const std::int64_t*, std::int64_t*, std::size_t, std::int64_t) { unavailable("average_finish"); }
void order_keys(const void*, void*, std::size_t, DType, ReduceOp) { unavailable("order_keys"); }
void from_order_keys(const void*, void*, std::size_t, DType) { unavailable("from_order_keys"); }
std::string describe_device(int) { return "no CUDA in this build"; }

}  // namespace dtensor::cuda
