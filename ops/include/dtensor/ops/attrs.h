#pragma once
// An op's attributes: everything about a call but its tensors, as a value of
// the op's own struct (ReduceAttrs{.dims = {1}, .keepdim = true}) rather than
// positional fields whose meaning changes from op to op. OpAttrs holds any
// such value, so custom ops bring their own struct; it is part of the
// propagation cache key, hence the hash and equality every struct provides.
#include <concepts>
#include <cstdint>
#include <cstddef>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include <fmt/format.h>

#include "dtensor/core/dtype.h"
#include "dtensor/core/error.h"
#include "dtensor/core/hash.h"
#include "dtensor/core/shape.h"
#include "dtensor/core/tensor.h"

namespace dtensor {

/// What OpAttrs can hold: a copyable value with == and a hash() member.
/// A `static constexpr std::string_view kName` names it in errors.
template <class T>
concept AttrStruct = std::copy_constructible<T> && std::equality_comparable<T> && requires(const T& t) {
  { t.hash() } -> std::convertible_to<std::size_t>;
};

/// The name of an attribute struct in messages: its kName, else the
/// compiler's name for the type.
template <class T>
std::string_view attrs_name() {
  if constexpr (requires { std::string_view(T::kName); })
    return T::kName;
  else
    return typeid(T).name();
}

/// One op call's attributes, of whichever struct the op reads (empty for ops
/// that take none). Immutable and cheap to copy: a small trivially copyable
/// struct (ScalarAttrs, DimAttrs, TransposeAttrs, ...) is held in place, so
/// that building one per call (x * 2.0) allocates nothing; others are
/// shared.
class OpAttrs {
 public:
  OpAttrs() = default;
  template <AttrStruct T>
  requires(!std::same_as<std::remove_cvref_t<T>, OpAttrs>) OpAttrs(T value) {  // NOLINT: implicit by design
    if constexpr (held_in_place<T>()) {
      value_ = ::new (static_cast<void*>(buf_)) Model<T>(std::move(value));
    } else {
      shared_ = std::make_shared<const Model<T>>(std::move(value));
      value_ = shared_.get();
    }
  }
  OpAttrs(const OpAttrs& other) : shared_(other.shared_) { value_ = other.copy_into(buf_); }
  OpAttrs& operator=(const OpAttrs& other) {
    if (this != &other) {
      destroy_in_place();
      shared_ = other.shared_;
      value_ = other.copy_into(buf_);
    }
    return *this;
  }
  ~OpAttrs() { destroy_in_place(); }

  bool empty() const { return !value_; }
  /// The held struct if it is a T, else null.
  template <AttrStruct T>
  const T* get_if() const {
    return value_ && value_->type() == typeid(T) ? &static_cast<const Model<T>&>(*value_).value : nullptr;
  }
  /// The held struct; ValueError naming the op and the struct it expected
  /// when it holds another (or none). An empty OpAttrs gives a
  /// default-constructed T where T has one, so `call_op("sum", {x})` reduces
  /// over all dims.
  template <AttrStruct T>
  const T& get(std::string_view op) const {
    if (const T* t = get_if<T>()) return *t;
    if constexpr (std::is_default_constructible_v<T>) {
      if (!value_) {
        static const T defaults{};
        return defaults;
      }
    }
    throw ValueError(fmt::format("[{}] got attributes of type {}; expected {}", op,
                                 value_ ? value_->name() : std::string_view("none"), attrs_name<T>()));
  }
  /// Where an op without tensor inputs allocates: the held struct's
  /// `device` member if it has one, else the CPU.
  Device device() const { return value_ ? value_->device() : Device::CPU; }

  bool operator==(const OpAttrs& other) const {
    if (value_ == other.value_) return true;
    if (!value_ || !other.value_) return false;
    return value_->equals(*other.value_);
  }
  std::size_t hash() const { return value_ ? value_->hash() : 0; }

