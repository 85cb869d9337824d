// The device loops that Tensor itself needs: box copies (the redistribution
// executor packs and unpacks through them), fill, arange, dtype casts,
// seeded random values and the elementwise reduction the communicators use.
// All run on the calling thread's stream.
#include <Random123/philox.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "dtensor/core/detail/cuda_check.h"
#include "dtensor/core/error.h"
#include "dtensor/core/half.h"
#include "dtensor/core/detail/combine.h"

namespace dtensor::cuda {
namespace {

constexpr int kMaxBoxDims = 8;

// Device-side value conversions: halves through float with the host's own
// rounding code (half.h), so the CPU and the GPU round identically.
template <class D, class S>
__device__ D convert(S v) {
  if constexpr (std::is_same_v<S, bfloat16> || std::is_same_v<S, float16>) {
    return convert<D>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<D, bfloat16> || std::is_same_v<D, float16>) {
    return D(static_cast<float>(v));
  } else {
    return static_cast<D>(v);
  }
}

template <class Fn>
void with_type(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::Float32: fn(float{}); return;
    case DType::Float64: fn(double{}); return;
    case DType::Int64: fn(std::int64_t{}); return;
    case DType::BFloat16: fn(bfloat16{}); return;
    case DType::Float16: fn(float16{}); return;
  }
  throw DTypeError(fmt::format("[cuda] unknown dtype code {}", static_cast<int>(dtype)));
}

void check_launch(const char* what) { check(cudaGetLastError(), what); }

// ---- Box copies -------------------------------------------------------------

struct BoxCopy {
  int nd;
  std::int64_t size[kMaxBoxDims];
  std::int64_t src_stride[kMaxBoxDims];
  std::int64_t dst_stride[kMaxBoxDims];
  std::int64_t src_base, dst_base, total;
};

template <class Word>
__global__ void copy_box_kernel(const Word* __restrict__ src, Word* __restrict__ dst, BoxCopy c) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < c.total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t rest = i, so = c.src_base, dof = c.dst_base;
    for (int d = c.nd - 1; d >= 0; --d) {
      const std::int64_t k = rest % c.size[d];
      rest /= c.size[d];
      so += k * c.src_stride[d];
      dof += k * c.dst_stride[d];
    }
    dst[dof] = src[so];
  }
}

template <class Word>
void launch_copy_box(const std::byte* src, std::byte* dst, const BoxCopy& c) {
  copy_box_kernel<Word>
      <<<grid_for(c.total), 256, 0, stream()>>>(reinterpret_cast<const Word*>(src), reinterpret_cast<Word*>(dst), c);
  check_launch("copy_box kernel");
}

// ---- Elementwise --------------------------------------------------------------

template <class T>
__global__ void fill_kernel(T* p, std::int64_t n, T v) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    p[i] = v;
}

template <class T>
__global__ void arange_kernel(T* p, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    p[i] = convert<T>(i);
}

template <class S, class D>
__global__ void cast_kernel(const S* __restrict__ s, D* __restrict__ d, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    d[i] = convert<D>(s[i]);
}

template <class T>
__global__ void reduce_kernel(T* __restrict__ acc, const T* __restrict__ x, std::int64_t n, ReduceOp op) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>)
      acc[i] = T(combine::apply(op, static_cast<float>(acc[i]), static_cast<float>(x[i])));
    else
      acc[i] = combine::apply(op, acc[i], x[i]);
  }
}

// A fold's sources, passed by value: own, then up to kFoldSources - 1 peers.
constexpr int kFoldSources = 8;
template <class T>
struct FoldSources {
  const T* p[kFoldSources];
  int n;
};

// acc = src[0] op src[1] op ... op src[N-1] in order, rounded to T after
// every step as reduce_kernel's chain would be, so the bits equal a copy and
// N-1 reduce_into calls. N is a template argument so that the sources stay in
// registers (a runtime index into the parameter array went through local
// memory and ran slower than the unfused chain). acc may alias a source at
// the same index (no restrict).
template <class T, int N>
__global__ void fold_kernel(T* acc, FoldSources<T> src, std::int64_t n, ReduceOp op) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    T x[N];
#pragma unroll
    for (int j = 0; j < N; ++j) x[j] = src.p[j][i];
    T a = x[0];
#pragma unroll
    for (int j = 1; j < N; ++j) {
      if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>)
        a = T(combine::apply(op, static_cast<float>(a), static_cast<float>(x[j])));
      else
        a = combine::apply(op, a, x[j]);
    }
    acc[i] = a;
  }
}

