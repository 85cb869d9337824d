#include "reduction_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <Eigen/Core>

#include "dtensor/core/detail/strided_copy.h"
#include "dtensor/core/detail/combine.h"
#include "dtensor/ops/detail/vector_math.h"

namespace dtensor::cpu {
namespace {

template <class T>
using ArrayMap = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

template <class T>
T lowest() {
  if constexpr (std::numeric_limits<T>::has_infinity) return -std::numeric_limits<T>::infinity();
  return std::numeric_limits<T>::lowest();
}
template <class T>
T highest() {
  if constexpr (std::numeric_limits<T>::has_infinity) return std::numeric_limits<T>::infinity();
  return std::numeric_limits<T>::max();
}

// max/min that propagate NaN, as PyTorch does (std::max drops a NaN second
// argument): the rule every reduction and collective shares.
using combine::max_nan;
using combine::min_nan;

// What a Norm accumulates, from p: a sum of |x|^p (with special cases) or a
// max/min of |x|.
enum class NormMode { Count, Abs, Square, Pow, MaxAbs, MinAbs };
NormMode norm_mode(double p) {
  if (p == 0) return NormMode::Count;
  if (p == 1) return NormMode::Abs;
  if (p == 2) return NormMode::Square;
  if (std::isinf(p)) return p > 0 ? NormMode::MaxAbs : NormMode::MinAbs;
  return NormMode::Pow;
}

// Reduces a contiguous run of n elements into acc.
template <class T>
T reduce_run(const T* x, std::int64_t n, T acc, ReduceKind kind, NormMode mode, double p) {
  if (n == 0) return acc;
  ArrayMap<T> a(x, n);
  switch (kind) {
    case ReduceKind::Sum: return acc + a.sum();
    case ReduceKind::Max: return max_nan(acc, a.template maxCoeff<Eigen::PropagateNaN>());
    case ReduceKind::Min: return min_nan(acc, a.template minCoeff<Eigen::PropagateNaN>());
    case ReduceKind::Norm:
      switch (mode) {
        case NormMode::Count: return acc + static_cast<T>((a != T(0)).count());
        case NormMode::Abs: return acc + a.abs().sum();
        case NormMode::Square: return acc + a.abs2().sum();
        case NormMode::Pow: return acc + a.abs().pow(static_cast<T>(p)).sum();
        case NormMode::MaxAbs: return max_nan(acc, a.abs().template maxCoeff<Eigen::PropagateNaN>());
        case NormMode::MinAbs: return min_nan(acc, a.abs().template minCoeff<Eigen::PropagateNaN>());
      }
  }
  return acc;
}

// Combines a contiguous run of n elements elementwise into acc[0..n).
template <class T>
void combine_run(const T* x, std::int64_t n, T* acc, ReduceKind kind, NormMode mode, double p) {
  switch (kind) {
    case ReduceKind::Sum:
      for (std::int64_t j = 0; j < n; ++j) acc[j] += x[j];
      return;
    case ReduceKind::Max:
      for (std::int64_t j = 0; j < n; ++j) acc[j] = max_nan(acc[j], x[j]);
      return;
    case ReduceKind::Min:
      for (std::int64_t j = 0; j < n; ++j) acc[j] = min_nan(acc[j], x[j]);
      return;
    case ReduceKind::Norm:
      for (std::int64_t j = 0; j < n; ++j) {
        const T v = x[j] < T(0) ? -x[j] : x[j];
        switch (mode) {
          case NormMode::Count: acc[j] += v != T(0) ? T(1) : T(0); break;
          case NormMode::Abs: acc[j] += v; break;
          case NormMode::Square: acc[j] += v * v; break;
          case NormMode::Pow: acc[j] += static_cast<T>(std::pow(static_cast<double>(v), p)); break;
          case NormMode::MaxAbs: acc[j] = max_nan(acc[j], v); break;
          case NormMode::MinAbs: acc[j] = min_nan(acc[j], v); break;
        }
      }
      return;
  }
}

template <class T>
void reduce_typed(const Tensor& x, std::span<const bool> reduced, Tensor& out, ReduceKind kind, double p) {
  const NormMode mode = norm_mode(p);
  // Identities: an empty local extent (an empty shard) must not change a
  // Partial(max|min|sum) combine. |x| >= 0, so 0 is the identity of MaxAbs.
  T identity = T(0);
  if (kind == ReduceKind::Max) identity = lowest<T>();
  if (kind == ReduceKind::Min || (kind == ReduceKind::Norm && mode == NormMode::MinAbs)) identity = highest<T>();
  T* o = out.data_as<T>();
  std::fill(o, o + out.numel(), identity);

  // Coalesce: drop size-1 dims, merge neighbours that are both reduced or
  // both kept. The innermost run is then either one reduction or one
  // elementwise combine, both contiguous.
  std::vector<std::int64_t> sizes;
  std::vector<bool> red;
  for (int d = 0; d < x.dim(); ++d) {
    const std::int64_t s = x.shape()[d];
    if (s == 1) continue;
    if (!sizes.empty() && red.back() == reduced[d])
      sizes.back() *= s;
    else {
      sizes.push_back(s);
      red.push_back(reduced[d]);
    }
  }
  if (sizes.empty()) {
    sizes.push_back(1);
    red.push_back(false);
  }
  if (x.numel() > 0) {
    const int k = static_cast<int>(sizes.size());
    std::vector<std::int64_t> ostride(k, 0);
    std::int64_t st = 1;
    for (int d = k - 1; d >= 0; --d)
      if (!red[d]) {
        ostride[d] = st;
        st *= sizes[d];
      }
    const std::int64_t n = sizes[k - 1];
    const std::int64_t outer = x.numel() / n;
    std::vector<std::int64_t> idx(k, 0);
    const T* xp = x.data_as<T>();
    std::int64_t out_off = 0;
    for (std::int64_t it = 0; it < outer; ++it, xp += n) {
      if (red[k - 1])
        o[out_off] = reduce_run(xp, n, o[out_off], kind, mode, p);
      else
        combine_run(xp, n, o + out_off, kind, mode, p);
      for (int d = k - 2; d >= 0; --d) {
        out_off += ostride[d];
        if (++idx[d] < sizes[d]) break;
        out_off -= ostride[d] * sizes[d];
        idx[d] = 0;
      }
    }
  }
  if (kind == ReduceKind::Norm && (mode == NormMode::Square || mode == NormMode::Pow)) {
    for (std::int64_t i = 0; i < out.numel(); ++i)
      o[i] = mode == NormMode::Square ? std::sqrt(o[i]) : static_cast<T>(std::pow(static_cast<double>(o[i]), 1.0 / p));
  }
}

// Softmax (or log_softmax) of one contiguous row. A NaN or +inf anywhere
// makes the whole row NaN, whichever way the max treats it (exp(NaN - m) or
// exp(inf - inf) is NaN and so is the sum), as in the strided loop.
template <class T>
void softmax_row(const T* x, T* y, std::int64_t n, bool log) {
  T m = lowest<T>();
  if (n > 0) m = max_nan(m, ArrayMap<T>(x, n).maxCoeff());
  const T sum = vmath::exp_sub_sum(x, m, y, n);
  if (log) {
    const T shift = m + std::log(sum);
    for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] - shift;
  } else {
    const T inv = T(1) / sum;
    for (std::int64_t i = 0; i < n; ++i) y[i] *= inv;
  }
}

}  // namespace