 private:
  static constexpr std::size_t kInPlaceBytes = 32;
  struct Concept {
    virtual ~Concept() = default;
    /// Copies this (held in place) into `buf`.
    virtual const Concept* copy_into(void* buf) const = 0;
    virtual const std::type_info& type() const = 0;
    virtual bool equals(const Concept& other) const = 0;
    virtual std::size_t hash() const = 0;
    virtual Device device() const = 0;
    virtual std::string_view name() const = 0;
  };
  template <class T>
  struct Model final : Concept {
    explicit Model(T v) : value(std::move(v)) {}
    const Concept* copy_into(void* buf) const override {
      if constexpr (held_in_place<T>())
        return ::new (buf) Model(value);
      else
        return nullptr;  // never called: a shared value is not copied
    }
    const std::type_info& type() const override { return typeid(T); }
    bool equals(const Concept& other) const override {
      return other.type() == typeid(T) && static_cast<const Model&>(other).value == value;
    }
    std::size_t hash() const override { return value.hash() ^ typeid(T).hash_code(); }
    Device device() const override {
      if constexpr (requires { Device{value.device}; })
        return value.device;
      else
        return Device::CPU;
    }
    std::string_view name() const override { return attrs_name<T>(); }
    T value;
  };
  template <class T>
  static constexpr bool held_in_place() {
    return std::is_trivially_copyable_v<T> && sizeof(Model<T>) <= kInPlaceBytes &&
           alignof(Model<T>) <= alignof(std::max_align_t);
  }
  bool in_place() const { return value_ && !shared_; }
  // This value as another OpAttrs holds it: the shared one, or a copy in `buf`.
  const Concept* copy_into(void* buf) const { return in_place() ? value_->copy_into(buf) : value_; }
  void destroy_in_place() {
    if (in_place()) value_->~Concept();
  }
  std::shared_ptr<const Concept> shared_;  // null when empty or held in place
  const Concept* value_ = nullptr;         // the held value: in buf_ or *shared_
  alignas(std::max_align_t) unsigned char buf_[kInPlaceBytes];
};

// ---- The library's attribute structs, by family -------------------------------
// Every field has a default member initializer, so that a designated
// initializer may name only the fields it sets (GCC's
// -Wmissing-field-initializers spares defaulted members).

/// add_scalar, mul_scalar, div_scalar, pow_scalar: the scalar operand.
struct ScalarAttrs {
  static constexpr std::string_view kName = "ScalarAttrs";
  double value = 0;
  bool operator==(const ScalarAttrs&) const = default;
  std::size_t hash() const { return hash_fields(value); }
};

/// sum, mean, max, min, norm, argmax: the reduced dims (empty: all; argmax
/// takes at most one, empty: flattened), whether they stay as size 1, and
/// the norm's p.
struct ReduceAttrs {
  static constexpr std::string_view kName = "ReduceAttrs";
  std::vector<std::int64_t> dims{};
  bool keepdim = false;
  double p = 2;
  bool operator==(const ReduceAttrs&) const = default;
  std::size_t hash() const { return hash_fields(dims, keepdim, p); }
};

/// layer_norm, rms_norm: how many trailing dims are normalized, which of
/// the weight and bias inputs follow x, and eps.
struct NormAttrs {
  static constexpr std::string_view kName = "NormAttrs";
  std::int64_t normalized_ndim = 1;
  bool weight = false;
  bool bias = false;
  double eps = 1e-5;
  bool operator==(const NormAttrs&) const = default;
  std::size_t hash() const { return hash_fields(normalized_ndim, weight, bias, eps); }
};

/// einsum: the equation ("bij,bjk->bik", "...ij,...jk", "ii->i").
struct EinsumAttrs {
  static constexpr std::string_view kName = "EinsumAttrs";
  std::string equation{};
  bool operator==(const EinsumAttrs&) const = default;
  std::size_t hash() const { return hash_fields(equation); }
};

/// One dim: softmax, log_softmax, unsqueeze, cat, stack.
struct DimAttrs {
  static constexpr std::string_view kName = "DimAttrs";
  std::int64_t dim = 0;
  bool operator==(const DimAttrs&) const = default;
  std::size_t hash() const { return hash_fields(dim); }
};

/// A list of dims: permute (the permutation), squeeze (the dims to drop;
/// empty: every size-1 dim).
struct DimsAttrs {
  static constexpr std::string_view kName = "DimsAttrs";
  std::vector<std::int64_t> dims{};
  bool operator==(const DimsAttrs&) const = default;
  std::size_t hash() const { return hash_fields(dims); }
};

/// reshape and view (one -1 inferred), expand (-1 keeps a size): the target
/// shape.
struct ShapeAttrs {
  static constexpr std::string_view kName = "ShapeAttrs";
  Shape shape{};
  bool operator==(const ShapeAttrs&) const = default;
  std::size_t hash() const { return hash_fields(shape); }
};

/// transpose: the two dims swapped.
struct TransposeAttrs {
  static constexpr std::string_view kName = "TransposeAttrs";
  std::int64_t dim0 = 0;
  std::int64_t dim1 = 1;
  bool operator==(const TransposeAttrs&) const = default;
  std::size_t hash() const { return hash_fields(dim0, dim1); }
};

/// flatten: dims start_dim..end_dim (inclusive) merge into one.
struct FlattenAttrs {
  static constexpr std::string_view kName = "FlattenAttrs";
  std::int64_t start_dim = 0;
  std::int64_t end_dim = -1;
  bool operator==(const FlattenAttrs&) const = default;
  std::size_t hash() const { return hash_fields(start_dim, end_dim); }
};

/// unflatten: dim splits into sizes (one -1 inferred).
struct UnflattenAttrs {
  static constexpr std::string_view kName = "UnflattenAttrs";
  std::int64_t dim = 0;
  Shape sizes{};
  bool operator==(const UnflattenAttrs&) const = default;
  std::size_t hash() const { return hash_fields(dim, sizes); }
};

/// narrow: elements start .. start + length of dim (a negative start counts
/// from the end).
struct NarrowAttrs {
  static constexpr std::string_view kName = "NarrowAttrs";
  std::int64_t dim = 0;
  std::int64_t start = 0;
  std::int64_t length = 0;
  bool operator==(const NarrowAttrs&) const = default;
  std::size_t hash() const { return hash_fields(dim, start, length); }
};

/// to: the target dtype.
struct ToAttrs {
  static constexpr std::string_view kName = "ToAttrs";
  DType dtype = DType::Float32;
  bool operator==(const ToAttrs&) const = default;
  std::size_t hash() const { return hash_fields(dtype); }
};

}  // namespace dtensor
