#include "dtensor/mesh/device_mesh.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtensor/core/error.h"
#include "dtensor/mesh/detail/trace_recorder.h"

namespace dtensor {
namespace {

std::string shape_text(std::span<const std::int64_t> shape) { return fmt::format("{}", fmt::join(shape, "x")); }

// How a trace labels the collectives of one group: "mesh 2x2 dims [1]".
std::string group_label(std::span<const std::int64_t> shape, std::span<const int> dims) {
  return fmt::format("mesh {} dims [{}]", shape_text(shape), fmt::join(dims, ","));
}

// The world ranks of the group over `dims` that holds the rank at `coord`,
// in the order of their ranks in the group: the mixed-radix index of their
// coordinates on `dims` (the first dim most significant), as make_group
// keys them; the world numbers a mesh's ranks row-major.
std::vector<int> group_members(std::span<const std::int64_t> shape, std::span<const std::int64_t> coord,
                               std::span<const int> dims) {
  std::int64_t count = 1;
  for (int d : dims) count *= shape[static_cast<std::size_t>(d)];
  std::vector<int> out;
  out.reserve(static_cast<std::size_t>(count));
  Shape at(coord.begin(), coord.end());
  for (std::int64_t k = 0; k < count; ++k) {
    std::int64_t rest = k;
    for (std::size_t i = dims.size(); i-- > 0;) {
      const auto d = static_cast<std::size_t>(dims[i]);
      at[d] = rest % shape[d];
      rest /= shape[d];
    }
    out.push_back(static_cast<int>(ravel_index(at, shape)));
  }
  return out;
}

// The communicators of one mesh as built on one rank, shared by the mesh, its
// copies and its submeshes (a submesh's groups are groups of the root mesh).
struct MeshRoot {
  Communicator* world = nullptr;
  Shape shape;
  Shape coord;
  std::vector<std::unique_ptr<Communicator>> dim_comms;
  std::mutex mu;
  std::map<std::vector<int>, std::unique_ptr<Communicator>> groups;

  // The ranks that differ from this one only along `dims` (validated, root
  // numbering), ordered by the mixed-radix index of their coordinates.
  std::unique_ptr<Communicator> make_group(std::span<const int> dims) const {
    std::vector<bool> in_group(shape.size(), false);
    for (int d : dims) in_group[static_cast<std::size_t>(d)] = true;
    std::int64_t color = 0, key = 0;
    for (std::size_t d = 0; d < shape.size(); ++d)
      if (!in_group[d]) color = color * shape[d] + coord[d];
    for (int d : dims) key = key * shape[static_cast<std::size_t>(d)] + coord[static_cast<std::size_t>(d)];
    return world->split(static_cast<int>(color), static_cast<int>(key));
  }

  Communicator& group(std::span<const int> dims) {
    if (dims.size() == 1) return *dim_comms[static_cast<std::size_t>(dims[0])];
    bool identity = dims.size() == shape.size();
    for (std::size_t i = 0; identity && i < dims.size(); ++i) identity = dims[i] == static_cast<int>(i);
    if (identity) return *world;
    std::lock_guard lock(mu);
    std::vector<int> key(dims.begin(), dims.end());
    auto it = groups.find(key);
    if (it == groups.end()) {
      it = groups.emplace(std::move(key), make_group(dims)).first;
      if (trace::current != nullptr)
        trace::current->name_group(&it->second->own_stats(), group_label(shape, dims),
                                      group_members(shape, coord, dims));
    }
    return *it->second;
  }

