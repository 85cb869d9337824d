// CUDA kernels of the reduction family. Every reduction views its input as
// outputs x reduced elements through coalesced index maps (the reduced dims
// need not be contiguous), and picks one of two shapes of work:
//  - a thread per output, when there are enough outputs to fill the GPU and
//    either the innermost dim is kept (neighbouring threads read
//    neighbouring elements) or each output has only a few elements;
//  - otherwise a block per output (threads stride over the reduced
//    elements, warp shuffles and shared memory combine them); few outputs
//    over many elements split further across blocks and finish in a second
//    pass.
// argmax and softmax choose the same way; normalize takes a block per row. Accumulation is in
// the compute type (f32 for f32, bf16 and f16; f64 for f64; i64 for i64).
#include <cmath>
#include <limits>
#include <vector>

#include "elementwise_common.cuh"
#include "dtensor/core/detail/combine.h"
#include "pointwise_reduction.h"

namespace dtensor::cuda_kernels {
namespace {

using cpu::ReduceKind;
using detail::compute_t;
using detail::load;
using detail::store_as;

constexpr int kMaxDims = 16;
constexpr unsigned kBlock = 256;  // a multiple of the warp size
constexpr unsigned kWarps = kBlock / 32;

template <class C>
__host__ __device__ constexpr C lowest() {
  if constexpr (std::numeric_limits<C>::has_infinity) return -std::numeric_limits<C>::infinity();
  return std::numeric_limits<C>::lowest();
}
template <class C>
__host__ __device__ constexpr C highest() {
  if constexpr (std::numeric_limits<C>::has_infinity) return std::numeric_limits<C>::infinity();
  return std::numeric_limits<C>::max();
}

// NaN-propagating max/min, the CPU reduction's and the collectives' rule.
using combine::max_nan;
using combine::min_nan;

// ---- what a reduction does, from (kind, p) ----------------------------------

enum class Map : int { Identity, NonZero, Abs, Square, PowAbs };
enum class Combine : int { Add, Max, Min };
enum class Finish : int { None, Sqrt, Root };

struct Recipe {
  Map map = Map::Identity;
  Combine combine = Combine::Add;
  Finish finish = Finish::None;
  double p = 2;
  bool mean = false;  // then times 1 / count, before the rounded store
  std::int64_t count = 0;
};

Recipe recipe_of(ReduceKind kind, double p) {
  Recipe r;
  r.p = p;
  switch (kind) {
    case ReduceKind::Sum: break;
    case ReduceKind::Max: r.combine = Combine::Max; break;
    case ReduceKind::Min: r.combine = Combine::Min; break;
    case ReduceKind::Norm:
      if (p == 0) {
        r.map = Map::NonZero;
      } else if (p == 1) {
        r.map = Map::Abs;
      } else if (p == 2) {
        r.map = Map::Square;
        r.finish = Finish::Sqrt;
      } else if (std::isinf(p)) {
        r.map = Map::Abs;  // |x| >= 0, so 0 is the identity of max|x|
        r.combine = p > 0 ? Combine::Max : Combine::Min;
      } else {
        r.map = Map::PowAbs;
        r.finish = Finish::Root;
      }
      break;
  }
  return r;
}

template <class C>
__host__ __device__ C identity_of(const Recipe& r) {
  if (r.combine == Combine::Max) return r.map == Map::Identity ? lowest<C>() : C(0);
  if (r.combine == Combine::Min) return highest<C>();
  return C(0);
}

template <class C>
__device__ __forceinline__ C map_value(const Recipe& r, C x) {
  if constexpr (std::is_floating_point_v<C>) {
    switch (r.map) {
      case Map::Identity: return x;
      case Map::NonZero: return x != C(0) ? C(1) : C(0);
      case Map::Abs: return fabs(x);
      case Map::Square: return x * x;
      case Map::PowAbs: return static_cast<C>(pow(static_cast<double>(fabs(x)), r.p));
    }
  }
  return x;  // integers: plain sum, max and min only (norm is float-only)
}

template <class C>
__device__ __forceinline__ C combine(Combine c, C a, C b) {
  switch (c) {
    case Combine::Add: return a + b;
    case Combine::Max: return max_nan(a, b);
    case Combine::Min: return min_nan(a, b);
  }
  return a;
}

template <class C>
__device__ __forceinline__ C finish(const Recipe& r, C v) {
  if constexpr (std::is_floating_point_v<C>) {
    if (r.finish == Finish::Sqrt) v = sqrt(v);
    if (r.finish == Finish::Root) v = static_cast<C>(pow(static_cast<double>(v), 1.0 / r.p));
    // The CPU mean: sums * (1 / count) in the compute type; sums / 0 when
    // count is 0.
    if (r.mean) v = r.count ? v * (C(1) / static_cast<C>(r.count)) : v / static_cast<C>(r.count);
  }
  return v;
}

// ---- block-wide combines ----------------------------------------------------

// Every thread of the block gets op over all threads' values. The leading
// barrier lets a kernel call it repeatedly with the same scratch.
template <class A, class Op>
__device__ A block_allreduce(A v, Op op, A* scratch) {
  for (int o = 16; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  A total = scratch[0];
  for (unsigned w = 1; w < kWarps; ++w) total = op(total, scratch[w]);
  return total;
}

// ---- index maps ---------------------------------------------------------------

// Offsets of the i-th element of a row-major walk over `n` dims of the given
// sizes and element strides.
struct Walk {
  int n = 0;
  std::int64_t size[kMaxDims] = {};
  std::int64_t stride[kMaxDims] = {};
};

__device__ __forceinline__ std::int64_t walk_offset(const Walk& w, std::int64_t i) {
  std::int64_t off = 0;
  for (int d = w.n - 1; d >= 0; --d) {
    const std::int64_t q = i / w.size[d];
    off += (i - q * w.size[d]) * w.stride[d];
    i = q;
  }
  return off;
}

// outputs x reduced: `kept` walks the outputs in row-major order, `red` the
// reduced elements of one output.
struct ReduceMap {
  Walk kept, red;
  std::int64_t outputs = 1, extent = 1;
};

ReduceMap make_reduce_map(const Shape& shape, std::span<const bool> reduced) {
  // Coalesce: drop size-1 dims, merge neighbours with the same flag.
  std::vector<std::int64_t> sizes;
  std::vector<bool> red;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!sizes.empty() && red.back() == reduced[d])
      sizes.back() *= shape[d];
    else {
      sizes.push_back(shape[d]);
      red.push_back(reduced[d]);
    }
  }
  ReduceMap m;
  std::int64_t stride = 1;
  std::vector<std::int64_t> strides(sizes.size());
  for (std::size_t d = sizes.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= sizes[d];
  }
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    Walk& w = red[d] ? m.red : m.kept;
    if (w.n == kMaxDims)
      throw UnsupportedError(fmt::format("[reduction] {} dims that do not merge; the CUDA kernel takes up to {}",
                                         shape.size(), 2 * kMaxDims));
    w.size[w.n] = sizes[d];
    w.stride[w.n] = strides[d];
    ++w.n;
    (red[d] ? m.extent : m.outputs) *= sizes[d];
  }
  return m;
}

