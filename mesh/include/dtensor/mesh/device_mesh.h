#pragma once
// DeviceMesh: ranks arranged in 1 to 4 dimensions over a world communicator.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "dtensor/core/shape.h"
#include "dtensor/mesh/communicator.h"

namespace dtensor {

/// The calls a rank made on one group of a mesh: the ranks that differ from
/// it only along `mesh_dims` (ascending, in the numbering of the mesh asked).
struct GroupStats {
  std::vector<int> mesh_dims;
  CommStats stats;
};

class DeviceMesh {
 public:
  /// Collective over `world`: lays its ranks out row-major in `shape` (the
  /// last dim varies fastest) and creates one communicator per mesh dim.
  /// MeshError if the shape does not multiply out to world.size(), has more
  /// than 4 dims or a size < 1, or names are given but not one per dim, empty
  /// or repeated. `world` must outlive the mesh and its copies.
  DeviceMesh(Communicator& world, Shape shape, std::vector<std::string> dim_names = {});

  const Shape& shape() const;
  int ndim() const;
  /// Ranks in the mesh.
  std::int64_t size() const;
  std::int64_t size(int mesh_dim) const;
  const std::vector<std::string>& dim_names() const;
  /// Index of a named dim; MeshError naming it and the known names otherwise.
  int dim_index(std::string_view name) const;

  /// This rank in the mesh's communicator, and its coordinate.
  int rank() const;
  const Shape& coordinate() const;
  Shape coordinate_of(int rank) const;
  int rank_of(std::span<const std::int64_t> coord) const;

  Communicator& comm() const;
  /// Where this mesh's ranks keep their shards: the world communicator's
  /// device (CPU for threads and MPI, CUDA for NCCL and simulated GPU ranks).
  Device device() const { return comm().device(); }
  /// The ranks that differ from this one only along `mesh_dim`, ordered by
  /// their coordinate on it.
  Communicator& dim_comm(int mesh_dim) const;
  /// The ranks that differ from this one only along `mesh_dims`, ordered by
  /// the mixed-radix index of their coordinates taken in the given order (the
  /// first listed dim is the most significant). Created on first use: a
  /// collective over the whole mesh, so every rank asks for the same groups
  /// in the same order (as every rank runs the same plan). One dim gives
  /// dim_comm; cached afterwards.
  Communicator& group_comm(std::span<const int> mesh_dims) const;

  /// This rank's calls on each communicator of the mesh, by the set of mesh
  /// dims it spans (PyTorch's CommDebugMode per process group), sorted by
  /// dims: dim_comm(m) under {m}, each group_comm made so far under its dims
  /// (group_comm({1,0}) joins {0,1}), and the calls issued on the root mesh's
  /// communicator itself under all dims. Counters since each communicator was
  /// made; CommCounterByDims takes differences. The entries add up to
  /// comm().stats() less the calls on communicators outside the mesh (another
  /// mesh's, a user's split). On a submesh, groups that span dims outside it
  /// are left out.
  std::vector<GroupStats> group_stats() const;

  /// The mesh of the named dims (in the given order) through this rank.
  DeviceMesh submesh(std::span<const std::string> names) const;
  DeviceMesh submesh(std::initializer_list<std::string> names) const {
    return submesh(std::span<const std::string>(names.begin(), names.size()));
  }

  /// Same shape and names over the same communicator.
  bool operator==(const DeviceMesh& other) const;

 private:
  struct State;
  explicit DeviceMesh(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

}  // namespace dtensor

/// "dims [0,1]: 3 collectives, 28 KiB received: ...".
template <>
struct fmt::formatter<dtensor::GroupStats> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  fmt::format_context::iterator format(const dtensor::GroupStats& g, fmt::format_context& ctx) const;
};

template <>
struct fmt::formatter<dtensor::DeviceMesh> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  fmt::format_context::iterator format(const dtensor::DeviceMesh& m, fmt::format_context& ctx) const;
};
