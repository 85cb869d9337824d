#pragma once
// Internal: layer norm's and rms norm's backward on one row, as plain loops:
// the formula once, for f64 (backward_kernels.cpp) and for f32 where the
// build has no Highway (vector_math_fallback.cpp). vector_math.cpp's f32
// kernels do the same sums in vector lanes.
#include <cmath>
#include <cstdint>
#include <utility>

namespace dtensor::cpu::norm_rows {

/// The mean (0 for rms) and 1/sqrt(var + eps) of one row of `cols`.
template <class T>
std::pair<T, T> stats(const T* x, std::int64_t cols, double eps, bool rms) {
  T mean{};
  if (!rms) {
    for (std::int64_t c = 0; c < cols; ++c) mean += x[c];
    mean /= static_cast<T>(cols);
  }
  T var{};
  for (std::int64_t c = 0; c < cols; ++c) var += (x[c] - mean) * (x[c] - mean);
  var /= static_cast<T>(cols);
  return {mean, T(1) / std::sqrt(var + static_cast<T>(eps))};
}

/// out = dL/dx of one row, g the gradient of the normalised output times
/// the weight w (null: none).
template <class T>
void backward(const T* x, const T* g, const T* w, T* out, std::int64_t cols, double eps, bool rms) {
  const auto [mean, rstd] = stats(x, cols, eps, rms);
  T sum_g{}, sum_gx{};
  for (std::int64_t c = 0; c < cols; ++c) {
    const T gc = w ? g[c] * w[c] : g[c];
    sum_g += gc;
    sum_gx += gc * (x[c] - mean) * rstd;
  }
  const T mean_g = rms ? T(0) : sum_g / static_cast<T>(cols);
  const T mean_gx = sum_gx / static_cast<T>(cols);
  for (std::int64_t c = 0; c < cols; ++c) {
    const T gc = w ? g[c] * w[c] : g[c];
    out[c] = rstd * (gc - mean_g - (x[c] - mean) * rstd * mean_gx);
  }
}

/// wg += g * xhat for one row: its term of the weight's gradient.
template <class T>
void weight_backward(const T* x, const T* g, T* wg, std::int64_t cols, double eps, bool rms) {
  const auto [mean, rstd] = stats(x, cols, eps, rms);
  for (std::int64_t c = 0; c < cols; ++c) wg[c] += g[c] * (x[c] - mean) * rstd;
}

}  // namespace dtensor::cpu::norm_rows
