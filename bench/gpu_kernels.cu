// A bare elementwise add, launched with no library code in between: the
// floor that bench/gpu measures dispatch overhead against.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace {
__global__ void add_kernel(const float* a, const float* b, float* c, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    c[i] = a[i] + b[i];
}
}  // namespace

void bare_add(const float* a, const float* b, float* c, std::int64_t n, cudaStream_t stream) {
  // A named grid size: clang-format misreads a '<' inside <<<...>>>.
  const unsigned blocks = std::max(1u, static_cast<unsigned>((n + 255) / 256));
  add_kernel<<<blocks, 256, 0, stream>>>(a, b, c, n);
}