template <class T, int N = kFoldSources>
void launch_fold(T* acc, const FoldSources<T>& src, std::int64_t n, ReduceOp op) {
  if constexpr (N > 1) {
    if (src.n < N) return launch_fold<T, N - 1>(acc, src, n, op);
  }
  fold_kernel<T, N><<<grid_for(n), 256, 0, stream()>>>(acc, src, n, op);
}

__global__ void average_split_kernel(const std::int64_t* __restrict__ x, std::int64_t* __restrict__ pairs,
                                     std::int64_t count, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    combine::average_split(x[i], n, pairs + 2 * i);
}

__global__ void average_finish_kernel(const std::int64_t* __restrict__ pairs, std::int64_t* __restrict__ out,
                                      std::int64_t count, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    out[i] = combine::average_finish(pairs + 2 * i, n);
}

// f32 and f64 key their own bits; bf16 and f16 key the bits of their float.
template <class T>
__device__ auto key_bits(T v) {
  if constexpr (std::is_same_v<T, double>) {
    return static_cast<std::uint64_t>(__double_as_longlong(v));
  } else {
    return static_cast<std::uint32_t>(__float_as_uint(static_cast<float>(v)));
  }
}

template <class T, class Key>
__global__ void order_keys_kernel(const T* __restrict__ x, Key* __restrict__ keys, std::int64_t n, ReduceOp op) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    keys[i] = combine::order_key(key_bits(x[i]), op);
}

template <class T, class Key>
__global__ void from_order_keys_kernel(const Key* __restrict__ keys, T* __restrict__ out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const auto bits = combine::from_order_key(keys[i]);
    if constexpr (std::is_same_v<T, double>)
      out[i] = __longlong_as_double(static_cast<long long>(bits));
    else
      out[i] = T(__uint_as_float(bits));
  }
}

template <class T>
__global__ void divide_kernel(T* acc, std::int64_t n, std::int64_t divisor) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>)
      acc[i] = T(static_cast<float>(acc[i]) / static_cast<float>(divisor));
    else
      acc[i] /= static_cast<T>(divisor);
  }
}

// ---- Random -----------------------------------------------------------------

struct RandomBox {
  int nd;
  std::int64_t size[kMaxBoxDims];
  std::int64_t global_stride[kMaxBoxDims];
  std::int64_t offset[kMaxBoxDims];
  std::int64_t total;
  std::uint32_t key0, key1;
};

// The host's counters and formulas (tensor.cpp fill_random/fill_randn):
// element g of the global row-major order uses counter (g lo, g hi, 0|1, 0).
template <class T>
__global__ void random_kernel(T* out, RandomBox b, bool normal) {
  r123::Philox4x32 rng;
  const r123::Philox4x32::key_type key = {{b.key0, b.key1}};
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < b.total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t rest = i, g = 0;
    for (int d = b.nd - 1; d >= 0; --d) {
      g += (rest % b.size[d] + b.offset[d]) * b.global_stride[d];
      rest /= b.size[d];
    }
    const std::uint64_t gu = static_cast<std::uint64_t>(g);
    const r123::Philox4x32::ctr_type ctr = {
        {static_cast<std::uint32_t>(gu), static_cast<std::uint32_t>(gu >> 32), normal ? 1u : 0u, 0u}};
    const auto r = rng(ctr, key);
    if (normal) {
      const std::uint64_t b1 = (static_cast<std::uint64_t>(r.v[0]) << 32 | r.v[1]) >> 11;
      const std::uint64_t b2 = (static_cast<std::uint64_t>(r.v[2]) << 32 | r.v[3]) >> 11;
      const double u1 = (static_cast<double>(b1) + 1.0) * (1.0 / 9007199254740992.0);
      const double u2 = static_cast<double>(b2) * (1.0 / 9007199254740992.0);
      const double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925286766559 * u2);
      out[i] = convert<T>(std::is_same_v<T, double> ? z : static_cast<double>(static_cast<float>(z)));
    } else if constexpr (std::is_same_v<T, double>) {
      const std::uint64_t bits = (static_cast<std::uint64_t>(r.v[0]) << 32 | r.v[1]) >> 11;
      out[i] = static_cast<double>(bits) * (1.0 / 9007199254740992.0);
    } else if constexpr (std::is_same_v<T, std::int64_t>) {
      out[i] = static_cast<std::int64_t>(r.v[0] % 2000) - 1000;
    } else {
      out[i] = convert<T>(static_cast<float>(r.v[0] >> 8) * (1.0f / 16777216.0f));
    }
  }
}

}  // namespace

