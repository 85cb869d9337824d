// Runs several one-collective plans (a collective, then local steps) as one
// collective call. The packed buffers are laid out per rank of the step's
// group (block i holds rank i's piece of every tensor, in the caller's
// order), so the variable-count forms of all_gather and reduce_scatter carry
// uneven and empty shards exactly,
// without padding, and each block is what the per-tensor calls would have
// sent, back to back: the bytes add up to the per-tensor bytes.
#include "dtensor/redistribute/coalesced.h"

#include <algorithm>
#include <vector>

#include <fmt/ranges.h>

#include "dtensor/core/error.h"
#include "dtensor/mesh/detail/trace_recorder.h"
#include "step_context.h"

namespace dtensor {
namespace {

using namespace executor_detail;

// One tensor's part in the call.
struct Member {
  Ctx cx;
  const PlanStep& step;
  const Tensor& local;
};

std::size_t bytes_of(const Box& b, std::size_t isz) { return static_cast<std::size_t>(b.numel()) * isz; }

// Each group rank's box of `layout`, for one member.
std::vector<Box> group_boxes(const Member& m, const Layout& layout, int n) {
  std::vector<Box> boxes(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) boxes[i] = m.cx.box(layout, m.cx.group_coord(m.step.mesh_dims, i));
  return boxes;
}

// All-reduce boxes are the same on every rank of the group (the group's mesh
// dims are Partial), so one packed count fits every rank.
std::vector<Tensor> all_reduce_many(std::span<const Member> ms, Communicator& comm, ReduceOp op) {
  const Tensor& like = ms.front().local;
  const std::size_t isz = ms.front().cx.isz;
  std::size_t total = 0;
  for (const Member& m : ms) total += static_cast<std::size_t>(m.local.numel());
  Tensor buf = scratch(total * isz, like);
  std::size_t at = 0;
  for (const Member& m : ms) {
    if (m.local.numel()) pack_box(m.local, full_box(m.local.shape()), buf.bytes() + at);
    at += static_cast<std::size_t>(m.local.numel()) * isz;
  }
  comm.all_reduce(buf.data(), buf.data(), total, like.dtype(), op);
  // The results are pieces of the reduced buffer, not copies of them: a
  // bucket of gradients costs its bytes once more, not twice.
  std::vector<Tensor> outs;
  std::int64_t offset = 0;
  for (const Member& m : ms) {
    outs.push_back(buf.view(m.local.shape(), offset));
    offset += m.local.numel();
  }
  return outs;
}

std::vector<Tensor> reduce_scatter_many(std::span<const Member> ms, Communicator& comm, ReduceOp op) {
  const int n = comm.size();
  const Tensor& like = ms.front().local;
  const std::size_t isz = ms.front().cx.isz;
  std::vector<std::vector<Box>> pieces;  // [member][group rank]: the box each rank gets
  std::vector<std::size_t> counts(static_cast<std::size_t>(n), 0);
  std::size_t total = 0;
  for (const Member& m : ms) {
    pieces.push_back(group_boxes(m, m.step.to, n));
    for (int i = 0; i < n; ++i) counts[i] += static_cast<std::size_t>(pieces.back()[i].numel());
  }
  for (std::size_t c : counts) total += c;
  Tensor send = scratch(total * isz, like);
  std::size_t at = 0;
  for (int i = 0; i < n; ++i)
    for (std::size_t t = 0; t < ms.size(); ++t) {
      const Box& piece = pieces[t][i];
      if (piece.empty()) continue;
      pack_box(ms[t].local, relative(piece, ms[t].cx.box(ms[t].step.from)), send.bytes() + at);
      at += bytes_of(piece, isz);
    }
  const int me = static_cast<int>(ms.front().cx.group_rank(ms.front().step.mesh_dims));
  Tensor recv = scratch(counts[me] * isz, like);
  comm.reduce_scatter(send.bytes(), recv.bytes(), counts, like.dtype(), op);
  std::vector<Tensor> outs;  // pieces of the received buffer, as in all_reduce_many
  std::int64_t offset = 0;
  for (std::size_t t = 0; t < ms.size(); ++t) {
    outs.push_back(recv.view(pieces[t][me].size, offset));
    offset += pieces[t][me].numel();
  }
  return outs;
}

std::vector<Tensor> all_gather_many(std::span<const Member> ms, Communicator& comm) {
  const int n = comm.size();
  const Tensor& like = ms.front().local;
  const std::size_t isz = ms.front().cx.isz;
  std::vector<std::vector<Box>> pieces;  // [member][group rank]: the box each rank holds
  std::vector<std::size_t> sizes(static_cast<std::size_t>(n), 0);
  for (const Member& m : ms) {
    pieces.push_back(group_boxes(m, m.step.from, n));
    for (int i = 0; i < n; ++i) sizes[i] += bytes_of(pieces.back()[i], isz);
  }
  const int me = static_cast<int>(ms.front().cx.group_rank(ms.front().step.mesh_dims));
  Tensor send = scratch(sizes[me], like);
  std::size_t at = 0;
  for (const Member& m : ms) {
    if (m.local.numel()) pack_box(m.local, full_box(m.local.shape()), send.bytes() + at);
    at += static_cast<std::size_t>(m.local.numel()) * isz;
  }
  std::size_t total = 0;
  for (std::size_t s : sizes) total += s;
  Tensor recv = scratch(total, like);
  comm.all_gather(send.bytes(), recv.bytes(), sizes);
  std::vector<Tensor> outs;
  std::vector<Box> out_boxes;
  for (const Member& m : ms) {
    out_boxes.push_back(m.cx.box(m.step.to));
    outs.push_back(Tensor::empty(out_boxes.back().size, like.dtype(), like.device()));
  }
  at = 0;
  for (int i = 0; i < n; ++i)
    for (std::size_t t = 0; t < ms.size(); ++t) {
      const Box& piece = pieces[t][i];
      if (piece.empty()) continue;
      unpack_box(recv.bytes() + at, outs[t], relative(piece, out_boxes[t]));
      at += bytes_of(piece, isz);
    }
  return outs;
}

void check_signatures(std::span<const Plan* const> plans, std::span<const Tensor> locals,
                      const CollectiveSignature& first) {
  if (plans.size() != locals.size())
    throw ValueError(
        fmt::format("[execute_coalesced] {} plans for {} local shards: expected one each", plans.size(), locals.size()));
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const std::optional<CollectiveSignature> sig = coalescible_signature(*plans[i]);
    if (!sig)
      throw LayoutError(fmt::format("[execute_coalesced] plan {} ({} -> {}, {} steps) is not one coalescible collective",
                                    i, plans[i]->from, plans[i]->to, plans[i]->steps.size()));
    if (*sig != first)
      throw LayoutError(
          fmt::format("[execute_coalesced] plan {} runs {}; plan 0 runs {}: one call needs one collective", i, *sig,
                      first));
  }
}

}  // namespace

