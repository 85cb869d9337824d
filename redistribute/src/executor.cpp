// Runs plan steps. Every step works from boxes (local_box of the step's two
// layouts at this rank and at the other ranks of its group), so the code
// does not depend on how the planner named the layouts.
#include "dtensor/redistribute/executor.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/ranges.h>

#include "dtensor/redistribute/detail/compact_layout.h"
#include "dtensor/core/error.h"
#include "dtensor/mesh/detail/trace_recorder.h"
#include "step_context.h"

namespace dtensor {
namespace {

using namespace executor_detail;

Tensor all_gather(const Ctx& cx, const PlanStep& s, const Tensor& cur) {
  Communicator& comm = cx.mesh.group_comm(s.mesh_dims);
  const int n = comm.size();
  const Box nb = cx.box(s.to);
  Tensor out = Tensor::empty(nb.size, cur.dtype(), cur.device());
  std::vector<Box> pieces(n);
  std::vector<std::size_t> sizes(n);
  for (int i = 0; i < n; ++i) {
    pieces[i] = cx.box(s.from, cx.group_coord(s.mesh_dims, i));
    sizes[i] = static_cast<std::size_t>(pieces[i].numel()) * cx.isz;
  }
  if (consecutive(pieces, nb, s.tensor_dim)) {
    comm.all_gather(cur.data(), out.data(), sizes);
    return out;
  }
  std::size_t total = 0;
  for (auto b : sizes) total += b;
  Tensor staging = scratch(total, cur);
  comm.all_gather(cur.data(), staging.bytes(), sizes);
  std::size_t at = 0;
  for (int i = 0; i < n; ++i) {
    if (sizes[i]) unpack_box(staging.bytes() + at, out, relative(pieces[i], nb));
    at += sizes[i];
  }
  return out;
}

Tensor reduce_scatter(const Ctx& cx, const PlanStep& s, const Tensor& cur) {
  Communicator& comm = cx.mesh.group_comm(s.mesh_dims);
  const int n = comm.size();
  const Box ob = cx.box(s.from);
  std::vector<Box> pieces(n);
  std::vector<std::size_t> counts(n);
  for (int i = 0; i < n; ++i) {
    pieces[i] = cx.box(s.to, cx.group_coord(s.mesh_dims, i));
    counts[i] = static_cast<std::size_t>(pieces[i].numel());
  }
  Tensor out = Tensor::empty(pieces[cx.group_rank(s.mesh_dims)].size, cur.dtype(), cur.device());
  const ReduceOp op = partial_op(s.from, s.mesh_dims);
  if (consecutive(pieces, ob, s.tensor_dim)) {
    comm.reduce_scatter(cur.data(), out.data(), counts, cur.dtype(), op);
    return out;
  }
  Tensor send = scratch(static_cast<std::size_t>(ob.numel()) * cx.isz, cur);
  std::size_t at = 0;
  for (int i = 0; i < n; ++i) {
    if (counts[i]) pack_box(cur, relative(pieces[i], ob), send.bytes() + at);
    at += counts[i] * cx.isz;
  }
  comm.reduce_scatter(send.bytes(), out.data(), counts, cur.dtype(), op);
  return out;
}

Tensor all_reduce(const Ctx& cx, const PlanStep& s, const Tensor& cur) {
  Communicator& comm = cx.mesh.group_comm(s.mesh_dims);
  Tensor out = cur.clone();
  comm.all_reduce(out.data(), out.data(), static_cast<std::size_t>(out.numel()), out.dtype(),
                  partial_op(s.from, s.mesh_dims));
  return out;
}

Tensor all_to_all(const Ctx& cx, const PlanStep& s, const Tensor& cur) {
  Communicator& comm = cx.mesh.group_comm(s.mesh_dims);
  const int n = comm.size();
  const Box ob = cx.box(s.from), nb = cx.box(s.to);
  Tensor out = Tensor::empty(nb.size, cur.dtype(), cur.device());
  std::vector<Box> send_boxes(n), recv_boxes(n);
  std::vector<std::size_t> sb(n), so(n), rb(n), ro(n);
  std::size_t send_total = 0, recv_total = 0;
  for (int i = 0; i < n; ++i) {
    Shape c = cx.group_coord(s.mesh_dims, i);
    send_boxes[i] = intersect(ob, cx.box(s.to, c));
    recv_boxes[i] = intersect(cx.box(s.from, c), nb);
    sb[i] = static_cast<std::size_t>(send_boxes[i].numel()) * cx.isz;
    rb[i] = static_cast<std::size_t>(recv_boxes[i].numel()) * cx.isz;
    so[i] = send_total;
    ro[i] = recv_total;
    send_total += sb[i];
    recv_total += rb[i];
  }
  Tensor send = scratch(send_total, cur), recv = scratch(recv_total, cur);
  for (int i = 0; i < n; ++i)
    if (sb[i]) pack_box(cur, relative(send_boxes[i], ob), send.bytes() + so[i]);
  comm.all_to_all(send.bytes(), sb, so, recv.bytes(), rb, ro);
  for (int i = 0; i < n; ++i)
    if (rb[i]) unpack_box(recv.bytes() + ro[i], out, relative(recv_boxes[i], nb));
  return out;
}

Tensor exchange(const Ctx& cx, const PlanStep& s, const Tensor& cur) {
  const int me = cx.mesh.rank();
  const Box ob = cx.box(s.from), nb = cx.box(s.to);
  // Ranks off coordinate 0 of a target Partial(sum) dim hold zeros.
  const bool needs = !holds_zeros(s.to, cx.coord);
  Tensor out =
      needs ? Tensor::empty(nb.size, cur.dtype(), cur.device()) : Tensor::zeros(nb.size, cur.dtype(), cur.device());
  const bool remote =
      std::any_of(s.blocks.begin(), s.blocks.end(), [](const ExchangeBlock& b) { return b.src_rank != b.dst_rank; });
  for (const ExchangeBlock& b : s.blocks)
    if (b.src_rank == me && b.dst_rank == me) copy_box(cur, relative(b.box, ob), out, relative(b.box, nb).offset);
  if (!remote) return out;

  Communicator& comm = cx.mesh.comm();
  const int n = comm.size();
  std::vector<std::size_t> sb(n, 0), so(n, 0), rb(n, 0), ro(n, 0);
  // Blocks are sorted by (dst, src, offset): both sides walk them in that order.
  for (const ExchangeBlock& b : s.blocks) {
    if (b.src_rank == b.dst_rank) continue;
    const auto bytes = static_cast<std::size_t>(b.box.numel()) * cx.isz;
    if (b.src_rank == me) sb[b.dst_rank] += bytes;
    if (b.dst_rank == me) rb[b.src_rank] += bytes;
  }
  std::size_t send_total = 0, recv_total = 0;
  for (int p = 0; p < n; ++p) {
    so[p] = send_total;
    ro[p] = recv_total;
    send_total += sb[p];
    recv_total += rb[p];
  }
  Tensor send = scratch(send_total, cur), recv = scratch(recv_total, cur);
  std::vector<std::size_t> put = so;
  for (const ExchangeBlock& b : s.blocks)
    if (b.src_rank == me && b.dst_rank != me) {
      pack_box(cur, relative(b.box, ob), send.bytes() + put[b.dst_rank]);
      put[b.dst_rank] += static_cast<std::size_t>(b.box.numel()) * cx.isz;
    }
  comm.all_to_all(send.bytes(), sb, so, recv.bytes(), rb, ro);
  std::vector<std::size_t> get = ro;
  for (const ExchangeBlock& b : s.blocks)
    if (b.dst_rank == me && b.src_rank != me) {
      unpack_box(recv.bytes() + get[b.src_rank], out, relative(b.box, nb));
      get[b.src_rank] += static_cast<std::size_t>(b.box.numel()) * cx.isz;
    }
  return out;
}

}  // namespace

namespace executor_detail {

Tensor run_step(const Ctx& cx, const PlanStep& s, const Tensor& cur) {
  switch (s.kind) {
    case StepKind::AllGather: return all_gather(cx, s, cur);
    case StepKind::AllReduce: return all_reduce(cx, s, cur);
    case StepKind::ReduceScatter: return reduce_scatter(cx, s, cur);
    case StepKind::AllToAll: return all_to_all(cx, s, cur);
    case StepKind::Exchange: return exchange(cx, s, cur);
    case StepKind::Slice: {
      const Box nb = cx.box(s.to);
      if (nb.empty()) return Tensor::empty(nb.size, cur.dtype(), cur.device());  // empty shards may sit past the end
      return slice_box(cur, relative(nb, cx.box(s.from)));
    }
    case StepKind::ZeroFill:
      for (int m : s.mesh_dims)
        if (cx.coord[m] != 0) return Tensor::zeros(cur.shape(), cur.dtype(), cur.device());
      return cur;
    case StepKind::Relabel: return cur;
  }
  return cur;
}

}  // namespace executor_detail

Tensor execute_plan(const Plan& plan, const DeviceMesh& mesh, const Tensor& local) {
  check_shard(plan, mesh, local);
  Ctx cx{plan, mesh, mesh.coordinate(), itemsize(plan.dtype)};
  Tensor cur = local;
  for (const PlanStep& s : plan.steps) {
    // A trace names the step behind each collective (formatted only when recording).
    const trace::PlanStepLabel label([&] { return fmt::format("{}", s); });
    cur = run_step(cx, s, cur);
  }
  return cur;
}

}  // namespace dtensor