// ---- reduce_dims ---------------------------------------------------------------

// Block per output, `splits` blocks along y sharing one output's elements.
// With splits > 1 each block writes its accumulator to partial[o * splits +
// y]; otherwise the finished value to out[o].
template <class T>
__global__ void reduce_block_kernel(const T* __restrict__ x, ReduceMap m, Recipe r, unsigned splits,
                                    compute_t<T>* __restrict__ partial, T* __restrict__ out) {
  using C = compute_t<T>;
  __shared__ C scratch[kWarps];
  const Combine c = r.combine;
  for (std::int64_t o = blockIdx.x; o < m.outputs; o += gridDim.x) {
    const std::int64_t base = walk_offset(m.kept, o);
    C acc = identity_of<C>(r);
    const std::int64_t step = static_cast<std::int64_t>(blockDim.x) * splits;
    for (std::int64_t i = static_cast<std::int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; i < m.extent; i += step)
      acc = combine(c, acc, map_value(r, load(x, base + walk_offset(m.red, i))));
    acc = block_allreduce(
        acc, [c](C a, C b) { return combine(c, a, b); }, scratch);
    if (threadIdx.x == 0) {
      if (splits > 1)
        partial[o * splits + blockIdx.y] = acc;
      else
        out[o] = store_as<T>(finish(r, acc));
    }
  }
}

