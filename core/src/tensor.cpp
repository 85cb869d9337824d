#include "dtensor/core/tensor.h"

#include <Random123/philox.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <type_traits>

#include "dtensor/core/cuda.h"
#include "dtensor/core/error.h"
#include "dtensor/core/memory_account.h"
#include "dtensor/core/detail/combine.h"
#include "dtensor/core/detail/host_blocks.h"
#include "dtensor/core/detail/strided_copy.h"

namespace dtensor {
namespace {

// f32 -> bf16 with bfloat16(float)'s rounding (half.h: nearest even, NaN
// kept quiet), written without its early return so that the compiler
// vectorises the loop, and compiled for AVX-512 and AVX2 besides the
// baseline, picked when the library loads (GCC's target_clones): SSE2 has
// no 32-to-16-bit pack, and its loop (0.55 ns an element on 64x4096) cost
// as much as the vectorised gelu it rounds the output of (0.17 ns with it).
// Not under ThreadSanitizer: the clones' ifunc resolver runs while the
// loader relocates the library, before TSan's runtime is up, and crashes it.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void floats_to_bf16(const float* src, bfloat16* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t u;
    std::memcpy(&u, src + i, sizeof u);
    const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const std::uint32_t quiet_nan = (u >> 16) | 0x40u;
    const std::uint16_t bits = static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
    dst[i] = bfloat16::from_bits(bits);
  }
}

std::int64_t linear_index(const Tensor& t, std::span<const std::int64_t> index) {
  if (static_cast<int>(index.size()) != t.dim())
    throw ShapeError(fmt::format("[tensor] index of {} dims for a tensor of {} dims", index.size(), t.dim()));
  std::int64_t lin = 0;
  for (int d = 0; d < t.dim(); ++d) {
    if (index[d] < 0 || index[d] >= t.shape()[d])
      throw ShapeError(fmt::format("[tensor] index {} out of range for dim {} of size {}", index[d], d, t.shape()[d]));
    lin = lin * t.shape()[d] + index[d];
  }
  return lin;
}

// Calls fn(src_row_offset, dst_row_offset) in elements for every row (last
// dim run) of a box between two row-major index spaces: the random fills
// walk a box of the global tensor this way. Copies of boxes do not: they go
// through cpu::copy_strided (copy_box_on_host).
template <class Fn>
void for_each_row(const Shape& src_shape, const Shape& src_off, const Shape& dst_shape, const Shape& dst_off,
                  const Shape& size, Fn&& fn) {
  const int nd = static_cast<int>(size.size());
  if (numel(size) == 0) return;
  if (nd == 0) {
    fn(0, 0, 1);
    return;
  }
  Shape ss = row_major_strides(src_shape), ds = row_major_strides(dst_shape);
  std::int64_t row = size[nd - 1];
  // Merge trailing dims that are whole in both tensors into one long row.
  int last = nd - 1;
  while (last > 0 && size[last] == src_shape[last] && size[last] == dst_shape[last] && src_off[last] == 0 &&
         dst_off[last] == 0) {
    --last;
    row *= size[last];
  }
  // Now the row spans dims last..nd-1 starting at the box's offsets.
  Shape idx(last, 0);
  std::int64_t sbase = 0, dbase = 0;
  for (int d = last; d < nd; ++d) {
    sbase += src_off[d] * ss[d];
    dbase += dst_off[d] * ds[d];
  }
  while (true) {
    std::int64_t so = sbase, dof = dbase;
    for (int d = 0; d < last; ++d) {
      so += (src_off[d] + idx[d]) * ss[d];
      dof += (dst_off[d] + idx[d]) * ds[d];
    }
    fn(so, dof, row);
    int d = last - 1;
    while (d >= 0 && ++idx[d] == size[d]) idx[d--] = 0;
    if (d < 0) break;
  }
}

// A box of one row-major host tensor into a box of another (offsets and
// size in elements), as the strided copy that every CPU copy goes through.
void copy_box_on_host(const std::byte* src, const Shape& src_shape, const Shape& src_off, std::byte* dst,
                      const Shape& dst_shape, const Shape& dst_off, const Shape& size, std::size_t itemsize) {
  if (numel(size) == 0) return;
  const Shape ss = row_major_strides(src_shape), ds = row_major_strides(dst_shape);
  std::int64_t s0 = 0, d0 = 0;
  for (std::size_t d = 0; d < size.size(); ++d) {
    s0 += src_off[d] * ss[d];
    d0 += dst_off[d] * ds[d];
  }
  const auto is = static_cast<std::int64_t>(itemsize);
  cpu::copy_strided(src + s0 * is, ss, dst + d0 * is, ds, size, itemsize);
}

