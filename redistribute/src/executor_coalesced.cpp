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

// Whether one tensor's pieces, in group rank order, are consecutive row
// ranges covering `whole` (the tensor's box): then its rows are already the
// packed buffer, and the call reads (or writes) the tensor's own bytes with
// no copy (FSDP's flat units, S(0) over the group).
bool rows_in_rank_order(const std::vector<Box>& pieces, const Box& whole) {
  if (whole.ndim() == 0) return false;
  std::int64_t row = whole.offset[0];
  for (const Box& b : pieces) {
    if (b.empty()) continue;
    if (b.offset[0] != row) return false;
    for (int d = 1; d < whole.ndim(); ++d)
      if (b.offset[d] != whole.offset[d] || b.size[d] != whole.size[d]) return false;
    row += b.size[0];
  }
  return row == whole.offset[0] + whole.size[0];
}

// The packed call: its buffers and what unpacking needs afterwards. Built
// before the call, read after it (at once, or when a started call is
// waited for).
struct Packed {
  StepKind kind = StepKind::AllReduce;
  Tensor send, recv;                      // an all_reduce reduces `send` in place
  std::size_t total = 0;                  // all_reduce: elements
  std::vector<std::size_t> counts;        // reduce_scatter: elements per rank; all_gather: bytes per rank
  std::vector<std::vector<Box>> pieces;   // [member][group rank]
  int me = 0;                             // this rank in the group
};

// All-reduce boxes are the same on every rank of the group (the group's mesh
// dims are Partial), so one packed count fits every rank.
Packed pack_all_reduce(std::span<const Member> ms) {
  const Tensor& like = ms.front().local;
  const std::size_t isz = ms.front().cx.isz;
  Packed p;
  p.kind = StepKind::AllReduce;
  for (const Member& m : ms) p.total += static_cast<std::size_t>(m.local.numel());
  p.send = scratch(p.total * isz, like);
  std::size_t at = 0;
  for (const Member& m : ms) {
    if (m.local.numel()) pack_box(m.local, full_box(m.local.shape()), p.send.bytes() + at);
    at += static_cast<std::size_t>(m.local.numel()) * isz;
  }
  return p;
}

// The results are pieces of the reduced buffer, not copies of them: a
// bucket of gradients costs its bytes once more, not twice.
std::vector<Tensor> unpack_all_reduce(const Packed& p, std::span<const Member> ms) {
  std::vector<Tensor> outs;
  std::int64_t offset = 0;
  for (const Member& m : ms) {
    outs.push_back(p.send.view(m.local.shape(), offset));
    offset += m.local.numel();
  }
  return outs;
}

Packed pack_reduce_scatter(std::span<const Member> ms, int n) {
  const Tensor& like = ms.front().local;
  const std::size_t isz = ms.front().cx.isz;
  Packed p;
  p.kind = StepKind::ReduceScatter;
  p.counts.assign(static_cast<std::size_t>(n), 0);
  for (const Member& m : ms) {
    p.pieces.push_back(group_boxes(m, m.step.to, n));
    for (int i = 0; i < n; ++i) p.counts[i] += static_cast<std::size_t>(p.pieces.back()[i].numel());
  }
  for (std::size_t c : p.counts) p.total += c;
  p.me = static_cast<int>(ms.front().cx.group_rank(ms.front().step.mesh_dims));
  p.recv = scratch(p.counts[p.me] * isz, like);
  if (ms.size() == 1 && rows_in_rank_order(p.pieces.front(), ms.front().cx.box(ms.front().step.from))) {
    p.send = like;  // read, never written: the call sends the tensor's rows as they are
    return p;
  }
  p.send = scratch(p.total * isz, like);
  std::size_t at = 0;
  for (int i = 0; i < n; ++i)
    for (std::size_t t = 0; t < ms.size(); ++t) {
      const Box& piece = p.pieces[t][i];
      if (piece.empty()) continue;
      pack_box(ms[t].local, relative(piece, ms[t].cx.box(ms[t].step.from)), p.send.bytes() + at);
      at += bytes_of(piece, isz);
    }
  return p;
}

std::vector<Tensor> unpack_reduce_scatter(const Packed& p, std::span<const Member> ms) {
  std::vector<Tensor> outs;  // pieces of the received buffer, as for all_reduce
  std::int64_t offset = 0;
  for (std::size_t t = 0; t < ms.size(); ++t) {
    outs.push_back(p.recv.view(p.pieces[t][p.me].size, offset));
    offset += p.pieces[t][p.me].numel();
  }
  return outs;
}

