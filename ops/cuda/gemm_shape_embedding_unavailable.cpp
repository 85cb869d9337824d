// Stub chosen by meson in a build without CUDA: the einsum, shape and
// embedding families never call these (they only take the CUDA path for
// CUDA tensors, which such a build cannot make), but each says so if it is.
#include <string_view>

#include <fmt/format.h>

#include "dtensor/core/error.h"
#include "gemm_shape_embedding.h"

namespace dtensor::cuda_kernels {
namespace {
[[noreturn]] void unavailable(std::string_view what) {
  throw UnsupportedError(fmt::format(
      "[cuda] {} needs CUDA, and this build has none (configure with -Dcuda=enabled where nvcc is installed)", what));
}
}  // namespace

void gemm(DType, bool, bool, std::int64_t, std::int64_t, std::int64_t, const void*, std::int64_t, const void*,
          std::int64_t, void*, std::int64_t) {
  unavailable("gemm");
}
void gemm_batched(DType, bool, bool, std::int64_t, std::int64_t, std::int64_t, const void*, std::int64_t,
                  std::int64_t, const void*, std::int64_t, std::int64_t, void*, std::int64_t, std::int64_t,
                  std::int64_t, bool) {
  unavailable("gemm_batched");
}
void set_allow_tf32(bool) { unavailable("set_allow_tf32"); }
bool allow_tf32() { return false; }
void gather_strided(const void*, void*, std::span<const std::int64_t>, std::span<const std::int64_t>, std::size_t) {
  unavailable("gather_strided");
}
void sum_last(DType, const void*, void*, std::int64_t, std::int64_t) { unavailable("sum_last"); }
void add_bias(DType, void*, const void*, std::int64_t, std::int64_t) { unavailable("add_bias"); }
void embedding(const std::int64_t*, std::int64_t, const void*, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
               std::size_t, void*) {
  unavailable("embedding");
}
void pick(const void*, const std::int64_t*, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::size_t,
          void*) {
  unavailable("pick");
}

}  // namespace dtensor::cuda_kernels