void check_box(const Shape& shape, const Box& box, std::string_view what) {
  if (box.ndim() != static_cast<int>(shape.size()) || static_cast<int>(box.offset.size()) != box.ndim())
    throw ShapeError(
        fmt::format("[tensor] {}: box {} has {} dims, the tensor {}", what, box, box.ndim(), shape.size()));
  for (int d = 0; d < box.ndim(); ++d)
    if (box.size[d] < 0 || (box.size[d] > 0 && (box.offset[d] < 0 || box.offset[d] + box.size[d] > shape[d])))
      throw ShapeError(fmt::format("[tensor] {}: box {} does not fit shape {}", what, box, fmt::join(shape, "x")));
}

}  // namespace

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  check_shape(shape, "tensor");
  // The bytes are checked once here; nbytes() of every tensor then fits.
  const auto bytes = static_cast<std::size_t>(byte_size(shape, itemsize(dtype)));
  Tensor t;
  t.numel_ = dtensor::numel(shape);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = device == Device::CUDA ? cuda::allocate(bytes) : host_blocks::allocate(bytes);
  if (const auto& account = charged_account()) {
    // The charged storage owns the allocator's block and gives the bytes
    // back when the last view lets go, on whichever thread that is.
    account->charge(bytes);
    t.storage_ = std::shared_ptr<std::byte[]>(
        t.storage_.get(), [block = t.storage_, account, bytes](std::byte*) { account->uncharge(bytes); });
  }
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  t.zero_();
  return t;
}

Tensor Tensor::ones(Shape shape, DType dtype, Device device) { return full(std::move(shape), 1.0, dtype, device); }

Tensor Tensor::full(Shape shape, double value, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  t.fill(value);
  return t;
}

Tensor Tensor::arange(Shape shape, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  if (device == Device::CUDA) {
    cuda::arange(t.data(), t.numel(), dtype);
    return t;
  }
  visit_any_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    T* p = t.data_as<T>();
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<T>(i);
  });
  return t;
}

Tensor Tensor::rand(Shape shape, DType dtype, std::uint64_t seed, Device device) {
  Tensor t = empty(shape, dtype, device);
  Shape offset(shape.size(), 0);
  fill_random(t, seed, shape, offset);
  return t;
}

Tensor Tensor::randn(Shape shape, DType dtype, std::uint64_t seed, Device device) {
  Tensor t = empty(shape, dtype, device);
  Shape offset(shape.size(), 0);
  fill_randn(t, seed, shape, offset);
  return t;
}

Tensor Tensor::to(Device device) const {
  if (!defined() || device == device_) return *this;
  Tensor t = empty(shape_, dtype_, device);
  cuda::copy(t.data(), device, data(), device_, nbytes());
  return t;
}

Tensor Tensor::to(DType dtype) const {
  if (!defined() || dtype == dtype_) return *this;
  Tensor t = empty(shape_, dtype, device_);
  if (device_ == Device::CUDA) {
    cuda::cast(data(), dtype_, t.data(), dtype, numel_);
    return t;
  }
  if (dtype_ == DType::Float32 && dtype == DType::BFloat16) {  // the CPU kernels' bf16 outputs
    floats_to_bf16(data_as<float>(), t.data_as<bfloat16>(), numel_);
    return t;
  }
  visit_any_dtype(dtype_, [&](auto from) {
    using S = decltype(from);
    const S* src = data_as<S>();
    visit_any_dtype(dtype, [&](auto to) {
      using D = decltype(to);
      D* dst = t.data_as<D>();
      for (std::int64_t i = 0; i < numel_; ++i) {
        if constexpr (std::is_same_v<S, bfloat16> || std::is_same_v<S, float16>)
          dst[i] = static_cast<D>(static_cast<float>(src[i]));
        else if constexpr (std::is_same_v<D, bfloat16> || std::is_same_v<D, float16>)
          dst[i] = D(static_cast<float>(src[i]));
        else
          dst[i] = static_cast<D>(src[i]);
      }
    });
  });
  return t;
}

