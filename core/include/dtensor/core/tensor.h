#pragma once
// Tensor: a dense, contiguous, row-major array that owns (shares) its
// storage. Copies share storage, as in PyTorch; clone() copies the data.
#include <complex>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "dtensor/core/dtype.h"
#include "dtensor/core/reduce_op.h"
#include "dtensor/core/shape.h"

namespace dtensor {

/// Autograd's per-tensor record (requires_grad, the node that made the
/// tensor, the accumulated gradient). Defined by the api layer
/// (libdtensor/src/autograd_engine.h): core only carries the pointer, never
/// looks inside, so the lowest layer stays ignorant of autograd.
struct AutogradMeta;

class Tensor {
 public:
  /// An undefined tensor (defined() is false).
  Tensor() = default;

  /// Uninitialised storage.
  static Tensor empty(Shape shape, DType dtype = DType::Float32, Device device = Device::CPU);
  static Tensor zeros(Shape shape, DType dtype = DType::Float32, Device device = Device::CPU);
  static Tensor ones(Shape shape, DType dtype = DType::Float32, Device device = Device::CPU);
  static Tensor full(Shape shape, double value, DType dtype = DType::Float32, Device device = Device::CPU);
  /// 0, 1, ..., n-1 reshaped to `shape`.
  static Tensor arange(Shape shape, DType dtype = DType::Float32, Device device = Device::CPU);
  /// Seeded counter-based (Philox4x32-10) values: element i of the row-major
  /// order is a pure function of (seed, i), so any part of the tensor can be
  /// computed alone (see fill_random). Floats are uniform in [0, 1); int64 in
  /// [-1000, 1000); bf16/f16 are the f32 values rounded. A CUDA tensor gets
  /// the same values.
  static Tensor rand(Shape shape, DType dtype, std::uint64_t seed, Device device = Device::CPU);
  /// Seeded standard normal values (floating dtypes only), element i a pure
  /// function of (seed, i) by Box-Muller over Philox (see fill_randn).
  static Tensor randn(Shape shape, DType dtype, std::uint64_t seed, Device device = Device::CPU);
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, Shape shape);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  /// Size of dim d; negative d counts from the end. ShapeError out of range.
  std::int64_t size(int d) const;
  std::int64_t numel() const { return numel_; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel_) * itemsize(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

  void* data() { return storage_.get(); }
  const void* data() const { return storage_.get(); }
  std::byte* bytes() { return storage_.get(); }
  const std::byte* bytes() const { return storage_.get(); }
  /// Typed view; DTypeError if T is not the tensor's dtype.
  template <class T>
  T* data_as();
  template <class T>
  const T* data_as() const;

  /// Element at a full index, converted to double (for tests and printing).
  double get(std::span<const std::int64_t> index) const;
  double get(std::initializer_list<std::int64_t> index) const {
    return get(std::span<const std::int64_t>(index.begin(), index.size()));
  }
  void set(std::span<const std::int64_t> index, double value);
  void set(std::initializer_list<std::int64_t> index, double value) {
    set(std::span<const std::int64_t>(index.begin(), index.size()), value);
  }

  Tensor clone() const;
  /// A copy on `device` (this tensor itself when it is already there).
  Tensor to(Device device) const;
  /// A copy converted to `dtype`, rounding to nearest even (this tensor
  /// itself when it already has that dtype).
  Tensor to(DType dtype) const;
  /// Same storage, new shape of the same numel.
  Tensor view(Shape shape) const;
  /// Same storage from element `offset` on, `shape` of at most the elements
  /// after it (ShapeError otherwise): a contiguous piece of a packed buffer,
  /// which keeps the whole buffer alive.
  Tensor view(Shape shape, std::int64_t offset) const;
  void fill(double value);
  void zero_();

  // ---- Autograd (dtensor/api/autograd.h), the same on DTensor ----------------
  // Declared here so that Tensor and DTensor read alike; defined in the api
  // layer (libdtensor/src/autograd.cpp), which owns the semantics. Copies of
  // a tensor share its record; view() and the ops make new tensors.
  /// Marks a leaf as needing a gradient (DTypeError naming the dtype for
  /// integer tensors). Returns *this.
  Tensor& requires_grad_(bool on = true);
  /// A leaf marked so, or the output of a recorded op.
  bool requires_grad() const;
  /// The accumulated gradient of a leaf; empty until a backward reaches it.
  std::optional<Tensor> grad() const;
  /// Empties grad().
  void zero_grad();
  /// Replaces a leaf's gradient (PyTorch's `p.grad = g`), e.g. with a
  /// clipped one: the same shape and dtype, or ShapeError / DTypeError naming
  /// both; AutogradError on a tensor that is not a leaf requiring a gradient.
  /// The gradient is held as given (it may share storage with other
  /// tensors: optimizers read gradients and never write into them).
  void set_grad(const Tensor& grad);
  /// Backward from a 0-d tensor (ValueError naming the shape otherwise).
  void backward(bool retain_graph = false) const;
  /// Backward with the gradient of this tensor given.
  void backward(const Tensor& grad_output, bool retain_graph = false) const;
  /// The same data, cut from the graph (requires_grad() false).
  Tensor detach() const;
  /// The opaque slot autograd keeps its record in.
  const std::shared_ptr<AutogradMeta>& autograd_meta() const { return autograd_; }
  void set_autograd_meta(std::shared_ptr<AutogradMeta> meta) { autograd_ = std::move(meta); }

 private:
  std::shared_ptr<std::byte[]> storage_;
  Shape shape_;
  std::int64_t numel_ = 0;
  DType dtype_ = DType::Float32;
  Device device_ = Device::CPU;
  std::shared_ptr<AutogradMeta> autograd_;  // null: not part of any graph
};

/// Comparisons work on any device (a CUDA operand is copied to the host).
/// Same shape, dtype and bitwise-equal elements.
bool equal(const Tensor& a, const Tensor& b);
/// Same shape and dtype and |a-b| <= atol + rtol*|b| elementwise.
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-6, double atol = 1e-8);
/// Largest |a-b| / (atol + |b|) style diagnostic: max abs difference.
double max_abs_diff(const Tensor& a, const Tensor& b);