template <class T>
__global__ void reduce_partials_kernel(const compute_t<T>* __restrict__ partial, std::int64_t outputs, unsigned splits,
                                       Recipe r, T* __restrict__ out) {
  using C = compute_t<T>;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t o = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < outputs; o += step) {
    C acc = identity_of<C>(r);
    for (unsigned s = 0; s < splits; ++s) acc = combine(r.combine, acc, partial[o * splits + s]);
    out[o] = store_as<T>(finish(r, acc));
  }
}

// Thread per output, each walking its reduced elements in order.
template <class T>
__global__ void reduce_thread_kernel(const T* __restrict__ x, ReduceMap m, Recipe r, T* __restrict__ out) {
  using C = compute_t<T>;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t o = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < m.outputs; o += step) {
    const std::int64_t base = walk_offset(m.kept, o);
    C acc = identity_of<C>(r);
    for (std::int64_t i = 0; i < m.extent; ++i)
      acc = combine(r.combine, acc, map_value(r, load(x, base + walk_offset(m.red, i))));
    out[o] = store_as<T>(finish(r, acc));
  }
}

template <class T>
__global__ void scale_kernel(T* __restrict__ y, std::int64_t n, std::int64_t count) {
  using C = compute_t<T>;
  const C scale = C(1) / static_cast<C>(count);
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const C v = load(y, i);
    y[i] = store_as<T>(count ? v * scale : v / static_cast<C>(count));  // count 0: v / 0, as the CPU
  }
}

// ---- argmax ------------------------------------------------------------------

// The CPU keeps the first element and replaces it by each later one that is
// strictly greater: NaN never wins (unless it comes first), ties go to the
// earlier index. Candidates here skip NaN; an index < 0 is no candidate.
template <class C>
struct Best {
  C value;
  std::int64_t index;
};
template <class C>
__device__ __forceinline__ Best<C> better(Best<C> a, Best<C> b) {
  if (b.index < 0) return a;
  if (a.index < 0) return b;
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}
template <class C>
__device__ __forceinline__ void consider(Best<C>& best, C v, std::int64_t r) {
  if (v == v && (best.index < 0 || v > best.value)) best = {v, r};
}
template <class C>
__device__ __forceinline__ std::int64_t resolve(const Best<C>& best, C first) {
  return first != first || best.index < 0 ? 0 : best.index;
}

template <class T>
__global__ void argmax_block_kernel(const T* __restrict__ x, std::int64_t rows, std::int64_t n,
                                    std::int64_t* __restrict__ out) {
  using C = compute_t<T>;
  __shared__ C values[kWarps];
  __shared__ std::int64_t indices[kWarps];
  for (std::int64_t q = blockIdx.x; q < rows; q += gridDim.x) {
    const T* row = x + q * n;
    Best<C> best{C(0), -1};
    for (std::int64_t r = threadIdx.x; r < n; r += blockDim.x) consider(best, load(row, r), r);
    for (int o = 16; o > 0; o /= 2) {
      const Best<C> other{__shfl_xor_sync(0xffffffffu, best.value, o), __shfl_xor_sync(0xffffffffu, best.index, o)};
      best = better(best, other);
    }
    __syncthreads();
    if (threadIdx.x % 32 == 0) {
      values[threadIdx.x / 32] = best.value;
      indices[threadIdx.x / 32] = best.index;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      Best<C> total{values[0], indices[0]};
      for (unsigned w = 1; w < kWarps; ++w) total = better(total, Best<C>{values[w], indices[w]});
      out[q] = resolve(total, load(row, 0));
    }
  }
}