std::int64_t Tensor::size(int d) const { return shape_[static_cast<std::size_t>(wrap_dim("tensor", d, dim()))]; }

double Tensor::get(std::span<const std::int64_t> index) const {
  std::int64_t i = linear_index(*this, index);
  return visit_any_dtype(dtype_, [&](auto zero) {
    using T = decltype(zero);
    T v;
    if (device_ == Device::CUDA)
      cuda::copy(&v, Device::CPU, data_as<T>() + i, Device::CUDA, sizeof(T));
    else
      v = data_as<T>()[i];
    return static_cast<double>(v);
  });
}

void Tensor::set(std::span<const std::int64_t> index, double value) {
  std::int64_t i = linear_index(*this, index);
  visit_any_dtype(dtype_, [&](auto zero) {
    using T = decltype(zero);
    const T v = static_cast<T>(value);
    if (device_ == Device::CUDA)
      cuda::copy(data_as<T>() + i, Device::CUDA, &v, Device::CPU, sizeof(T));
    else
      data_as<T>()[i] = v;
  });
}

Tensor Tensor::clone() const {
  if (!defined()) return Tensor();
  Tensor t = empty(shape_, dtype_, device_);
  if (device_ == Device::CUDA)
    cuda::copy(t.data(), device_, data(), device_, nbytes());
  else
    std::memcpy(t.data(), data(), nbytes());
  return t;
}

Tensor Tensor::view(Shape shape, std::int64_t offset) const {
  check_shape(shape, "tensor");
  const std::int64_t n = dtensor::numel(shape);
  if (offset < 0 || offset > numel_ || n > numel_ - offset)
    throw ShapeError(fmt::format("[tensor] view as {} ({} elements) from element {} of a tensor of {} elements; "
                                 "expected the view within the tensor",
                                 fmt::join(shape, "x"), n, offset, numel_));
  Tensor t = *this;
  t.storage_ = std::shared_ptr<std::byte[]>(storage_, storage_.get() + offset * static_cast<std::int64_t>(itemsize(dtype_)));
  t.shape_ = std::move(shape);
  t.numel_ = n;
  t.autograd_.reset();
  return t;
}

Tensor Tensor::view(Shape shape) const {
  check_shape(shape, "tensor");
  if (dtensor::numel(shape) != numel_)
    throw ShapeError(fmt::format("[tensor] view as {} ({} elements) of a tensor of shape {} ({} elements)",
                                 fmt::join(shape, "x"), dtensor::numel(shape), fmt::join(shape_, "x"), numel_));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  t.autograd_.reset();  // a view is a new tensor to autograd (the view op records it)
  return t;
}

void Tensor::fill(double value) {
  if (device_ == Device::CUDA) {
    cuda::fill(data(), numel_, dtype_, value);
    return;
  }
  visit_any_dtype(dtype_, [&](auto zero) {
    using T = decltype(zero);
    std::fill_n(data_as<T>(), numel_, static_cast<T>(value));
  });
}

void Tensor::zero_() {
  if (!defined()) return;
  if (device_ == Device::CUDA)
    cuda::fill(data(), numel_, dtype_, 0.0);
  else
    std::memset(data(), 0, nbytes());
}

namespace {
// Comparisons look at host values: a CUDA operand is copied over first.
Tensor on_host(const Tensor& t) { return t.device() == Device::CPU ? t : t.to(Device::CPU); }
}  // namespace

bool equal(const Tensor& a_in, const Tensor& b_in) {
  if (a_in.shape() != b_in.shape() || a_in.dtype() != b_in.dtype()) return false;
  const Tensor a = on_host(a_in), b = on_host(b_in);
  return std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

double max_abs_diff(const Tensor& a_in, const Tensor& b_in) {
  if (a_in.shape() != b_in.shape() || a_in.dtype() != b_in.dtype()) return INFINITY;
  const Tensor a = on_host(a_in), b = on_host(b_in);
  return visit_any_dtype(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pa = a.data_as<T>();
    const T* pb = b.data_as<T>();
    double m = 0;
    for (std::int64_t i = 0; i < a.numel(); ++i) {
      double d = std::abs(static_cast<double>(pa[i]) - static_cast<double>(pb[i]));
      if (std::isnan(d)) return static_cast<double>(INFINITY);
      m = std::max(m, d);
    }
    return m;
  });
}