Tensor reduce_dims(const Tensor& x, std::span<const bool> reduced, const Shape& out_shape, ReduceKind kind, double p) {
  Tensor out = Tensor::empty(out_shape, x.dtype());
  visit_dtype(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    reduce_typed<T>(x, reduced, out, kind, p);
  });
  return out;
}

Tensor argmax(const Tensor& x, int dim, const Shape& out_shape) {
  Tensor out = Tensor::empty(out_shape, DType::Int64);
  const Around a = dim < 0 ? Around{1, x.numel(), 1} : around(x.shape(), dim);
  std::int64_t* o = out.data_as<std::int64_t>();
  visit_dtype(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* xp = x.data_as<T>();
    std::vector<T> best(static_cast<std::size_t>(a.inner));
    for (std::int64_t q = 0; q < a.outer; ++q) {
      const T* base = xp + q * a.n * a.inner;
      std::int64_t* oi = o + q * a.inner;
      std::copy(base, base + a.inner, best.begin());
      std::fill(oi, oi + a.inner, 0);
      for (std::int64_t r = 1; r < a.n; ++r) {
        const T* row = base + r * a.inner;
        for (std::int64_t j = 0; j < a.inner; ++j)
          if (row[j] > best[j]) {
            best[j] = row[j];
            oi[j] = r;
          }
      }
    }
  });
  return out;
}