void copy_box(const std::byte* src, std::span<const std::int64_t> src_shape, std::span<const std::int64_t> src_offset,
              std::byte* dst, std::span<const std::int64_t> dst_shape, std::span<const std::int64_t> dst_offset,
              std::span<const std::int64_t> size, std::size_t itemsize) {
  const int nd = static_cast<int>(size.size());
  std::int64_t total = 1;
  for (auto s : size) total *= s;
  if (total == 0) return;
  // Strides in elements, then merge trailing dims that are whole in both
  // arrays (as the host loop does) so that most boxes become a few long rows.
  std::vector<std::int64_t> ss(nd), ds(nd);
  for (std::int64_t d = nd - 1, a = 1, b = 1; d >= 0; --d) {
    ss[d] = a;
    ds[d] = b;
    a *= src_shape[d];
    b *= dst_shape[d];
  }
  std::int64_t src_base = 0, dst_base = 0;
  for (int d = 0; d < nd; ++d) {
    src_base += src_offset[d] * ss[d];
    dst_base += dst_offset[d] * ds[d];
  }
  std::vector<std::int64_t> csize, css, cds;
  for (int d = 0; d < nd; ++d) {
    if (size[d] == 1) continue;
    if (!csize.empty() && css.back() == size[d] * ss[d] && cds.back() == size[d] * ds[d]) {
      csize.back() *= size[d];
      css.back() = ss[d];
      cds.back() = ds[d];
      continue;
    }
    csize.push_back(size[d]);
    css.push_back(ss[d]);
    cds.push_back(ds[d]);
  }
  const std::size_t is = itemsize;
  const std::byte* s = src + src_base * is;
  std::byte* t = dst + dst_base * is;
  if (csize.empty() || (csize.size() == 1 && css[0] == 1 && cds[0] == 1)) {
    DTENSOR_CUDA_CHECK(cudaMemcpyAsync(t, s, total * is, cudaMemcpyDeviceToDevice, stream()));
    return;
  }
  if (csize.size() == 2 && css[1] == 1 && cds[1] == 1) {
    DTENSOR_CUDA_CHECK(
        cudaMemcpy2DAsync(t, cds[0] * is, s, css[0] * is, csize[1] * is, csize[0], cudaMemcpyDeviceToDevice, stream()));
    return;
  }
  if (static_cast<int>(csize.size()) > kMaxBoxDims)
    throw ShapeError(
        fmt::format("[cuda] copy_box: {} non-mergeable dims; at most {} are supported", csize.size(), kMaxBoxDims));
  BoxCopy c{};
  c.nd = static_cast<int>(csize.size());
  for (int d = 0; d < c.nd; ++d) {
    c.size[d] = csize[d];
    c.src_stride[d] = css[d];
    c.dst_stride[d] = cds[d];
  }
  c.src_base = 0;
  c.dst_base = 0;
  c.total = total;
  switch (is) {
    case 2: launch_copy_box<std::uint16_t>(s, t, c); break;
    case 4: launch_copy_box<std::uint32_t>(s, t, c); break;
    case 8: launch_copy_box<std::uint64_t>(s, t, c); break;
    default: throw ValueError(fmt::format("[cuda] copy_box: itemsize {} is not 2, 4 or 8", is));
  }
}

void fill(void* data, std::int64_t count, DType dtype, double value) {
  if (count == 0) return;
  with_type(dtype, [&](auto zero) {
    using T = decltype(zero);
    T v;
    if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>)
      v = T(static_cast<float>(value));
    else
      v = static_cast<T>(value);
    fill_kernel<T><<<grid_for(count), 256, 0, stream()>>>(static_cast<T*>(data), count, v);
  });
  check_launch("fill kernel");
}

void arange(void* data, std::int64_t count, DType dtype) {
  if (count == 0) return;
  with_type(dtype, [&](auto zero) {
    using T = decltype(zero);
    arange_kernel<T><<<grid_for(count), 256, 0, stream()>>>(static_cast<T*>(data), count);
  });
  check_launch("arange kernel");
}

void cast(const void* src, DType from, void* dst, DType to, std::int64_t count) {
  if (count == 0) return;
  with_type(from, [&](auto s0) {
    using S = decltype(s0);
    with_type(to, [&](auto d0) {
      using D = decltype(d0);
      cast_kernel<S, D><<<grid_for(count), 256, 0, stream()>>>(static_cast<const S*>(src), static_cast<D*>(dst), count);
    });
  });
  check_launch("cast kernel");
}

