#include "dtensor/api/dtensor_tensor.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "dtensor/core/layout_rules.h"
#include "dtensor/core/error.h"
#include "dtensor/core/hash.h"
#include "dtensor/redistribute/executor.h"
#include "dtensor/redistribute/planner.h"
#include "autograd_engine.h"

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

// Dims of each shape that travel inline in from_local's agreement record; a
// tensor with more takes a second exchange for the rest.
constexpr std::size_t kInlineDims = 8;
// Characters of the layout's text form that travel in the record (the rest
// is compared through its hash and shown as "...").
constexpr std::size_t kLayoutChars = 64;

// What one rank passed to from_local, as a fixed-size record: one all_gather
// of it whatever the ranks passed, so that a disagreement is reported as
// such rather than as a collective whose sizes differ.
struct FromLocalRecord {
  std::int64_t dtype = 0;
  std::int64_t ndim = 0;
  std::int64_t has_global = 0;
  std::uint64_t layout_hash = 0;
  std::array<std::int64_t, kInlineDims> local{};
  std::array<std::int64_t, kInlineDims> global{};
  std::array<char, kLayoutChars> layout{};
};

FromLocalRecord make_record(const Tensor& local, const Layout& placements, const std::optional<Shape>& global_shape) {
  FromLocalRecord r;
  r.dtype = static_cast<std::int64_t>(local.dtype());
  r.ndim = local.dim();
  r.has_global = global_shape ? 1 : 0;
  const std::string text = fmt::format("{}", placements);
  r.layout_hash = fnv1a(text);
  std::copy_n(text.begin(), std::min(text.size(), kLayoutChars - 1), r.layout.begin());
  std::copy_n(local.shape().begin(), std::min(local.shape().size(), kInlineDims), r.local.begin());
  if (global_shape) std::copy_n(global_shape->begin(), std::min(global_shape->size(), kInlineDims), r.global.begin());
  return r;
}

std::string layout_text(const FromLocalRecord& r) {
  std::string text(r.layout.data());
  if (text.size() == kLayoutChars - 1) text += "...";
  return text;
}

// The ranks whose entry differs from rank 0's, "1, 3".
template <class Same>
std::vector<int> differing(std::span<const FromLocalRecord> all, Same same) {
  std::vector<int> ranks;
  for (std::size_t r = 1; r < all.size(); ++r)
    if (!same(all[0], all[r])) ranks.push_back(static_cast<int>(r));
  return ranks;
}

// Every rank's local and global shapes (n * nd values each, in rank order),
// after checking that the ranks agree on the dtype, the number of dims,
// whether a global shape is given, the layout and the global shape: the
// error (the same on every rank) names the argument, rank 0's value, and
// the ranks that differ with theirs.
struct Shapes {
  std::vector<std::int64_t> local;
  std::vector<std::int64_t> global;
};

