#pragma once
// What the executors (executor.cpp, executor_coalesced.cpp) share: a step's
// view of this rank (its boxes, its place in a step's group) and the few box
// rules both use. Internal to redistribute/; not installed.
#include <cstdint>
#include <span>
#include <vector>

#include <fmt/ranges.h>

#include "dtensor/core/error.h"
#include "dtensor/core/placement.h"
#include "dtensor/core/tensor.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/redistribute/plan.h"

namespace dtensor::executor_detail {

// Staging bytes on the device of `like` (a CUDA tensor stages in device
// memory, so the communicator moves device buffers).
inline Tensor scratch(std::size_t bytes, const Tensor& like) {
  const std::size_t isz = itemsize(like.dtype());
  return Tensor::empty({static_cast<std::int64_t>((bytes + isz - 1) / isz)}, like.dtype(), like.device());
}

struct Ctx {
  const Plan& plan;
  const DeviceMesh& mesh;
  Shape coord;
  std::size_t isz;

  Box box(const Layout& l, std::span<const std::int64_t> c) const {
    return local_box(plan.mesh_shape, plan.global_shape, l, c);
  }
  Box box(const Layout& l) const { return box(l, coord); }
  // The coordinate of rank i of the group over `dims` (mixed radix, first dim most significant).
  Shape group_coord(const std::vector<int>& dims, std::int64_t i) const {
    Shape c = coord;
    for (int j = static_cast<int>(dims.size()) - 1; j >= 0; --j) {
      std::int64_t n = plan.mesh_shape[dims[j]];
      c[dims[j]] = i % n;
      i /= n;
    }
    return c;
  }
  std::int64_t group_rank(const std::vector<int>& dims) const {
    std::int64_t i = 0;
    for (int m : dims) i = i * plan.mesh_shape[m] + coord[m];
    return i;
  }
};

// Runs one step of a plan on this rank's shard `cur` (executor.cpp): what
// execute_plan does per step, and what the coalesced executor runs for the
// local steps after its packed collective.
Tensor run_step(const Ctx& cx, const PlanStep& s, const Tensor& cur);

// `inner` in the coordinates of `outer`.
inline Box relative(const Box& inner, const Box& outer) {
  Box b = inner;
  for (int d = 0; d < b.ndim(); ++d) b.offset[d] -= outer.offset[d];
  return b;
}

// True when the non-empty pieces, in order, tile `whole` as consecutive
// row-major ranges: every dim before `dim` has size 1 in `whole`, and each
// piece spans `whole` on the other dims and starts where the last ended on `dim`.
inline bool consecutive(const std::vector<Box>& pieces, const Box& whole, std::int64_t dim) {
  for (std::int64_t d = 0; d < dim; ++d)
    if (whole.size[d] != 1) return false;
  std::int64_t at = whole.offset[dim];
  for (const Box& p : pieces) {
    if (p.empty()) continue;
    for (int d = 0; d < whole.ndim(); ++d)
      if (d != dim && (p.offset[d] != whole.offset[d] || p.size[d] != whole.size[d])) return false;
    if (p.offset[dim] != at) return false;
    at += p.size[dim];
  }
  return true;
}

inline ReduceOp partial_op(const Layout& l, const std::vector<int>& dims) {
  for (int m : dims)
    if (auto* q = std::get_if<Partial>(&l[m])) return q->op;
  throw LayoutError(
      fmt::format("[redistribute] internal: step on mesh dims {} of {} has no Partial", fmt::join(dims, ","), l));
}

// The checks execute_plan makes on its input, in its words: the plan is for
// this mesh, the shard has the plan's dtype and the shape `from` gives this rank.
inline void check_shard(const Plan& plan, const DeviceMesh& mesh, const Tensor& local) {
  if (mesh.shape() != plan.mesh_shape)
    throw MeshError(fmt::format("[redistribute] a plan for mesh [{}] run on mesh [{}]", fmt::join(plan.mesh_shape, ","),
                                fmt::join(mesh.shape(), ",")));
  if (local.dtype() != plan.dtype)
    throw DTypeError(
        fmt::format("[redistribute] local shard of dtype {}: the plan is for {}", local.dtype(), plan.dtype));
  const Box box = local_box(plan.mesh_shape, plan.global_shape, plan.from, mesh.coordinate());
  if (local.shape() != box.size)
    throw LayoutError(
        fmt::format("[redistribute] local shard of shape [{}] on rank {} (coordinate [{}]): {} of a [{}] "
                    "tensor gives it shape [{}]",
                    fmt::join(local.shape(), ","), mesh.rank(), fmt::join(mesh.coordinate(), ","), plan.from,
                    fmt::join(plan.global_shape, ","), fmt::join(box.size, ",")));
}

}  // namespace dtensor::executor_detail