/// Box copies work on either device; source and destination (and `out`/`in`
/// of pack/unpack) live on the same device.
/// Copies the box `box` of `src` into a new tensor of shape box.size.
Tensor slice_box(const Tensor& src, const Box& box);
/// Copies `box` of `src` into `dst` at `dst_offset` (same dtype).
void copy_box(const Tensor& src, const Box& box, Tensor& dst, std::span<const std::int64_t> dst_offset);
/// Overwrites every element of `dst` with `src`'s, in dst's own storage (so
/// every handle sharing it sees them), through the device copy where either
/// side is on the GPU. Same shape and dtype (ShapeError, DTypeError); the
/// devices may differ.
void copy_into(const Tensor& src, Tensor& dst);
/// Copies `box` of `src` to contiguous bytes at `out` (row-major in the box).
void pack_box(const Tensor& src, const Box& box, std::byte* out);
/// Inverse of pack_box: writes contiguous bytes into `box` of `dst`.
void unpack_box(const std::byte* in, Tensor& dst, const Box& box);

/// Fills `out` with the values that Tensor::rand(global_shape, dtype, seed)
/// has at the box (offset, out.shape()), without making the full tensor.
void fill_random(Tensor& out, std::uint64_t seed, std::span<const std::int64_t> global_shape,
                 std::span<const std::int64_t> offset);

/// Fills `out` with the values that Tensor::randn(global_shape, dtype, seed)
/// has at the box (offset, out.shape()). DTypeError unless out is floating.
void fill_randn(Tensor& out, std::uint64_t seed, std::span<const std::int64_t> global_shape,
                std::span<const std::int64_t> offset);

/// Elementwise reduction of `count` elements: acc = op(acc, x). Avg acts as Sum
/// (the caller divides). Used by communicators and kernels alike.
void reduce_into(void* acc, const void* x, std::size_t count, DType dtype, ReduceOp op);
/// acc /= divisor, elementwise (integer division for int64).
void divide_by(void* acc, std::size_t count, DType dtype, std::int64_t divisor);
/// The exact int64 average over n ranks, in two steps around a Sum
/// collective of 2 * count int64: average_split writes each rank's pairs
/// (x / n, x % n) interleaved, average_finish turns the summed pairs into
/// sum / n rounded toward zero, with no overflow wherever the average fits.
void average_split(const std::int64_t* x, std::int64_t* pairs, std::size_t count, std::int64_t n);
void average_finish(const std::int64_t* pairs, std::int64_t* out, std::size_t count, std::int64_t n);

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, Shape shape) {
  Tensor t = empty(std::move(shape), dtype_of<T>());
  if (static_cast<std::int64_t>(values.size()) != t.numel())
    throw ShapeError(fmt::format("[tensor] from_vector: {} values for shape {} of {} elements", values.size(),
                                 t.shape(), t.numel()));
  std::copy(values.begin(), values.end(), t.data_as<T>());
  return t;
}

template <class T>
T* Tensor::data_as() {
  if (dtype_of<T>() != dtype_)
    throw DTypeError(fmt::format("[tensor] data_as<{}> on a {} tensor", dtype_of<T>(), dtype_));
  return reinterpret_cast<T*>(storage_.get());
}
template <class T>
const T* Tensor::data_as() const {
  return const_cast<Tensor*>(this)->data_as<T>();
}

}  // namespace dtensor

template <>
struct fmt::formatter<dtensor::Tensor> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  fmt::format_context::iterator format(const dtensor::Tensor& t, fmt::format_context& ctx) const;
};
