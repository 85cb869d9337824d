#pragma once
// Internal: the two functions of oneDNN's C API that the library (and
// bench/gemm's child, which does not link the library) open with dlsym,
// declared here so that no oneDNN header is needed to build.
#include <cstdint>

namespace dtensor::cpu::onednn_abi {

/// dnnl_sgemm: row-major, 'N' or 'T', 64-bit sizes; returns a status (0: success).
using SgemmFn = int (*)(char transa, char transb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                        const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                        std::int64_t ldc);

/// What dnnl_version returns a pointer to.
struct Version {
  int major, minor, patch;
  const char* hash;
  unsigned cpu_runtime, gpu_runtime;
};
using VersionFn = const Version* (*)();

}  // namespace dtensor::cpu::onednn_abi