template <class T>
__global__ void argmax_thread_kernel(const T* __restrict__ x, Around a, std::int64_t* __restrict__ out) {
  using C = compute_t<T>;
  const std::int64_t outputs = a.outer * a.inner;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t o = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < outputs; o += step) {
    const std::int64_t q = o / a.inner, j = o - q * a.inner;
    const T* col = x + q * a.n * a.inner + j;
    Best<C> best{C(0), -1};
    for (std::int64_t r = 0; r < a.n; ++r) consider(best, load(col, r * a.inner), r);
    out[o] = resolve(best, load(col, 0));
  }
}

// ---- softmax -----------------------------------------------------------------

// The CPU's max is std::max(m, v) from -inf: a NaN element never becomes
// the max (it still makes its row NaN through exp).
template <class C>
__device__ __forceinline__ C max_skip_nan(C m, C v) {
  return m < v ? v : m;
}

template <class T>
__global__ void softmax_rows_kernel(const T* __restrict__ x, T* __restrict__ y, std::int64_t rows, std::int64_t n,
                                    bool log_out) {
  using C = compute_t<T>;
  __shared__ C scratch[kWarps];
  for (std::int64_t q = blockIdx.x; q < rows; q += gridDim.x) {
    const T* xr = x + q * n;
    T* yr = y + q * n;
    C m = lowest<C>();
    for (std::int64_t r = threadIdx.x; r < n; r += blockDim.x) m = max_skip_nan(m, load(xr, r));
    m = block_allreduce(
        m, [](C a, C b) { return max_skip_nan(a, b); }, scratch);
    C s = C(0);
    for (std::int64_t r = threadIdx.x; r < n; r += blockDim.x) s += exp(load(xr, r) - m);
    s = block_allreduce(
        s, [](C a, C b) { return a + b; }, scratch);
    if (log_out) {
      const C shift = m + log(s);
      for (std::int64_t r = threadIdx.x; r < n; r += blockDim.x) yr[r] = store_as<T>(load(xr, r) - shift);
    } else {
      const C inv = C(1) / s;
      for (std::int64_t r = threadIdx.x; r < n; r += blockDim.x) yr[r] = store_as<T>(exp(load(xr, r) - m) * inv);
    }
  }
}

template <class T>
__global__ void softmax_columns_kernel(const T* __restrict__ x, T* __restrict__ y, Around a, bool log_out) {
  using C = compute_t<T>;
  const std::int64_t outputs = a.outer * a.inner;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t o = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < outputs; o += step) {
    const std::int64_t q = o / a.inner, j = o - q * a.inner;
    const std::int64_t base = q * a.n * a.inner + j;
    C m = lowest<C>();
    for (std::int64_t r = 0; r < a.n; ++r) m = max_skip_nan(m, load(x, base + r * a.inner));
    C s = C(0);
    for (std::int64_t r = 0; r < a.n; ++r) s += exp(load(x, base + r * a.inner) - m);
    if (log_out) {
      const C shift = m + log(s);
      for (std::int64_t r = 0; r < a.n; ++r) y[base + r * a.inner] = store_as<T>(load(x, base + r * a.inner) - shift);
    } else {
      const C inv = C(1) / s;
      for (std::int64_t r = 0; r < a.n; ++r)
        y[base + r * a.inner] = store_as<T>(exp(load(x, base + r * a.inner) - m) * inv);
    }
  }
}

// ---- layer_norm, rms_norm ---------------------------------------------------------