bool allclose(const Tensor& a_in, const Tensor& b_in, double rtol, double atol) {
  if (a_in.shape() != b_in.shape() || a_in.dtype() != b_in.dtype()) return false;
  const Tensor a = on_host(a_in), b = on_host(b_in);
  return visit_any_dtype(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pa = a.data_as<T>();
    const T* pb = b.data_as<T>();
    for (std::int64_t i = 0; i < a.numel(); ++i) {
      double x = static_cast<double>(pa[i]), y = static_cast<double>(pb[i]);
      if (!(std::abs(x - y) <= atol + rtol * std::abs(y))) return false;
    }
    return true;
  });
}

Tensor slice_box(const Tensor& src, const Box& box) {
  Tensor out = Tensor::empty(box.size, src.dtype(), src.device());
  Shape zero(box.ndim(), 0);
  copy_box(src, box, out, zero);
  return out;
}

void copy_box(const Tensor& src, const Box& box, Tensor& dst, std::span<const std::int64_t> dst_offset) {
  check_box(src.shape(), box, "copy_box source");
  if (src.dtype() != dst.dtype())
    throw DTypeError(fmt::format("[tensor] copy_box from {} to {}", src.dtype(), dst.dtype()));
  Box dbox{Shape(dst_offset.begin(), dst_offset.end()), box.size};
  check_box(dst.shape(), dbox, "copy_box destination");
  const std::size_t is = itemsize(src.dtype());
  if (src.device() != dst.device())
    throw ValueError(fmt::format("[tensor] copy_box from a {} tensor to a {} tensor; move one with to() first",
                                 src.device(), dst.device()));
  if (src.device() == Device::CUDA) {
    cuda::copy_box(src.bytes(), src.shape(), box.offset, dst.bytes(), dst.shape(), dbox.offset, box.size, is);
    return;
  }
  copy_box_on_host(src.bytes(), src.shape(), box.offset, dst.bytes(), dst.shape(), dbox.offset, box.size, is);
}

void copy_into(const Tensor& src, Tensor& dst) {
  if (src.shape() != dst.shape())
    throw ShapeError(fmt::format("[tensor] copy_into from shape {} to shape {}", fmt::join(src.shape(), "x"),
                                 fmt::join(dst.shape(), "x")));
  if (src.dtype() != dst.dtype())
    throw DTypeError(fmt::format("[tensor] copy_into from {} to {}", src.dtype(), dst.dtype()));
  if (src.nbytes() == 0) return;
  if (src.device() == Device::CPU && dst.device() == Device::CPU)
    std::memcpy(dst.data(), src.data(), src.nbytes());
  else
    cuda::copy(dst.data(), dst.device(), src.data(), src.device(), src.nbytes());
}

void pack_box(const Tensor& src, const Box& box, std::byte* out) {
  check_box(src.shape(), box, "pack_box");
  const std::size_t is = itemsize(src.dtype());
  const std::byte* s = src.bytes();
  Shape zero(box.ndim(), 0);
  if (src.device() == Device::CUDA) {
    cuda::copy_box(s, src.shape(), box.offset, out, box.size, zero, box.size, is);
    return;
  }
  copy_box_on_host(s, src.shape(), box.offset, out, box.size, zero, box.size, is);
}

void unpack_box(const std::byte* in, Tensor& dst, const Box& box) {
  check_box(dst.shape(), box, "unpack_box");
  const std::size_t is = itemsize(dst.dtype());
  std::byte* d = dst.bytes();
  Shape zero(box.ndim(), 0);
  if (dst.device() == Device::CUDA) {
    cuda::copy_box(in, box.size, zero, d, dst.shape(), box.offset, box.size, is);
    return;
  }
  copy_box_on_host(in, box.size, zero, d, dst.shape(), box.offset, box.size, is);
}