Shapes agreed_shapes(const Tensor& local, const DeviceMesh& mesh, const Layout& placements,
                     const std::optional<Shape>& global_shape) {
  const auto n = static_cast<std::size_t>(mesh.size());
  const FromLocalRecord mine = make_record(local, placements, global_shape);
  std::vector<FromLocalRecord> all(n);
  mesh.comm().all_gather_host(&mine, all.data(), sizeof mine);
  auto fail = [&](auto make_error, std::string_view what, std::vector<int> ranks, auto value) {
    std::vector<std::string> theirs;
    for (int r : ranks) theirs.push_back(fmt::format("rank {} passes {}", r, value(all[static_cast<std::size_t>(r)])));
    throw make_error(
        fmt::format("[from_local] the ranks disagree on {}: rank 0 passes {}, {}; expected the same on "
                    "every rank",
                    what, value(all[0]), fmt::join(theirs, ", ")));
  };
  auto ranks = differing(all, [](auto& a, auto& b) { return a.dtype == b.dtype; });
  if (!ranks.empty())
    fail([](std::string m) { return DTypeError(m); }, "the dtype of the local tensor", ranks,
         [](const FromLocalRecord& r) { return fmt::format("{}", static_cast<DType>(r.dtype)); });
  ranks = differing(all, [](auto& a, auto& b) { return a.ndim == b.ndim; });
  if (!ranks.empty())
    fail([](std::string m) { return ShapeError(m); }, "the number of dims of the local tensor", ranks,
         [](const FromLocalRecord& r) { return fmt::format("a {}-dim tensor", r.ndim); });
  ranks = differing(all, [](auto& a, auto& b) { return a.has_global == b.has_global; });
  if (!ranks.empty())
    fail([](std::string m) { return ValueError(m); }, "global_shape", ranks,
         [](const FromLocalRecord& r) { return r.has_global ? "one" : "none"; });
  ranks = differing(all, [](auto& a, auto& b) { return a.layout_hash == b.layout_hash; });
  if (!ranks.empty())
    fail([](std::string m) { return LayoutError(m); }, "placements", ranks,
         [](const FromLocalRecord& r) { return layout_text(r); });
  const auto nd = static_cast<std::size_t>(local.dim());
  Shapes shapes{std::vector<std::int64_t>(n * nd), std::vector<std::int64_t>(global_shape ? n * nd : 0)};
  if (nd <= kInlineDims) {
    for (std::size_t r = 0; r < n; ++r) {
      std::copy_n(all[r].local.begin(), nd, shapes.local.begin() + static_cast<std::ptrdiff_t>(r * nd));
      if (global_shape)
        std::copy_n(all[r].global.begin(), nd, shapes.global.begin() + static_cast<std::ptrdiff_t>(r * nd));
    }
  } else {
    mesh.comm().all_gather_host(local.shape().data(), shapes.local.data(), nd * sizeof(std::int64_t));
    // A global shape of another length is caught below as a disagreement.
    if (global_shape) {
      Shape padded(nd, -1);
      std::copy_n(global_shape->begin(), std::min(nd, global_shape->size()), padded.begin());
      mesh.comm().all_gather_host(padded.data(), shapes.global.data(), nd * sizeof(std::int64_t));
    }
  }
  if (global_shape) {
    auto global_of = [&](std::size_t r) { return std::span<const std::int64_t>(shapes.global).subspan(r * nd, nd); };
    ranks.clear();
    for (std::size_t r = 1; r < n; ++r)
      if (!std::ranges::equal(global_of(r), global_of(0)) ||
          all[r].global != all[0].global)  // dims past the tensor's own, when the lengths differ
        ranks.push_back(static_cast<int>(r));
    if (!ranks.empty()) {
      std::vector<std::string> theirs;
      for (int r : ranks) theirs.push_back(fmt::format("rank {} passes {}", r, fmt::join(global_of(r), "x")));
      throw ShapeError(
          fmt::format("[from_local] the ranks disagree on global_shape: rank 0 passes {}, {}; expected "
                      "the same on every rank",
                      fmt::join(global_of(0), "x"), fmt::join(theirs, ", ")));
    }
  }
  return shapes;
}

// Checks that every rank's local shape is the box `layout` gives it in a
// `global` tensor: one ShapeError, the same on every rank, naming each rank
// that differs, its shape and its box.
void check_boxes(const DeviceMesh& mesh, const Layout& layout, const Shape& global,
                 std::span<const std::int64_t> local_shapes, std::string_view hint) {
  const int n = mesh.size();
  const std::size_t nd = global.size();
  std::vector<std::string> wrong;
  for (int r = 0; r < n; ++r) {
    Box b = dtensor::local_box(mesh.shape(), global, layout, mesh.coordinate_of(r));
    auto got = local_shapes.subspan(static_cast<std::size_t>(r) * nd, nd);
    if (!std::ranges::equal(b.size, got))
      wrong.push_back(fmt::format("rank {} holds a {} shard where it should hold {}", r, fmt::join(got, "x"),
                                  fmt::join(b.size, "x")));
  }
  if (!wrong.empty())
    throw ShapeError(fmt::format("[from_local] {} of a {} tensor on mesh {}: {}{}", layout, fmt::join(global, "x"),
                                 fmt::join(mesh.shape(), "x"), fmt::join(wrong, "; "), hint));
}

// Sums the leaves of each sharded dim's split: the global shape the local
// shapes imply.
Shape inferred_global(const DeviceMesh& mesh, const Layout& layout, std::span<const std::int64_t> local_shapes,
                      const Shape& mine) {
  const int n = mesh.size();
  const int nd = static_cast<int>(mine.size());
  Shape global = mine;
  for (int d = 0; d < nd; ++d) {
    std::vector<int> sharding = layout.split_order(d);
    if (sharding.empty()) continue;
    std::int64_t total = 0;
    for (int r = 0; r < n; ++r) {
      Shape c = mesh.coordinate_of(r);
      bool on_axis = true;
      for (int m = 0; m < mesh.ndim(); ++m)
        if (c[m] != 0 && std::find(sharding.begin(), sharding.end(), m) == sharding.end()) on_axis = false;
      if (on_axis) total = checked_add(total, local_shapes[static_cast<std::size_t>(r) * nd + d], "from_local");
    }
    global[d] = total;
  }
  return global;
}

}  // namespace

DTensor::DTensor(Tensor local, DeviceMesh mesh, Layout layout, Shape global_shape, CostModel cost)
    : DTensor(std::move(local), std::move(mesh),
              std::make_shared<const ShardedMeta>(ShardedMeta{std::move(layout), std::move(global_shape)}),
              std::move(cost)) {}

