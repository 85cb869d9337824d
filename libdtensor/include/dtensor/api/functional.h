#pragma once
// Ops on DTensors and plain Tensors alike. Every op goes through one entry,
// call_op, which takes the op by name (a hash lookup in the registry) or by
// handle (an Op, or the OpDef that OpRegistry::add returned: no lookup); on
// DTensors it propagates shardings (dtensor/ops/dispatch.h), on Tensors it
// runs the kernel.
#include <concepts>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/api/dtensor_tensor.h"
#include "dtensor/ops/dispatch.h"
#include "dtensor/ops/op.h"

namespace dtensor {

/// The two kinds of tensor every front-end op accepts: the op on a plain
/// Tensor runs the kernel, on a DTensor it propagates shardings.
template <class X>
concept TensorOrDTensor = std::same_as<X, Tensor> || std::same_as<X, DTensor>;

/// Runs a registered op. All DTensor inputs must share one mesh (MeshError
/// otherwise); the cost model is the first input's.
DTensor call_op(std::string_view op, std::span<const DTensor> inputs, const OpAttrs& attrs = {});
Tensor call_op(std::string_view op, std::span<const Tensor> inputs, const OpAttrs& attrs = {});
inline DTensor call_op(std::string_view op, std::initializer_list<DTensor> inputs, const OpAttrs& attrs = {}) {
  return call_op(op, std::span<const DTensor>(inputs.begin(), inputs.size()), attrs);
}
inline Tensor call_op(std::string_view op, std::initializer_list<Tensor> inputs, const OpAttrs& attrs = {}) {
  return call_op(op, std::span<const Tensor>(inputs.begin(), inputs.size()), attrs);
}
/// The same through a handle to a registered op, without a lookup.
DTensor call_op(Op op, std::span<const DTensor> inputs, const OpAttrs& attrs = {});
/// The same on DTensors given by address, so that a caller holding them
/// apart (the front-end functions) need not copy them into one array.
DTensor call_op(Op op, std::span<const DTensor* const> inputs, const OpAttrs& attrs = {});
Tensor call_op(Op op, std::span<const Tensor> inputs, const OpAttrs& attrs = {});
inline DTensor call_op(Op op, std::initializer_list<DTensor> inputs, const OpAttrs& attrs = {}) {
  return call_op(op, std::span<const DTensor>(inputs.begin(), inputs.size()), attrs);
}
inline Tensor call_op(Op op, std::initializer_list<Tensor> inputs, const OpAttrs& attrs = {}) {
  return call_op(op, std::span<const Tensor>(inputs.begin(), inputs.size()), attrs);
}

namespace detail {
/// A string literal as a template argument (registered_op<"add">).
template <std::size_t N>
struct OpName {
  char text[N];
  constexpr OpName(const char (&name)[N]) {  // NOLINT: implicit from a literal by design
    for (std::size_t i = 0; i < N; ++i) text[i] = name[i];
  }
  constexpr std::string_view view() const { return std::string_view(text, N - 1); }
};
}  // namespace detail

/// The handle of a registered op, looked up by name once (on
/// first use; thread-safe), so that front-end functions called in a loop
/// skip the registry's hash lookup.
template <detail::OpName Name>
Op registered_op() {
  static const Op op = Op::find(Name.view());
  return op;
}

/// Runs `op` on its inputs listed as arguments, all Tensors or all DTensors.
/// DTensors are passed by address (no copies); Tensors go into the kernel's
/// span, as call_op does.
template <TensorOrDTensor X, std::same_as<X>... Xs>
X call_op_on(Op op, const OpAttrs& attrs, const X& x, const Xs&... xs) {
  if constexpr (std::same_as<X, DTensor>) {
    const DTensor* inputs[] = {&x, &xs...};
    return call_op(op, std::span<const DTensor* const>(inputs), attrs);
  } else {
    return call_op(op, {x, xs...}, attrs);
  }
}

/// Counts the collectives a scope issues on one mesh, by kind and bytes
/// (PyTorch's CommDebugMode): counts() is the difference since construction
/// of this rank's communicator counters.
class CommCounter {
 public:
  explicit CommCounter(const DeviceMesh& mesh) : mesh_(mesh), start_(mesh.comm().stats()) {}
  CommStats counts() const { return mesh_.comm().stats() - start_; }
  std::uint64_t count(CollectiveKind kind) const { return counts().count(kind); }

 private:
  DeviceMesh mesh_;
  CommStats start_;
};

/// One line of CommCounterByDims::counts(): `count` calls of `kind`, which
/// received `bytes` on this rank, over the group spanning `mesh_dims`.
struct DimsCount {
  std::vector<int> mesh_dims;           // ascending
  std::vector<std::string> dim_names;   // the mesh's names for mesh_dims; empty when it has none
  CollectiveKind kind = CollectiveKind::AllReduce;
  std::uint64_t count = 0;
  std::uint64_t bytes = 0;
};

/// CommCounter split by the mesh dims each collective ran over (PyTorch's
/// CommDebugMode per process group): the difference since construction of
/// mesh.group_stats(). A collective on dim_comm(1) counts under {1}, one on
/// the mesh's own communicator under all dims.
class CommCounterByDims {
 public:
  explicit CommCounterByDims(const DeviceMesh& mesh) : mesh_(mesh), start_(mesh.group_stats()) {}
  /// One entry per dims and kind with calls since construction, ordered by
  /// dims, then kind (Barrier and Split included).
  std::vector<DimsCount> counts() const;
  /// Calls of `kind` over exactly the dims `mesh_dims` (in any order).
  std::uint64_t count(std::span<const int> mesh_dims, CollectiveKind kind) const;
  std::uint64_t count(std::initializer_list<int> mesh_dims, CollectiveKind kind) const {
    return count(std::span<const int>(mesh_dims.begin(), mesh_dims.size()), kind);
  }

 private:
  std::vector<GroupStats> since_start() const;
  DeviceMesh mesh_;
  std::vector<GroupStats> start_;
};

}  // namespace dtensor

/// "[dp,tp] all_reduce x2 (4 KiB)"; dim indices where the mesh has no names.
template <>
struct fmt::formatter<dtensor::DimsCount> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  fmt::format_context::iterator format(const dtensor::DimsCount& c, fmt::format_context& ctx) const;
};