namespace {

using Philox = r123::Philox4x32;

// fill_random's values from one Philox draw: uniform in [0, 1) for floats
// (24 or 53 random bits), whole numbers in [-1000, 1000) for int64.
void put_uniform(std::byte* base, DType dtype, std::int64_t i, const Philox::ctr_type& r) {
  switch (dtype) {
    case DType::Float32:
      reinterpret_cast<float*>(base)[i] = static_cast<float>(r.v[0] >> 8) * (1.0f / 16777216.0f);
      break;
    case DType::Float64: {
      std::uint64_t bits = (static_cast<std::uint64_t>(r.v[0]) << 32 | r.v[1]) >> 11;
      reinterpret_cast<double*>(base)[i] = static_cast<double>(bits) * (1.0 / 9007199254740992.0);
      break;
    }
    case DType::Int64:
      reinterpret_cast<std::int64_t*>(base)[i] = static_cast<std::int64_t>(r.v[0] % 2000) - 1000;
      break;
    default: visit_dtype(dtype, [](auto) {});  // throws DTypeError naming the dtype
  }
}

// fill_randn's: Box-Muller from two 53-bit uniforms of the same draw.
void put_normal(std::byte* base, DType dtype, std::int64_t i, const Philox::ctr_type& r) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  std::uint64_t b1 = (static_cast<std::uint64_t>(r.v[0]) << 32 | r.v[1]) >> 11;
  std::uint64_t b2 = (static_cast<std::uint64_t>(r.v[2]) << 32 | r.v[3]) >> 11;
  const double u1 = (static_cast<double>(b1) + 1.0) * (1.0 / 9007199254740992.0);  // (0, 1]
  const double u2 = static_cast<double>(b2) * (1.0 / 9007199254740992.0);          // [0, 1)
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
  if (dtype == DType::Float32)
    reinterpret_cast<float*>(base)[i] = static_cast<float>(z);
  else
    reinterpret_cast<double*>(base)[i] = z;
}

// What fill_random and fill_randn share: the checks (`what` names the
// caller), the device and 16-bit cases, and the walk over the box, where
// Put stores each element from the Philox draw of its global index. The
// counter's third word (1 for normal values) keeps the two streams apart.
template <auto Put>
void fill_counter_based(Tensor& out, std::uint64_t seed, std::span<const std::int64_t> global_shape,
                        std::span<const std::int64_t> offset, const char* what, bool normal) {
  if (global_shape.size() != out.shape().size() || offset.size() != out.shape().size())
    throw ShapeError(fmt::format("[tensor] {}: a {}-d box of a {}-d tensor", what, out.dim(), global_shape.size()));
  if (normal && !is_floating(out.dtype()))
    throw DTypeError(fmt::format("[tensor] randn: normal values need a floating dtype, got {}", out.dtype()));
  Box box{Shape(offset.begin(), offset.end()), out.shape()};
  check_box(Shape(global_shape.begin(), global_shape.end()), box, what);
  if (out.device() == Device::CUDA) {
    cuda::fill_random(out.data(), out.dtype(), seed, global_shape, offset, out.shape(), normal);
    return;
  }
  if (out.dtype() == DType::BFloat16 || out.dtype() == DType::Float16) {
    // The f32 values, rounded once: the same numbers the GPU makes.
    Tensor wide = Tensor::empty(out.shape(), DType::Float32);
    fill_counter_based<Put>(wide, seed, global_shape, offset, what, normal);
    out = wide.to(out.dtype());
    return;
  }
  Philox rng;
  Philox::key_type key = {{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}};
  const std::uint32_t stream = normal ? 1 : 0;
  const DType dtype = out.dtype();
  std::byte* base = out.bytes();
  Shape zero(box.ndim(), 0);
  Shape gshape(global_shape.begin(), global_shape.end());
  for_each_row(gshape, box.offset, out.shape(), zero, box.size, [&](std::int64_t gi, std::int64_t li, std::int64_t n) {
    for (std::int64_t k = 0; k < n; ++k) {
      std::uint64_t g = static_cast<std::uint64_t>(gi + k);
      Philox::ctr_type ctr = {{static_cast<std::uint32_t>(g), static_cast<std::uint32_t>(g >> 32), stream, 0}};
      Put(base, dtype, li + k, rng(ctr, key));
    }
  });
}

}  // namespace

void fill_random(Tensor& out, std::uint64_t seed, std::span<const std::int64_t> global_shape,
                 std::span<const std::int64_t> offset) {
  fill_counter_based<put_uniform>(out, seed, global_shape, offset, "fill_random", false);
}