// Two passes over the row for layer_norm (mean, then the biased variance
// about it), as the CPU computes it; one for rms_norm.
template <class T>
__global__ void normalize_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                 T* __restrict__ y, std::int64_t rows, std::int64_t n, compute_t<T> eps, bool rms) {
  using C = compute_t<T>;
  __shared__ C scratch[kWarps];
  const auto add = [](C u, C v) { return u + v; };
  for (std::int64_t q = blockIdx.x; q < rows; q += gridDim.x) {
    const T* xr = x + q * n;
    T* yr = y + q * n;
    C mean = C(0), inv;
    if (rms) {
      C ss = C(0);
      for (std::int64_t r = threadIdx.x; r < n; r += blockDim.x) {
        const C v = load(xr, r);
        ss += v * v;
      }
      ss = block_allreduce(ss, add, scratch);
      inv = C(1) / sqrt(ss / static_cast<C>(n) + eps);
    } else {
      C s = C(0);
      for (std::int64_t r = threadIdx.x; r < n; r += blockDim.x) s += load(xr, r);
      mean = block_allreduce(s, add, scratch) / static_cast<C>(n);
      C ss = C(0);
      for (std::int64_t r = threadIdx.x; r < n; r += blockDim.x) {
        const C d = load(xr, r) - mean;
        ss += d * d;
      }
      const C var = block_allreduce(ss, add, scratch) / static_cast<C>(n);
      inv = C(1) / sqrt(var + eps);
    }
    for (std::int64_t r = threadIdx.x; r < n; r += blockDim.x) {
      C v = (load(xr, r) - mean) * inv;
      if (w) v *= load(w, r);
      if (b) v += load(b, r);
      yr[r] = store_as<T>(v);
    }
  }
}

}  // namespace

Tensor reduce_dims(const Tensor& x, std::span<const bool> reduced, const Shape& out_shape, ReduceKind kind, double p,
                   std::int64_t mean_count) {
  detail::require_cuda("reduction", {&x});
  Tensor out = Tensor::empty(out_shape, x.dtype(), Device::CUDA);
  const ReduceMap m = make_reduce_map(x.shape(), reduced);
  if (out.numel() == 0) return out;
  Recipe r = recipe_of(kind, p);
  // (norm and mean of an integer tensor are refused once, by the ops' metas.)
  if (mean_count >= 0) {
    r.mean = true;
    r.count = mean_count;
  }
  cudaStream_t stream = cuda::stream();
  // Thread per output when the outputs fill the GPU and either the innermost
  // dim is kept (neighbouring threads read neighbours) or each output has
  // too few elements to keep a block busy; otherwise block per output.
  const bool inner_kept = m.kept.n > 0 && m.kept.stride[m.kept.n - 1] == 1;
  const bool per_thread = m.outputs >= 4096 && (inner_kept || m.extent <= 64);
  // Few outputs over many elements: split each over several blocks.
  unsigned splits = 1;
  if (!per_thread && m.outputs < 512 && m.extent >= 16 * kBlock) {
    const std::int64_t want = std::min<std::int64_t>(1024 / m.outputs, m.extent / (16 * kBlock));
    splits = static_cast<unsigned>(std::max<std::int64_t>(want, 1));
  }
  detail::visit_device_dtype(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    const auto* px = static_cast<const T*>(x.data());
    auto* po = static_cast<T*>(out.data());
    if (per_thread) {
      reduce_thread_kernel<T><<<cuda::grid_for(m.outputs, kBlock), kBlock, 0, stream>>>(px, m, r, po);
    } else if (splits == 1) {
      reduce_block_kernel<T><<<dim3(cuda::blocks_for(m.outputs), 1), kBlock, 0, stream>>>(px, m, r, 1, nullptr, po);
    } else {
      const DType acc_dtype = std::is_same_v<C, float>    ? DType::Float32
                              : std::is_same_v<C, double> ? DType::Float64
                                                          : DType::Int64;
      Tensor partial = Tensor::empty({m.outputs * static_cast<std::int64_t>(splits)}, acc_dtype, Device::CUDA);
      auto* pp = static_cast<C*>(partial.data());
      reduce_block_kernel<T>
          <<<dim3(static_cast<unsigned>(m.outputs), splits), kBlock, 0, stream>>>(px, m, r, splits, pp, po);
      detail::check_launch();
      reduce_partials_kernel<T><<<cuda::grid_for(m.outputs, kBlock), kBlock, 0, stream>>>(pp, m.outputs, splits, r, po);
      // `partial` goes back to the stream's pool here; later work on this
      // stream runs after the kernel that reads it.
    }
  });
  detail::check_launch();
  return out;
}

