// GEMM on CUDA tensors through cuBLAS (int64 through gemm_kernels.cu).
// cuBLAS is column-major; a row-major C = op(A) op(B) is the column-major
// C^T = op(B)^T op(A)^T, so each call passes B before A and swaps m and n.
// The memory of a row-major X with leading dimension ld is, read
// column-major, X^T with the same ld: the transposition flags carry over
// unchanged.
#include <atomic>
#include <climits>
#include <vector>

#include <cublas_v2.h>
#include <fmt/format.h>

#include "dtensor/core/detail/cuda_check.h"
#include "dtensor/core/error.h"
#include "gemm_kernels.h"
#include "gemm_shape_embedding.h"

namespace dtensor::cuda_kernels {
namespace {

std::atomic<bool> tf32_allowed{false};

void check_cublas(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw DeviceError(
        fmt::format("[cuda] {} failed: {} ({})", call, cublasGetStatusString(status), static_cast<int>(status)));
}

/// The calling thread's cuBLAS handles, one per device, created on first
/// use on that device (a handle belongs to the device current when it is
/// created) and destroyed when the thread ends.
class ThreadHandles {
 public:
  ThreadHandles() = default;
  ThreadHandles(const ThreadHandles&) = delete;
  ThreadHandles& operator=(const ThreadHandles&) = delete;
  ~ThreadHandles() {
    // At process exit the driver may already be gone: nothing to report.
    for (cublasHandle_t h : by_device_)
      if (h) cublasDestroy(h);
  }
  /// The handle of the current device, bound to the thread's stream.
  cublasHandle_t get() {
    const int device = dtensor::cuda::current_device();
    if (device >= static_cast<int>(by_device_.size())) by_device_.resize(static_cast<std::size_t>(device) + 1, nullptr);
    cublasHandle_t& h = by_device_[static_cast<std::size_t>(device)];
    if (!h) {
      check_cublas(cublasCreate(&h), "cublasCreate");
      // bf16/f16 accumulate in f32 to the end: by default cuBLAS may do
      // split-k reductions in the 16-bit output type, which rounds more
      // than once and no longer matches the CPU's f32 result rounded once.
      check_cublas(cublasSetMathMode(h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                                                  CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
                   "cublasSetMathMode");
    }
    check_cublas(cublasSetStream(h, dtensor::cuda::stream()), "cublasSetStream");
    return h;
  }

 private:
  std::vector<cublasHandle_t> by_device_;
};

cublasHandle_t handle() {
  thread_local ThreadHandles handles;
  return handles.get();
}

/// How cuBLAS is told about a dtype: storage type, compute type, and
/// the constants 1 and 0 (alpha, beta) in the scale type the compute type
/// needs.
struct GemmTypes {
  cudaDataType data;
  cublasComputeType_t compute;
  const void* one;
  const void* zero;
};

GemmTypes gemm_types(DType dtype) {
  static const float one_f = 1.0f, zero_f = 0.0f;
  static const double one_d = 1.0, zero_d = 0.0;
  switch (dtype) {
    case DType::Float32:
      return {CUDA_R_32F,
              tf32_allowed.load(std::memory_order_relaxed) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, &one_f,
              &zero_f};
    case DType::Float64: return {CUDA_R_64F, CUBLAS_COMPUTE_64F, &one_d, &zero_d};
    case DType::BFloat16: return {CUDA_R_16BF, CUBLAS_COMPUTE_32F, &one_f, &zero_f};
    case DType::Float16: return {CUDA_R_16F, CUBLAS_COMPUTE_32F, &one_f, &zero_f};
    default: break;
  }
  throw DTypeError(fmt::format("[cuda] gemm: no cuBLAS type for {}", dtype));
}

bool fits_int(std::initializer_list<std::int64_t> values) {
  for (std::int64_t v : values)
    if (v < 0 || v > INT_MAX) return false;
  return true;
}

/// C = 0 for each of the batch m x n matrices (the k = 0 product).
void zero_matrices(std::int64_t m, std::int64_t n, void* c, std::int64_t ldc, std::int64_t stride_c, std::int64_t batch,
                   std::size_t item) {
  auto* base = static_cast<std::byte*>(c);
  const auto pitch = static_cast<std::size_t>(ldc) * item;
  const auto width = static_cast<std::size_t>(n) * item;
  if (stride_c == m * ldc) {
    DTENSOR_CUDA_CHECK(
        cudaMemset2DAsync(base, pitch, 0, width, static_cast<std::size_t>(m * batch), dtensor::cuda::stream()));
    return;
  }
  for (std::int64_t i = 0; i < batch; ++i)
    DTENSOR_CUDA_CHECK(cudaMemset2DAsync(base + static_cast<std::size_t>(i * stride_c) * item, pitch, 0, width,
                                         static_cast<std::size_t>(m), dtensor::cuda::stream()));
}

}  // namespace

void set_allow_tf32(bool allow) { tf32_allowed.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return tf32_allowed.load(std::memory_order_relaxed); }

void gemm(DType dtype, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const void* a,
          std::int64_t lda, const void* b, std::int64_t ldb, void* c, std::int64_t ldc) {
  gemm_batched(dtype, trans_a, trans_b, m, n, k, a, lda, 0, b, ldb, 0, c, ldc, 0, 1);
}

void gemm_batched(DType dtype, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                  const void* a, std::int64_t lda, std::int64_t stride_a, const void* b, std::int64_t ldb,
                  std::int64_t stride_b, void* c, std::int64_t ldc, std::int64_t stride_c, std::int64_t batch,
                  bool accumulate) {
  if (m <= 0 || n <= 0 || batch <= 0) return;
  if (k <= 0) {
    if (accumulate) return;
    zero_matrices(m, n, c, ldc, stride_c, batch, itemsize(dtype));
    return;
  }
  if (dtype == DType::Int64) {
    detail::gemm_i64(trans_a, trans_b, m, n, k, static_cast<const std::int64_t*>(a), lda, stride_a,
                     static_cast<const std::int64_t*>(b), ldb, stride_b, static_cast<std::int64_t*>(c), ldc, stride_c,
                     batch, accumulate);
    return;
  }
  const GemmTypes t = gemm_types(dtype);
  const void* beta = accumulate ? t.one : t.zero;
  cublasHandle_t h = handle();
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  // Column-major C^T (n x m) = op(B)^T (n x k) op(A)^T (k x m).
  if (fits_int({m, n, k, lda, ldb, ldc})) {
    const int mi = static_cast<int>(n), ni = static_cast<int>(m), ki = static_cast<int>(k);
    if (batch == 1) {
      check_cublas(cublasGemmEx(h, op_b, op_a, mi, ni, ki, t.one, b, t.data, static_cast<int>(ldb), a, t.data,
                                static_cast<int>(lda), beta, c, t.data, static_cast<int>(ldc), t.compute,
                                CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx");
      return;
    }
    if (batch <= INT_MAX) {
      check_cublas(cublasGemmStridedBatchedEx(h, op_b, op_a, mi, ni, ki, t.one, b, t.data, static_cast<int>(ldb),
                                              stride_b, a, t.data, static_cast<int>(lda), stride_a, beta, c, t.data,
                                              static_cast<int>(ldc), stride_c, static_cast<int>(batch), t.compute,
                                              CUBLAS_GEMM_DEFAULT),
                   "cublasGemmStridedBatchedEx");
      return;
    }
  }
  check_cublas(cublasGemmStridedBatchedEx_64(h, op_b, op_a, n, m, k, t.one, b, t.data, ldb, stride_b, a, t.data, lda,
                                             stride_a, beta, c, t.data, ldc, stride_c, batch, t.compute,
                                             CUBLAS_GEMM_DEFAULT),
               "cublasGemmStridedBatchedEx_64");
}

}  // namespace dtensor::cuda_kernels