std::optional<CollectiveSignature> coalescible_signature(const Plan& plan) {
  if (plan.steps.empty()) return std::nullopt;
  for (std::size_t i = 1; i < plan.steps.size(); ++i)
    if (!is_local(plan.steps[i].kind)) return std::nullopt;
  const PlanStep& s = plan.steps.front();
  switch (s.kind) {
    case StepKind::AllReduce:
    case StepKind::ReduceScatter:
      return CollectiveSignature{s.kind, s.mesh_dims, plan.dtype, partial_op(s.from, s.mesh_dims)};
    case StepKind::AllGather: return CollectiveSignature{s.kind, s.mesh_dims, plan.dtype, std::nullopt};
    default: return std::nullopt;
  }
}

std::vector<Tensor> execute_coalesced(std::span<const Plan* const> plans, const DeviceMesh& mesh,
                                      std::span<const Tensor> locals) {
  if (plans.empty()) throw ValueError("[execute_coalesced] no plans: expected at least one");
  const std::optional<CollectiveSignature> first = coalescible_signature(*plans.front());
  if (!first)
    throw LayoutError(fmt::format("[execute_coalesced] plan 0 ({} -> {}, {} steps) is not one coalescible collective",
                                  plans.front()->from, plans.front()->to, plans.front()->steps.size()));
  check_signatures(plans, locals, *first);
  std::vector<Member> members;
  members.reserve(plans.size());
  for (std::size_t i = 0; i < plans.size(); ++i) {
    check_shard(*plans[i], mesh, locals[i]);
    members.push_back(
        Member{Ctx{*plans[i], mesh, mesh.coordinate(), itemsize(first->dtype)}, plans[i]->steps.front(), locals[i]});
  }
  Communicator& comm = mesh.group_comm(first->mesh_dims);
  // A trace names the one collective that stands for every plan's step.
  std::vector<Tensor> outs = [&] {
    const trace::PlanStepLabel label([&] { return fmt::format("{} plans coalesced: {}", plans.size(), *first); });
    switch (first->kind) {
      case StepKind::AllReduce: return all_reduce_many(members, comm, *first->op);
      case StepKind::ReduceScatter: return reduce_scatter_many(members, comm, *first->op);
      default: return all_gather_many(members, comm);
    }
  }();
  // The local steps after the collective (an all_reduce then a slice, the
  // planner's choice for a small P -> S), each tensor on its own.
  for (std::size_t i = 0; i < members.size(); ++i)
    for (std::size_t k = 1; k < plans[i]->steps.size(); ++k)
      outs[i] = run_step(members[i].cx, plans[i]->steps[k], outs[i]);
  return outs;
}

}  // namespace dtensor

fmt::format_context::iterator fmt::formatter<dtensor::CollectiveSignature>::format(
    const dtensor::CollectiveSignature& s, fmt::format_context& ctx) const {
  if (s.op)
    return fmt::format_to(ctx.out(), "{}({}) on mesh dims [{}] of {}", s.kind, *s.op, fmt::join(s.mesh_dims, ","),
                          s.dtype);
  return fmt::format_to(ctx.out(), "{} on mesh dims [{}] of {}", s.kind, fmt::join(s.mesh_dims, ","), s.dtype);
}