void scale_by_count(Tensor& sums, std::int64_t count) {
  detail::require_cuda("mean", {&sums});
  const std::int64_t n = sums.numel();
  if (n == 0) return;
  detail::visit_device_dtype(sums.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_integral_v<T>)
      throw Error(fmt::format("[mean] internal: a {} tensor reached a floating-only kernel (the op's meta refuses it)",
                              sums.dtype()));
    else
      scale_kernel<T><<<cuda::grid_for(n, kBlock), kBlock, 0, cuda::stream()>>>(static_cast<T*>(sums.data()), n, count);
  });
  detail::check_launch();
}

Tensor argmax(const Tensor& x, int dim, const Shape& out_shape) {
  detail::require_cuda("argmax", {&x});
  Tensor out = Tensor::empty(out_shape, DType::Int64, Device::CUDA);
  const Around a = dim < 0 ? Around{1, x.numel(), 1} : around(x.shape(), dim);
  const std::int64_t outputs = a.outer * a.inner;
  if (outputs == 0 || a.n == 0) return out;  // the meta function rejects an empty extent
  auto* po = static_cast<std::int64_t*>(out.data());
  detail::visit_device_dtype(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* px = static_cast<const T*>(x.data());
    if (a.inner == 1 && (a.n > 64 || a.outer < 4096))
      argmax_block_kernel<T><<<cuda::blocks_for(a.outer), kBlock, 0, cuda::stream()>>>(px, a.outer, a.n, po);
    else
      argmax_thread_kernel<T><<<cuda::grid_for(outputs, kBlock), kBlock, 0, cuda::stream()>>>(px, a, po);
  });
  detail::check_launch();
  return out;
}

Tensor softmax(const Tensor& x, int dim, bool log) {
  detail::require_cuda("softmax", {&x});
  Tensor out = Tensor::empty(x.shape(), x.dtype(), Device::CUDA);
  const Around a = around(x.shape(), dim);
  if (x.numel() == 0) return out;
  detail::visit_device_dtype(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_integral_v<T>) {
      throw Error(
          fmt::format("[softmax] internal: a {} tensor reached a floating-only kernel (the op's meta refuses it)",
                      x.dtype()));
    } else {
      const auto* px = static_cast<const T*>(x.data());
      auto* py = static_cast<T*>(out.data());
      if (a.inner == 1 && (a.n > 64 || a.outer < 4096))
        softmax_rows_kernel<T><<<cuda::blocks_for(a.outer), kBlock, 0, cuda::stream()>>>(px, py, a.outer, a.n, log);
      else
        softmax_columns_kernel<T>
            <<<cuda::grid_for(a.outer * a.inner, kBlock), kBlock, 0, cuda::stream()>>>(px, py, a, log);
    }
  });
  detail::check_launch();
  return out;
}

Tensor normalize(const Tensor& x, int normalized_ndim, const Tensor& weight, const Tensor& bias, double eps, bool rms) {
  detail::require_cuda("normalize", {&x, &weight, &bias});
  Tensor out = Tensor::empty(x.shape(), x.dtype(), Device::CUDA);
  std::int64_t n = 1;
  for (int d = x.dim() - normalized_ndim; d < x.dim(); ++d) n *= x.shape()[d];
  const std::int64_t rows = n ? x.numel() / n : 0;
  if (rows == 0) return out;
  detail::visit_device_dtype(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    if constexpr (std::is_integral_v<T>) {
      throw Error(
          fmt::format("[normalize] internal: a {} tensor reached a floating-only kernel (the op's meta refuses it)",
                      x.dtype()));
    } else {
      const T* w = weight.defined() ? static_cast<const T*>(weight.data()) : nullptr;
      const T* b = bias.defined() && !rms ? static_cast<const T*>(bias.data()) : nullptr;
      normalize_kernel<T><<<cuda::blocks_for(rows), kBlock, 0, cuda::stream()>>>(static_cast<const T*>(x.data()), w, b,
                                                                            static_cast<T*>(out.data()), rows, n,
                                                                            static_cast<C>(eps), rms);
    }
  });
  detail::check_launch();
  return out;
}

}  // namespace dtensor::cuda_kernels
