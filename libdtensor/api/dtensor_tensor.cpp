#include "dtensor/api/dtensor_tensor.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "dtensor/core/compact_layout.h"
#include "dtensor/core/error.h"
#include "dtensor/redistribute/executor.h"
#include "dtensor/redistribute/planner.h"
#include "libdtensor/api/autograd_engine.h"

namespace dtensor {
namespace {

// The bytes a rank must be sent when the full tensor is distributed: those
// of its box, or none where it holds zeros (off coordinate 0 of a
// Partial(sum) mesh dim). Asked of holds_zeros, not of the box's size: a
// 0-d box has no size to zero, and emptied that way it still held its one
// element, so every rank got the value.
std::size_t distributed_bytes(const DeviceMesh& mesh, const Layout& layout, const Box& box, int rank,
                              std::size_t itemsize) {
  if (holds_zeros(layout, mesh.coordinate_of(rank))) return 0;
  return static_cast<std::size_t>(byte_size(box.size, itemsize));
}

// Dims of the local shape that travel in from_local's agreement record; a
// tensor with more takes a second exchange for the rest.
constexpr std::size_t kInlineDims = 8;

// from_local's shape exchange: every rank's local shape (n * nd values, in
// rank order), after checking that the ranks agree on the dtype and the
// number of dims (DTypeError / ShapeError naming the first rank that differs
// from rank 0, on every rank alike). One all_gather of a fixed-size record
// (dtype, dims, the first kInlineDims sizes) whatever the ranks passed, so
// that a disagreement is reported as such rather than as a collective whose
// sizes differ.
std::vector<std::int64_t> local_shapes(const Tensor& local, const DeviceMesh& mesh) {
  constexpr std::size_t kRecord = 2 + kInlineDims;
  const auto n = static_cast<std::size_t>(mesh.size());
  const auto nd = static_cast<std::size_t>(local.dim());
  std::array<std::int64_t, kRecord> mine{};
  mine[0] = static_cast<std::int64_t>(local.dtype());
  mine[1] = static_cast<std::int64_t>(nd);
  std::copy_n(local.shape().begin(), std::min(nd, kInlineDims), mine.begin() + 2);
  std::vector<std::int64_t> records(n * kRecord);
  mesh.comm().all_gather_host(mine.data(), records.data(), sizeof(mine));
  auto record = [&](std::size_t r) { return records.data() + r * kRecord; };
  for (std::size_t r = 1; r < n; ++r) {
    if (record(r)[0] != record(0)[0])
      throw DTypeError(
          fmt::format("[from_local] the ranks disagree on the dtype of the local tensor: rank 0 passes {}, rank {} "
                      "passes {}; "
                      "expected one dtype on every rank",
                      static_cast<DType>(record(0)[0]), r, static_cast<DType>(record(r)[0])));
    if (record(r)[1] != record(0)[1])
      throw ShapeError(
          fmt::format("[from_local] the ranks disagree on the number of dims of the local tensor: rank 0 passes a "
                      "{}-dim "
                      "tensor, rank {} passes a {}-dim one; expected the same number on every rank",
                      record(0)[1], r, record(r)[1]));
  }
  std::vector<std::int64_t> all(n * nd);
  if (nd <= kInlineDims) {
    for (std::size_t r = 0; r < n; ++r)
      std::copy_n(record(r) + 2, nd, all.begin() + static_cast<std::ptrdiff_t>(r * nd));
  } else {
    mesh.comm().all_gather_host(local.shape().data(), all.data(), nd * sizeof(std::int64_t));
  }
  return all;
}

}  // namespace

DTensor::DTensor(Tensor local, DeviceMesh mesh, Layout layout, Shape global_shape, CostModel cost)
    : DTensor(std::move(local), std::move(mesh),
              std::make_shared<const ShardedMeta>(ShardedMeta{std::move(layout), std::move(global_shape)}),
              std::move(cost)) {}

DTensor::DTensor(Tensor local, DeviceMesh mesh, std::shared_ptr<const ShardedMeta> meta, CostModel cost)
    : local_(std::move(local)), mesh_(std::move(mesh)), meta_(std::move(meta)), cost_(std::move(cost)) {}

DTensor DTensor::from_local(Tensor local, const DeviceMesh& mesh, Layout placements,
                            std::optional<Shape> global_shape) {
  // The shard is kept without its record; the DTensor records the step.
  const Tensor source = local;
  if (local.autograd_meta()) local.set_autograd_meta(nullptr);
  DTensor out = wrap_local(std::move(local), mesh, std::move(placements), std::move(global_shape));
  record_from_local(source, out);
  return out;
}

DTensor DTensor::wrap_local(Tensor local, const DeviceMesh& mesh, Layout placements,
                            std::optional<Shape> global_shape) {
  if (!local.defined()) throw ValueError("[from_local] the local tensor is undefined");
  if (local.device() != mesh.device())
    throw ValueError(
        fmt::format("[from_local] the local tensor is on {} but the mesh keeps its shards on {}; move it "
                    "with to({})",
                    local.device(), mesh.device(), mesh.device()));
  const int nd = local.dim();
  if (global_shape) check_shape(*global_shape, "from_local");
  // Without a global shape, every rank learns every local shape first (and
  // checks the ranks agree), before anything that could fail on some ranks
  // only.
  const std::vector<std::int64_t> all = global_shape ? std::vector<std::int64_t>{} : local_shapes(local, mesh);
  Layout layout = validate_layout(placements, mesh.shape(), global_shape ? *global_shape : local.shape());
  Shape global;
  if (global_shape) {
    if (static_cast<int>(global_shape->size()) != nd)
      throw ShapeError(fmt::format("[from_local] global shape {} has {} dims, the local tensor {} has {}",
                                   fmt::join(*global_shape, "x"), global_shape->size(), fmt::join(local.shape(), "x"),
                                   nd));
    global = *global_shape;
  } else {
    // Sum the leaves of each sharded dim's split, and check that chunk
    // semantics reproduce every shape.
    const int n = static_cast<int>(mesh.size());
    global = local.shape();
    for (int d = 0; d < nd; ++d) {
      std::vector<int> sharding = layout.split_order(d);
      if (sharding.empty()) continue;
      std::int64_t total = 0;
      for (int r = 0; r < n; ++r) {
        Shape c = mesh.coordinate_of(r);
        bool on_axis = true;
        for (int m = 0; m < mesh.ndim(); ++m)
          if (c[m] != 0 && std::find(sharding.begin(), sharding.end(), m) == sharding.end()) on_axis = false;
        if (on_axis) total += all[static_cast<std::size_t>(r) * nd + d];
      }
      global[d] = total;
    }
    for (int r = 0; r < n; ++r) {
      Box b = dtensor::local_box(mesh.shape(), global, layout, mesh.coordinate_of(r));
      Shape got(all.begin() + static_cast<std::ptrdiff_t>(r) * nd,
                all.begin() + static_cast<std::ptrdiff_t>(r + 1) * nd);
      if (b.size != got)
        throw ShapeError(
            fmt::
                format("[from_local] rank {} holds a {} shard, but {} of a {} tensor gives it {}: pass global_shape or "
                       "shards that follow torch.chunk",
                       r, fmt::join(got, "x"), layout, fmt::join(global, "x"), fmt::join(b.size, "x")));
    }
    return DTensor(std::move(local), mesh, std::move(layout), std::move(global), CostModel{});
  }
  Box b = dtensor::local_box(mesh.shape(), global, layout, mesh.coordinate());
  if (b.size != local.shape())
    throw ShapeError(fmt::format("[from_local] rank {} passed a {} shard; {} of a {} tensor on mesh {} gives it {}",
                                 mesh.rank(), fmt::join(local.shape(), "x"), layout, fmt::join(global, "x"),
                                 fmt::join(mesh.shape(), "x"), fmt::join(b.size, "x")));
  return DTensor(std::move(local), mesh, std::move(layout), std::move(global), CostModel{});
}

Box DTensor::local_box() const { return dtensor::local_box(mesh_.shape(), shape(), placements(), mesh_.coordinate()); }

const Plan& DTensor::plan_to(const Layout& placements) const {
  PlanRequest request{mesh_.shape(),
                      shape(),
                      local_.dtype(),
                      this->placements(),
                      validate_layout(placements, mesh_.shape(), shape()),
                      cost_};
  return cached_plan(request);
}

DTensor DTensor::redistribute(const Layout& placements) const {
  if (placements == this->placements()) return *this;
  const Plan& plan = plan_to(placements);
  Tensor out = execute_plan(plan, mesh_, local_);
  DTensor result(std::move(out), mesh_, plan.to, shape(), cost_);
  record_redistribute(*this, result);
  return result;
}

Tensor DTensor::full_tensor() const { return redistribute(Layout::replicated(mesh_.ndim())).to_local(); }

const ShardedMeta& DTensor::empty_meta() {
  static const ShardedMeta empty{};
  return empty;
}

DTensor DTensor::with_cost_model(CostModel cost) const { return DTensor(local_, mesh_, meta_, std::move(cost)); }

DTensor distribute_tensor(const Tensor& full, const DeviceMesh& mesh, const Layout& placements, int src_rank) {
  Communicator& comm = mesh.comm();
  if (src_rank < 0 || src_rank >= comm.size())
    throw ValueError(
        fmt::format("[distribute_tensor] src_rank {} is not a rank of a mesh of {}", src_rank, comm.size()));
  const bool is_src = comm.rank() == src_rank;
  if (is_src && !full.defined()) throw ValueError("[distribute_tensor] the source rank passed an undefined tensor");
  // The source tells everyone the shape and dtype, so other ranks need not
  // hold (or even know) the full tensor.
  // (The third entry: whether the source's tensor requires a gradient, so
  // that every rank records the step and runs its backward's gather.)
  std::int64_t header[3] = {is_src ? full.dim() : 0, is_src ? static_cast<std::int64_t>(full.dtype()) : 0,
                            is_src && grad_enabled() && full.requires_grad() ? 1 : 0};
  comm.broadcast_host(header, sizeof header, src_rank);
  Shape global(static_cast<std::size_t>(header[0]));
  if (is_src) global = full.shape();
  comm.broadcast_host(global.data(), global.size() * sizeof(std::int64_t), src_rank);
  const DType dtype = static_cast<DType>(header[1]);
  Layout layout = validate_layout(placements, mesh.shape(), global);

  const int n = comm.size();
  const std::size_t is = itemsize(dtype);
  std::vector<std::size_t> bytes(n);
  std::vector<Box> boxes;
  boxes.reserve(n);
  for (int r = 0; r < n; ++r) {
    boxes.push_back(dtensor::local_box(mesh.shape(), global, layout, mesh.coordinate_of(r)));
    bytes[r] = distributed_bytes(mesh, layout, boxes.back(), r, is);
  }
  // The source packs every rank's box back to back on the mesh's device.
  const Device device = mesh.device();
  Tensor packed;
  if (is_src) {
    const Tensor source = full.to(device);
    std::size_t total = 0;
    for (auto b : bytes) total += b;
    packed = Tensor::empty({static_cast<std::int64_t>(total / is)}, dtype, device);
    std::size_t at = 0;
    for (int r = 0; r < n; ++r) {
      if (bytes[r] != 0) pack_box(source, boxes[r], packed.bytes() + at);
      at += bytes[r];
    }
  }
  Tensor local = Tensor::empty(boxes[comm.rank()].size, dtype, device);
  if (bytes[comm.rank()] == 0) local.zero_();
  comm.scatter(is_src ? packed.data() : nullptr, bytes, local.data(), src_rank);
  DTensor out = DTensor::from_local(std::move(local), mesh, layout, global);
  record_distribute(header[2] != 0, is_src ? full : Tensor(), out);
  return out;
}

}  // namespace dtensor

fmt::format_context::iterator fmt::formatter<dtensor::DTensor>::format(const dtensor::DTensor& t,
                                                                       fmt::format_context& ctx) const {
  return fmt::format_to(ctx.out(), "DTensor({}, {}, mesh {}, {}, local {})", fmt::join(t.shape(), "x"), t.dtype(),
                        fmt::join(t.mesh().shape(), "x"), t.placements(), fmt::join(t.to_local().shape(), "x"));
}