void fill_random(void* data, DType dtype, std::uint64_t seed, std::span<const std::int64_t> global_shape,
                 std::span<const std::int64_t> offset, std::span<const std::int64_t> size, bool normal) {
  const int nd = static_cast<int>(size.size());
  if (nd > kMaxBoxDims)
    throw ShapeError(fmt::format("[cuda] fill_random: {} dims; at most {} are supported", nd, kMaxBoxDims));
  if (normal && dtype == DType::Int64) throw DTypeError("[tensor] randn: normal values need a floating dtype, got i64");
  RandomBox b{};
  b.nd = nd;
  b.total = 1;
  for (std::int64_t d = nd - 1, stride = 1; d >= 0; --d) {
    b.size[d] = size[d];
    b.offset[d] = offset[d];
    b.global_stride[d] = stride;
    stride *= global_shape[d];
    b.total *= size[d];
  }
  if (b.total == 0) return;
  b.key0 = static_cast<std::uint32_t>(seed);
  b.key1 = static_cast<std::uint32_t>(seed >> 32);
  with_type(dtype, [&](auto zero) {
    using T = decltype(zero);
    random_kernel<T><<<grid_for(b.total), 256, 0, stream()>>>(static_cast<T*>(data), b, normal);
  });
  check_launch("random kernel");
}

void reduce_into(void* acc, const void* x, std::size_t count, DType dtype, ReduceOp op) {
  if (count == 0) return;
  with_type(dtype, [&](auto zero) {
    using T = decltype(zero);
    reduce_kernel<T><<<grid_for(count), 256, 0, stream()>>>(static_cast<T*>(acc), static_cast<const T*>(x),
                                                            static_cast<std::int64_t>(count), op);
  });
  check_launch("reduce kernel");
}

void fold_into(void* acc, const void* own, std::span<const void* const> peers, std::size_t count, DType dtype,
               ReduceOp op) {
  if (count == 0) return;
  with_type(dtype, [&](auto zero) {
    using T = decltype(zero);
    // The first launch starts from own; each further one from acc, taking
    // kFoldSources - 1 more peers, in the same order.
    std::size_t next = 0;
    const T* first = static_cast<const T*>(own);
    do {
      FoldSources<T> src{};
      src.p[0] = first;
      src.n = 1;
      while (src.n < kFoldSources && next < peers.size()) src.p[src.n++] = static_cast<const T*>(peers[next++]);
      launch_fold<T>(static_cast<T*>(acc), src, static_cast<std::int64_t>(count), op);
      check_launch("fold kernel");
      first = static_cast<const T*>(acc);
    } while (next < peers.size());
  });
}

void average_split(const std::int64_t* x, std::int64_t* pairs, std::size_t count, std::int64_t n) {
  if (count == 0) return;
  average_split_kernel<<<grid_for(count), 256, 0, stream()>>>(x, pairs, static_cast<std::int64_t>(count), n);
  check_launch("average split kernel");
}

void average_finish(const std::int64_t* pairs, std::int64_t* out, std::size_t count, std::int64_t n) {
  if (count == 0) return;
  average_finish_kernel<<<grid_for(count), 256, 0, stream()>>>(pairs, out, static_cast<std::int64_t>(count), n);
  check_launch("average finish kernel");
}

void order_keys(const void* x, void* keys, std::size_t count, DType dtype, ReduceOp op) {
  if (count == 0) return;
  if (dtype == DType::Int64) throw DTypeError("[cuda] order_keys: int64 needs no keys");
  with_type(dtype, [&](auto zero) {
    using T = decltype(zero);
    using Key = std::conditional_t<std::is_same_v<T, double>, std::int64_t, std::int32_t>;
    if constexpr (!std::is_same_v<T, std::int64_t>)
      order_keys_kernel<T, Key><<<grid_for(count), 256, 0, stream()>>>(static_cast<const T*>(x),
                                                                       static_cast<Key*>(keys),
                                                                       static_cast<std::int64_t>(count), op);
  });
  check_launch("order keys kernel");
}

void from_order_keys(const void* keys, void* out, std::size_t count, DType dtype) {
  if (count == 0) return;
  if (dtype == DType::Int64) throw DTypeError("[cuda] from_order_keys: int64 needs no keys");
  with_type(dtype, [&](auto zero) {
    using T = decltype(zero);
    using Key = std::conditional_t<std::is_same_v<T, double>, std::int64_t, std::int32_t>;
    if constexpr (!std::is_same_v<T, std::int64_t>)
      from_order_keys_kernel<T, Key><<<grid_for(count), 256, 0, stream()>>>(static_cast<const Key*>(keys),
                                                                            static_cast<T*>(out),
                                                                            static_cast<std::int64_t>(count));
  });
  check_launch("from order keys kernel");
}

void divide_by(void* acc, std::size_t count, DType dtype, std::int64_t divisor) {
  if (count == 0) return;
  with_type(dtype, [&](auto zero) {
    using T = decltype(zero);
    divide_kernel<T>
        <<<grid_for(count), 256, 0, stream()>>>(static_cast<T*>(acc), static_cast<std::int64_t>(count), divisor);
  });
  check_launch("divide kernel");
}

}  // namespace dtensor::cuda