void fill_randn(Tensor& out, std::uint64_t seed, std::span<const std::int64_t> global_shape,
                std::span<const std::int64_t> offset) {
  fill_counter_based<put_normal>(out, seed, global_shape, offset, "fill_randn", true);
}

namespace {
template <class T, class Op>
void reduce_loop(T* __restrict acc, const T* __restrict x, std::size_t n, Op op) {
  for (std::size_t i = 0; i < n; ++i) acc[i] = op(acc[i], x[i]);
}
// One loop per op (not combine::apply's switch per element), so that each
// vectorizes.
template <class T>
void reduce_typed(T* __restrict acc, const T* __restrict x, std::size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: reduce_loop(acc, x, n, [](T u, T v) { return u + v; }); break;
    case ReduceOp::Max: reduce_loop(acc, x, n, [](T u, T v) { return combine::max_nan(u, v); }); break;
    case ReduceOp::Min: reduce_loop(acc, x, n, [](T u, T v) { return combine::min_nan(u, v); }); break;
  }
}
}  // namespace

void reduce_into(void* acc, const void* x, std::size_t count, DType dtype, ReduceOp op) {
  if (dtype == DType::BFloat16 || dtype == DType::Float16) {
    // Each pairwise step in float, rounded once, as NCCL does for 16-bit types.
    visit_any_dtype(dtype, [&](auto zero) {
      using H = decltype(zero);
      H* a = static_cast<H*>(acc);
      const H* b = static_cast<const H*>(x);
      for (std::size_t i = 0; i < count; ++i)
        a[i] = H(combine::apply(op, static_cast<float>(a[i]), static_cast<float>(b[i])));
    });
    return;
  }
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    reduce_typed(static_cast<T*>(acc), static_cast<const T*>(x), count, op);
  });
}

void average_split(const std::int64_t* x, std::int64_t* pairs, std::size_t count, std::int64_t n) {
  for (std::size_t i = 0; i < count; ++i) combine::average_split(x[i], n, pairs + 2 * i);
}

void average_finish(const std::int64_t* pairs, std::int64_t* out, std::size_t count, std::int64_t n) {
  for (std::size_t i = 0; i < count; ++i) out[i] = combine::average_finish(pairs + 2 * i, n);
}

void divide_by(void* acc, std::size_t count, DType dtype, std::int64_t divisor) {
  if (dtype == DType::BFloat16 || dtype == DType::Float16) {
    visit_any_dtype(dtype, [&](auto zero) {
      using H = decltype(zero);
      H* a = static_cast<H*>(acc);
      for (std::size_t i = 0; i < count; ++i) a[i] = H(static_cast<float>(a[i]) / static_cast<float>(divisor));
    });
    return;
  }
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    T* a = static_cast<T*>(acc);
    const T d = static_cast<T>(divisor);
    for (std::size_t i = 0; i < count; ++i) a[i] /= d;
  });
}

}  // namespace dtensor

fmt::format_context::iterator fmt::formatter<dtensor::Tensor>::format(const dtensor::Tensor& t,
                                                                      fmt::format_context& ctx) const {
  auto out = ctx.out();
  if (!t.defined()) return fmt::format_to(out, "Tensor(undefined)");
  out = fmt::format_to(out, "Tensor({}, {}{}", fmt::join(t.shape(), "x"), t.dtype(),
                       t.device() == dtensor::Device::CUDA ? ", cuda" : "");
  const std::int64_t shown = std::min<std::int64_t>(t.numel(), 16);
  if (shown > 0) {
    out = fmt::format_to(out, ", [");
    const dtensor::Tensor host = t.device() == dtensor::Device::CPU ? t : t.to(dtensor::Device::CPU);
    dtensor::visit_any_dtype(t.dtype(), [&](auto zero) {
      using T = decltype(zero);
      const T* p = host.data_as<T>();
      for (std::int64_t i = 0; i < shown; ++i) {
        if constexpr (std::is_same_v<T, dtensor::bfloat16> || std::is_same_v<T, dtensor::float16>)
          out = fmt::format_to(out, "{}{}", i ? ", " : "", static_cast<float>(p[i]));
        else
          out = fmt::format_to(out, "{}{}", i ? ", " : "", p[i]);
      }
    });
    out = fmt::format_to(out, "{}]", t.numel() > shown ? ", ..." : "");
  }
  return fmt::format_to(out, ")");
}