DTensor::DTensor(Tensor local, DeviceMesh mesh, std::shared_ptr<const ShardedMeta> meta, CostModel cost)
    : local_(std::move(local)), mesh_(std::move(mesh)), meta_(std::move(meta)), cost_(std::move(cost)) {}

DTensor DTensor::from_local(Tensor local, const DeviceMesh& mesh, Layout placements, std::optional<Shape> global_shape,
                            FromLocalCheck check) {
  // The shard is kept without its record; the DTensor records the step.
  const Tensor source = local;
  if (local.autograd_meta()) local.set_autograd_meta(nullptr);
  DTensor out = wrap_local(std::move(local), mesh, std::move(placements), std::move(global_shape), check);
  record_from_local(source, out);
  return out;
}

DTensor DTensor::wrap_local(Tensor local, const DeviceMesh& mesh, Layout placements, std::optional<Shape> global_shape,
                            FromLocalCheck check) {
  if (!local.defined()) throw ValueError("[from_local] the local tensor is undefined");
  if (local.device() != mesh.device())
    throw ValueError(
        fmt::format("[from_local] the local tensor is on {} but the mesh keeps its shards on {}; move it "
                    "with to({})",
                    local.device(), mesh.device(), mesh.device()));
  const int nd = local.dim();
  auto check_given = [&] {
    check_shape(*global_shape, "from_local");
    if (static_cast<int>(global_shape->size()) != nd)
      throw ShapeError(fmt::format("[from_local] global shape {} has {} dims, the local tensor {} has {}",
                                   fmt::join(*global_shape, "x"), global_shape->size(), fmt::join(local.shape(), "x"),
                                   nd));
  };
  if (global_shape && check == FromLocalCheck::Trust) {
    check_given();
    Layout layout = validate_layout(placements, mesh.shape(), *global_shape);
    Box b = dtensor::local_box(mesh.shape(), *global_shape, layout, mesh.coordinate());
    if (b.size != local.shape())
      throw ShapeError(fmt::format("[from_local] rank {} passed a {} shard; {} of a {} tensor on mesh {} gives it {}",
                                   mesh.rank(), fmt::join(local.shape(), "x"), layout, fmt::join(*global_shape, "x"),
                                   fmt::join(mesh.shape(), "x"), fmt::join(b.size, "x")));
    return DTensor(std::move(local), mesh, std::move(layout), std::move(*global_shape), CostModel{});
  }
  // Every rank learns what every rank passed first (and checks they agree),
  // so that everything after fails on every rank alike.
  const Shapes shapes = agreed_shapes(local, mesh, placements, global_shape);
  if (global_shape) check_given();
  Layout layout = validate_layout(placements, mesh.shape(), global_shape ? *global_shape : local.shape());
  Shape global = global_shape ? *global_shape : inferred_global(mesh, layout, shapes.local, local.shape());
  check_boxes(mesh, layout, global, shapes.local,
              global_shape ? "" : ": pass global_shape or shards that follow torch.chunk");
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
  before_reading(autograd_);
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
  // The second word also carries whether the source's tensor requires a
  // gradient (bit 32, above any dtype code), so that every rank records the
  // step and runs its backward's gather, at no extra bytes on the wire.
  constexpr std::int64_t kRequiresGradBit = std::int64_t{1} << 32;
  const bool src_requires_grad = is_src && grad_enabled() && full.requires_grad();
  std::int64_t header[2] = {is_src ? full.dim() : 0, (is_src ? static_cast<std::int64_t>(full.dtype()) : 0) |
                                                         (src_requires_grad ? kRequiresGradBit : 0)};
  comm.broadcast_host(header, sizeof header, src_rank);
  Shape global(static_cast<std::size_t>(header[0]));
  if (is_src) global = full.shape();
  comm.broadcast_host(global.data(), global.size() * sizeof(std::int64_t), src_rank);
  const bool requires_grad = (header[1] & kRequiresGradBit) != 0;
  const DType dtype = static_cast<DType>(header[1] & ~kRequiresGradBit);
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
  DTensor out = DTensor::from_local(std::move(local), mesh, layout, global, FromLocalCheck::Trust);
  record_distribute(requires_grad, is_src ? full : Tensor(), out);
  return out;
}

}  // namespace dtensor

fmt::format_context::iterator fmt::formatter<dtensor::DTensor>::format(const dtensor::DTensor& t,
                                                                       fmt::format_context& ctx) const {
  return fmt::format_to(ctx.out(), "DTensor({}, {}, mesh {}, {}, local {})", fmt::join(t.shape(), "x"), t.dtype(),
                        fmt::join(t.mesh().shape(), "x"), t.placements(), fmt::join(t.to_local().shape(), "x"));
}