  // Every communicator of the mesh with the root dims it spans, each once:
  // group() hands out the world for all dims in order and dim_comms for one.
  std::vector<std::pair<std::vector<int>, const Communicator*>> communicators() {
    std::vector<std::pair<std::vector<int>, const Communicator*>> out;
    std::vector<int> all(shape.size());
    for (std::size_t d = 0; d < all.size(); ++d) all[d] = static_cast<int>(d);
    out.emplace_back(std::move(all), world);
    for (std::size_t d = 0; d < dim_comms.size(); ++d)
      out.emplace_back(std::vector<int>{static_cast<int>(d)}, dim_comms[d].get());
    std::lock_guard lock(mu);
    for (const auto& [dims, comm] : groups) out.emplace_back(dims, comm.get());
    return out;
  }
};

}  // namespace

struct DeviceMesh::State {
  std::shared_ptr<MeshRoot> root;
  Communicator* comm = nullptr;
  Shape shape;
  std::vector<std::string> names;
  std::vector<int> root_dims;  // the root mesh dim behind each of this mesh's dims
  int rank = 0;
  Shape coord;

  void check_dim(int mesh_dim, std::string_view where) const {
    if (mesh_dim < 0 || mesh_dim >= static_cast<int>(shape.size()))
      throw MeshError(fmt::format("[mesh] {}: mesh dim {} out of range for the {}-d mesh {}", where, mesh_dim,
                                  shape.size(), shape_text(shape)));
  }
  // The root dims in this mesh's numbering, ascending; nullopt when one of
  // them is not a dim of this mesh.
  std::optional<std::vector<int>> from_root(std::span<const int> dims) const {
    std::vector<int> out;
    for (int d : dims) {
      const auto it = std::find(root_dims.begin(), root_dims.end(), d);
      if (it == root_dims.end()) return std::nullopt;
      out.push_back(static_cast<int>(it - root_dims.begin()));
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  std::vector<int> to_root(std::span<const int> dims, std::string_view where) const {
    std::vector<int> out;
    out.reserve(dims.size());
    for (std::size_t i = 0; i < dims.size(); ++i) {
      check_dim(dims[i], where);
      if (std::find(dims.begin(), dims.begin() + static_cast<std::ptrdiff_t>(i), dims[i]) !=
          dims.begin() + static_cast<std::ptrdiff_t>(i))
        throw MeshError(
            fmt::format("[mesh] {}: mesh dim {} is listed twice in [{}]", where, dims[i], fmt::join(dims, ", ")));
      out.push_back(root_dims[static_cast<std::size_t>(dims[i])]);
    }
    return out;
  }
};

DeviceMesh::DeviceMesh(std::shared_ptr<State> state) : state_(std::move(state)) {}

DeviceMesh::DeviceMesh(Communicator& world, Shape shape, std::vector<std::string> dim_names) {
  const auto text = shape_text(shape);
  if (shape.empty() || shape.size() > 4)
    throw MeshError(fmt::format("[mesh] shape '{}' has {} dims; expected 1 to 4", text, shape.size()));
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (shape[d] < 1)
      throw MeshError(fmt::format("[mesh] shape {} has size {} in dim {}; expected sizes >= 1", text, shape[d], d));
  const std::optional<std::int64_t> product = checked_product(shape);
  if (!product)
    throw MeshError(
        fmt::format("[mesh] shape {} has more ranks than fit in int64; the world has {}", text, world.size()));
  const std::int64_t ranks = *product;
  if (ranks != world.size())
    throw MeshError(fmt::format("[mesh] shape {} has {} ranks but the world has {}", text, ranks, world.size()));
  if (!dim_names.empty()) {
    if (dim_names.size() != shape.size())
      throw MeshError(fmt::format("[mesh] {} dim names ({}) for the {}-d shape {}; expected one per dim",
                                  dim_names.size(), fmt::join(dim_names, ","), shape.size(), text));
    for (std::size_t d = 0; d < dim_names.size(); ++d) {
      if (dim_names[d].empty())
        throw MeshError(fmt::format("[mesh] dim name {} of ({}) is empty; expected a non-empty name", d,
                                    fmt::join(dim_names, ",")));
      for (std::size_t e = 0; e < d; ++e)
        if (dim_names[e] == dim_names[d])
          throw MeshError(fmt::format("[mesh] dim name '{}' is repeated in ({}); expected distinct names", dim_names[d],
                                      fmt::join(dim_names, ",")));
    }
  }

  auto root = std::make_shared<MeshRoot>();
  root->world = &world;
  root->shape = shape;
  root->coord = unravel_index(world.rank(), shape);
  for (std::size_t m = 0; m < shape.size(); ++m) {
    const int dim = static_cast<int>(m);
    root->dim_comms.push_back(root->make_group(std::span<const int>(&dim, 1)));
  }

  auto state = std::make_shared<State>();
  state->root = root;
  state->comm = &world;
  state->shape = std::move(shape);
  state->names = std::move(dim_names);
  for (std::size_t m = 0; m < state->shape.size(); ++m) state->root_dims.push_back(static_cast<int>(m));
  state->rank = world.rank();
  state->coord = root->coord;
  state_ = std::move(state);
  if (trace::current != nullptr) trace::name_mesh(*trace::current, *this, /*replace=*/false);
}

const Shape& DeviceMesh::shape() const { return state_->shape; }
int DeviceMesh::ndim() const { return static_cast<int>(state_->shape.size()); }
std::int64_t DeviceMesh::size() const { return numel(state_->shape); }
std::int64_t DeviceMesh::size(int mesh_dim) const {
  state_->check_dim(mesh_dim, "size");
  return state_->shape[static_cast<std::size_t>(mesh_dim)];
}
const std::vector<std::string>& DeviceMesh::dim_names() const { return state_->names; }

int DeviceMesh::dim_index(std::string_view name) const {
  const auto& names = state_->names;
  for (std::size_t d = 0; d < names.size(); ++d)
    if (names[d] == name) return static_cast<int>(d);
  if (names.empty())
    throw MeshError(
        fmt::format("[mesh] no dim named '{}': the mesh {} has no dim names", name, shape_text(state_->shape)));
  throw MeshError(fmt::format("[mesh] no dim named '{}'; the mesh has dims {}", name, fmt::join(names, ",")));
}

int DeviceMesh::rank() const { return state_->rank; }
const Shape& DeviceMesh::coordinate() const { return state_->coord; }

Shape DeviceMesh::coordinate_of(int rank) const {
  if (rank < 0 || rank >= size())
    throw MeshError(fmt::format("[mesh] coordinate_of: rank {} is not in the mesh {} of {} ranks", rank,
                                shape_text(state_->shape), size()));
  return unravel_index(rank, state_->shape);
}

int DeviceMesh::rank_of(std::span<const std::int64_t> coord) const {
  const auto& shape = state_->shape;
  if (coord.size() != shape.size())
    throw MeshError(fmt::format("[mesh] rank_of: coordinate ({}) has {} entries for the {}-d mesh {}",
                                fmt::join(coord, ","), coord.size(), shape.size(), shape_text(shape)));
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (coord[d] < 0 || coord[d] >= shape[d])
      throw MeshError(fmt::format("[mesh] rank_of: coordinate ({}) is outside the mesh {} in dim {}",
                                  fmt::join(coord, ","), shape_text(shape), d));
  return static_cast<int>(ravel_index(coord, shape));
}

Communicator& DeviceMesh::comm() const { return *state_->comm; }

Communicator& DeviceMesh::dim_comm(int mesh_dim) const {
  state_->check_dim(mesh_dim, "dim_comm");
  return *state_->root->dim_comms[static_cast<std::size_t>(state_->root_dims[static_cast<std::size_t>(mesh_dim)])];
}

Communicator& DeviceMesh::group_comm(std::span<const int> mesh_dims) const {
  const auto dims = state_->to_root(mesh_dims, "group_comm");
  return state_->root->group(dims);
}

std::vector<GroupStats> DeviceMesh::group_stats() const {
  // Sets of dims, not orders: a 1-d mesh's dim_comm and world, or
  // group_comm({1,0}) and group_comm({0,1}), move data over the same ranks.
  std::map<std::vector<int>, CommStats> by_dims;
  for (const auto& [root_dims, comm] : state_->root->communicators())
    if (auto dims = state_->from_root(root_dims)) by_dims[*dims] = by_dims[*dims] + comm->own_stats();
  std::vector<GroupStats> out;
  out.reserve(by_dims.size());
  for (auto& [dims, stats] : by_dims) out.push_back({dims, stats});
  return out;
}

DeviceMesh DeviceMesh::submesh(std::span<const std::string> names) const {
  for (std::size_t i = 0; i < names.size(); ++i)
    if (std::find(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(i), names[i]) !=
        names.begin() + static_cast<std::ptrdiff_t>(i))
      throw MeshError(
          fmt::format("[mesh] submesh of ({}): '{}' is listed twice; expected distinct names of the "
                      "mesh dims {}",
                      fmt::join(names, ","), names[i], fmt::join(state_->names, ",")));
  if (names.empty() || names.size() > state_->shape.size())
    throw MeshError(fmt::format("[mesh] submesh of ({}) from the mesh with dims {}; expected 1 to {} dim names",
                                fmt::join(names, ","), fmt::join(state_->names, ","), state_->shape.size()));
  std::vector<int> dims;
  for (const auto& name : names) dims.push_back(dim_index(name));
  auto root_dims = state_->to_root(dims, "submesh");

  auto state = std::make_shared<State>();
  state->root = state_->root;
  state->comm = &state_->root->group(root_dims);
  for (int d : dims) {
    state->shape.push_back(state_->shape[static_cast<std::size_t>(d)]);
    state->coord.push_back(state_->coord[static_cast<std::size_t>(d)]);
  }
  state->names.assign(names.begin(), names.end());
  state->root_dims = std::move(root_dims);
  state->rank = state->comm->rank();
  return DeviceMesh(std::move(state));
}

bool DeviceMesh::operator==(const DeviceMesh& other) const {
  return state_ == other.state_ || (state_->comm == other.state_->comm && state_->shape == other.state_->shape &&
                                    state_->names == other.state_->names);
}

}  // namespace dtensor

fmt::format_context::iterator fmt::formatter<dtensor::GroupStats>::format(const dtensor::GroupStats& g,
                                                                          fmt::format_context& ctx) const {
  return fmt::format_to(ctx.out(), "dims [{}]: {}", fmt::join(g.mesh_dims, ","), g.stats);
}

fmt::format_context::iterator fmt::formatter<dtensor::DeviceMesh>::format(const dtensor::DeviceMesh& m,
                                                                          fmt::format_context& ctx) const {
  if (m.dim_names().empty()) return fmt::format_to(ctx.out(), "DeviceMesh({})", fmt::join(m.shape(), "x"));
  return fmt::format_to(ctx.out(), "DeviceMesh({}, dims={})", fmt::join(m.shape(), "x"), fmt::join(m.dim_names(), ","));
}

namespace dtensor::trace {

void name_mesh(Recorder& recorder, const DeviceMesh& mesh, bool replace) {
  const auto& shape = mesh.shape();
  std::vector<int> all(shape.size());
  for (std::size_t d = 0; d < all.size(); ++d) all[d] = static_cast<int>(d);
  // The mesh's own communicator counts under all its dims, as in group_stats.
  const auto& coord = mesh.coordinate();
  recorder.name_group(&mesh.comm().own_stats(), group_label(shape, all), group_members(shape, coord, all));
  for (int d = 0; d < mesh.ndim(); ++d) {
    const std::span<const int> dim(&d, 1);
    recorder.name_group(&mesh.dim_comm(d).own_stats(), group_label(shape, dim), group_members(shape, coord, dim));
  }
  recorder.name_process(
      fmt::format("rank {} at [{}] of mesh {}", mesh.rank(), fmt::join(mesh.coordinate(), ","), shape_text(shape)),
      replace);
}

}  // namespace dtensor::trace