Tensor softmax(const Tensor& x, int dim, bool log) {
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  const Around a = around(x.shape(), dim);
  visit_dtype(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      const T* xp = x.data_as<T>();
      T* yp = out.data_as<T>();
      // Every slice is softmaxed as one contiguous row, whatever its stride:
      // a plane [n, inner] is transposed to [inner, n] first and back after.
      // The row's sum is added in SIMD lanes, so one summation order for all
      // strides keeps a sharded softmax bit-equal to the unsharded one, where
      // sharding a dim after `dim` turns inner > 1 into inner == 1.
      std::vector<T> rows(a.inner == 1 ? 0 : static_cast<std::size_t>(a.n * a.inner)), out_rows(rows.size());
      const std::int64_t plane[] = {a.n, a.inner};
      const std::int64_t by_row[] = {a.inner, 1}, by_column[] = {1, a.n};
      const auto bytes = [](const T* p) { return reinterpret_cast<const std::byte*>(p); };
      const auto bytes_out = [](T* p) { return reinterpret_cast<std::byte*>(p); };
      for (std::int64_t q = 0; q < a.outer; ++q) {
        const T* base = xp + q * a.n * a.inner;
        T* ybase = yp + q * a.n * a.inner;
        if (a.inner == 1) {
          softmax_row(base, ybase, a.n, log);
          continue;
        }
        cpu::copy_strided(bytes(base), by_row, bytes_out(rows.data()), by_column, plane, sizeof(T));
        for (std::int64_t j = 0; j < a.inner; ++j)
          softmax_row(rows.data() + j * a.n, out_rows.data() + j * a.n, a.n, log);
        cpu::copy_strided(bytes(out_rows.data()), by_column, bytes_out(ybase), by_row, plane, sizeof(T));
      }
    }
  });
  return out;
}

Tensor normalize(const Tensor& x, int normalized_ndim, const Tensor& weight, const Tensor& bias, double eps, bool rms) {
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  std::int64_t n = 1;
  for (int d = x.dim() - normalized_ndim; d < x.dim(); ++d) n *= x.shape()[d];
  const std::int64_t rows = n ? x.numel() / n : 0;
  visit_dtype(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      using Vec = Eigen::Array<T, Eigen::Dynamic, 1>;
      const T* w = weight.defined() ? weight.data_as<T>() : nullptr;
      const T* b = bias.defined() && !rms ? bias.data_as<T>() : nullptr;
      for (std::int64_t r = 0; r < rows; ++r) {
        ArrayMap<T> xr(x.data_as<T>() + r * n, n);
        Eigen::Map<Vec> yr(out.data_as<T>() + r * n, n);
        if (rms) {
          const T inv = T(1) / std::sqrt(xr.abs2().mean() + static_cast<T>(eps));
          yr = xr * inv;
        } else {
          const T mean = xr.mean();
          const T var = (xr - mean).abs2().mean();
          yr = (xr - mean) * (T(1) / std::sqrt(var + static_cast<T>(eps)));
        }
        if (w) yr *= ArrayMap<T>(w, n);
        if (b) yr += ArrayMap<T>(b, n);
      }
    }
  });
  return out;
}

}  // namespace dtensor::cpu