Packed pack_all_gather(std::span<const Member> ms, int n) {
  const Tensor& like = ms.front().local;
  const std::size_t isz = ms.front().cx.isz;
  Packed p;
  p.kind = StepKind::AllGather;
  p.counts.assign(static_cast<std::size_t>(n), 0);
  for (const Member& m : ms) {
    p.pieces.push_back(group_boxes(m, m.step.from, n));
    for (int i = 0; i < n; ++i) p.counts[i] += bytes_of(p.pieces.back()[i], isz);
  }
  p.me = static_cast<int>(ms.front().cx.group_rank(ms.front().step.mesh_dims));
  std::size_t total = 0;
  for (std::size_t c : p.counts) total += c;
  p.recv = scratch(total, like);
  if (ms.size() == 1) {
    p.send = like;  // one tensor is its own packed piece (read, never written)
    return p;
  }
  p.send = scratch(p.counts[p.me], like);
  std::size_t at = 0;
  for (const Member& m : ms) {
    if (m.local.numel()) pack_box(m.local, full_box(m.local.shape()), p.send.bytes() + at);
    at += static_cast<std::size_t>(m.local.numel()) * isz;
  }
  return p;
}

std::vector<Tensor> unpack_all_gather(const Packed& p, std::span<const Member> ms) {
  const Tensor& like = ms.front().local;
  const std::size_t isz = ms.front().cx.isz;
  const int n = static_cast<int>(p.counts.size());
  // One tensor whose pieces are rows in rank order: the received buffer is
  // the gathered tensor.
  if (ms.size() == 1 && rows_in_rank_order(p.pieces.front(), ms.front().cx.box(ms.front().step.to)))
    return {p.recv.view(ms.front().cx.box(ms.front().step.to).size, 0)};
  std::vector<Tensor> outs;
  std::vector<Box> out_boxes;
  for (const Member& m : ms) {
    out_boxes.push_back(m.cx.box(m.step.to));
    outs.push_back(Tensor::empty(out_boxes.back().size, like.dtype(), like.device()));
  }
  std::size_t at = 0;
  for (int i = 0; i < n; ++i)
    for (std::size_t t = 0; t < ms.size(); ++t) {
      const Box& piece = p.pieces[t][i];
      if (piece.empty()) continue;
      unpack_box(p.recv.bytes() + at, outs[t], relative(piece, out_boxes[t]));
      at += bytes_of(piece, isz);
    }
  return outs;
}

Packed pack(std::span<const Member> ms, const CollectiveSignature& sig, int n) {
  switch (sig.kind) {
    case StepKind::AllReduce: return pack_all_reduce(ms);
    case StepKind::ReduceScatter: return pack_reduce_scatter(ms, n);
    default: return pack_all_gather(ms, n);
  }
}

// The packed collective, blocking or started (a done handle when blocking).
Work call(Packed& p, Communicator& comm, const CollectiveSignature& sig, bool started) {
  const DType dtype = p.send.dtype();
  switch (p.kind) {
    case StepKind::AllReduce:
      if (started) return comm.start_all_reduce(p.send.data(), p.send.data(), p.total, dtype, *sig.op);
      comm.all_reduce(p.send.data(), p.send.data(), p.total, dtype, *sig.op);
      return Work();
    case StepKind::ReduceScatter:
      if (started) return comm.start_reduce_scatter(p.send.bytes(), p.recv.bytes(), p.counts, dtype, *sig.op);
      comm.reduce_scatter(p.send.bytes(), p.recv.bytes(), p.counts, dtype, *sig.op);
      return Work();
    default:
      if (started) return comm.start_all_gather(p.send.bytes(), p.recv.bytes(), p.counts);
      comm.all_gather(p.send.bytes(), p.recv.bytes(), p.counts);
      return Work();
  }
}

// The outputs after the call, then each plan's local steps (an all_reduce
// then a slice, the planner's choice for a small P -> S), each tensor on its
// own.
std::vector<Tensor> unpack(const Packed& p, std::span<const Member> ms, std::span<const Plan* const> plans) {
  std::vector<Tensor> outs;
  switch (p.kind) {
    case StepKind::AllReduce: outs = unpack_all_reduce(p, ms); break;
    case StepKind::ReduceScatter: outs = unpack_reduce_scatter(p, ms); break;
    default: outs = unpack_all_gather(p, ms); break;
  }
  for (std::size_t i = 0; i < ms.size(); ++i)
    for (std::size_t k = 1; k < plans[i]->steps.size(); ++k) outs[i] = run_step(ms[i].cx, plans[i]->steps[k], outs[i]);
  return outs;
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

namespace {

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

// The members of a call, checked: every plan one collective of the first's
// signature, every shard the plan's.
std::vector<Member> members_of(std::span<const Plan* const> plans, const DeviceMesh& mesh,
                               std::span<const Tensor> locals, CollectiveSignature& first) {
  if (plans.empty()) throw ValueError("[execute_coalesced] no plans: expected at least one");
  const std::optional<CollectiveSignature> sig = coalescible_signature(*plans.front());
  if (!sig)
    throw LayoutError(fmt::format("[execute_coalesced] plan 0 ({} -> {}, {} steps) is not one coalescible collective",
                                  plans.front()->from, plans.front()->to, plans.front()->steps.size()));
  first = *sig;
  check_signatures(plans, locals, first);
  std::vector<Member> members;
  members.reserve(plans.size());
  for (std::size_t i = 0; i < plans.size(); ++i) {
    check_shard(*plans[i], mesh, locals[i]);
    members.push_back(
        Member{Ctx{*plans[i], mesh, mesh.coordinate(), itemsize(first.dtype)}, plans[i]->steps.front(), locals[i]});
  }
  return members;
}

}  // namespace

std::vector<Tensor> execute_coalesced(std::span<const Plan* const> plans, const DeviceMesh& mesh,
                                      std::span<const Tensor> locals) {
  CollectiveSignature sig;
  const std::vector<Member> members = members_of(plans, mesh, locals, sig);
  Communicator& comm = mesh.group_comm(sig.mesh_dims);
  Packed packed = pack(members, sig, comm.size());
  {
    // A trace names the one collective that stands for every plan's step.
    const trace::PlanStepLabel label([&] { return fmt::format("{} plans coalesced: {}", plans.size(), sig); });
    call(packed, comm, sig, false);
  }
  return unpack(packed, members, plans);
}

struct StartedCoalesced::State {
  std::vector<Plan> plans;  // owned: the members refer to them
  std::vector<const Plan*> plan_ptrs;
  std::vector<Tensor> locals;
  CollectiveSignature sig;
  std::vector<Member> members;
  Packed packed;
  Work work;
};

StartedCoalesced start_coalesced(std::span<const Plan* const> plans, const DeviceMesh& mesh,
                                 std::span<const Tensor> locals) {
  auto st = std::make_unique<StartedCoalesced::State>();
  for (const Plan* p : plans) st->plans.push_back(*p);
  for (const Plan& p : st->plans) st->plan_ptrs.push_back(&p);
  st->locals.assign(locals.begin(), locals.end());
  st->members = members_of(st->plan_ptrs, mesh, st->locals, st->sig);
  Communicator& comm = mesh.group_comm(st->sig.mesh_dims);
  st->packed = pack(st->members, st->sig, comm.size());
  st->work = call(st->packed, comm, st->sig, true);
  return StartedCoalesced(std::move(st));
}

StartedCoalesced::StartedCoalesced(std::unique_ptr<State> state) : state_(std::move(state)) {}
StartedCoalesced::StartedCoalesced(StartedCoalesced&&) noexcept = default;
StartedCoalesced& StartedCoalesced::operator=(StartedCoalesced&&) noexcept = default;
StartedCoalesced::~StartedCoalesced() = default;

std::vector<Tensor> StartedCoalesced::finish() {
  if (!state_) throw ValueError("[StartedCoalesced::finish] already finished: each started call finishes once");
  const std::unique_ptr<State> st = std::move(state_);
  {
    const trace::PlanStepLabel label(
        [&] { return fmt::format("{} plans coalesced: {}", st->plans.size(), st->sig); });
    st->work.wait();
  }
  return unpack(st->packed, st->members, st->plan_ptrs);
}

}  // namespace dtensor

fmt::format_context::iterator fmt::formatter<dtensor::CollectiveSignature>::format(
    const dtensor::CollectiveSignature& s, fmt::format_context& ctx) const {
  if (s.op)
    return fmt::format_to(ctx.out(), "{}({}) on mesh dims [{}] of {}", s.kind, *s.op, fmt::join(s.mesh_dims, ","),
                          s.dtype);
  return fmt::format_to(ctx.out(), "{} on mesh dims [{}] of {}", s.kind, fmt::join(s.mesh_dims, ","), s.dtype);
}
