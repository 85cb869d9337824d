// The MoE layer on DTensors: expert parallelism by all_to_allv over the
// mesh dim the experts are split on, tensor-parallel experts, and the
// balancing statistics summed over the ranks that hold different tokens.
//
// Each rank routes its own tokens (the router is replicated), so the plan is
// local; only the rows move. One forward, on an ep dim of e ranks:
//   count exchange  all_to_all of E int64 (the rows this rank sends each
//                   of every peer's experts)
//   dispatch        all_to_allv of the rows, grouped by destination
//   experts         one GEMM pair per local expert over its rows
//   combine         all_to_allv of the results back, then the local combine
// and its backward runs the two all_to_allv the other way (no count
// exchange: the plan is kept). The gradient layouts say who holds what
// (grad_layout below), so the optimizer's redistribution reduces each
// gradient over exactly the ranks that hold a copy: an expert's over the
// token dims it is replicated on (its expert-data-parallel group), never
// over ep.
#include <algorithm>
#include <functional>
#include <numeric>
#include <string>

#include <fmt/format.h>

#include "dtensor/api/autograd.h"
#include "dtensor/api/embedding.h"
#include "dtensor/api/shape_ops.h"
#include "dtensor/api/trace.h"
#include "dtensor/core/error.h"
#include "moe_detail.h"

namespace dtensor::nn::detail {
namespace {

// The mesh dims the layer's layouts name: the experts split on dim 0 over
// `ep` and on their hidden features over `tp`, the tokens split by batch
// over `token_dims` (ep among them).
struct MoEDims {
  int ep = -1, tp = -1;
  std::vector<int> token_dims;
  bool splits_tokens(int d) const { return std::find(token_dims.begin(), token_dims.end(), d) != token_dims.end(); }
};

Layout with_each(int ndim, const std::function<Placement(int)>& at) {
  std::vector<Placement> out;
  for (int d = 0; d < ndim; ++d) out.push_back(at(d));
  return Layout(std::move(out));
}

// Where each weight must be: experts S(0) over ep, their hidden features
// over tp (fc [E, H, D] and its bias on dim 1, proj [E, D, H] on dim 2),
// everything else replicated.
Layout compute_layout(const MoEDims& dims, int ndim, std::int64_t hidden_dim, bool expert) {
  return with_each(ndim, [&](int d) -> Placement {
    if (expert && d == dims.ep) return Shard{0};
    if (expert && d == dims.tp && hidden_dim >= 0) return Shard{hidden_dim};
    return Replicate{};
  });
}

// The layout a weight's local gradient has: complete where the weight is
// split (ep: the rows of every ep rank came to its experts; tp: its slice),
// Partial over the dims whose ranks saw different tokens, and Partial over
// tp for what only tp's first rank adds (the experts' output bias).
Layout grad_layout(const Layout& weight, const MoEDims& dims, bool partial_over_tp) {
  return with_each(weight.mesh_ndim(), [&](int d) -> Placement {
    if (is_shard(weight[d])) return weight[d];
    if (dims.splits_tokens(d) || (partial_over_tp && d == dims.tp)) return Partial{};
    return Replicate{};
  });
}

MoEDims read_dims(const MoE<DTensor>& m, const DTensor& x) {
  const int ndim = x.mesh().ndim();
  if (x.dim() != 3)
    throw ShapeError(fmt::format("[MoE] x of shape {}; expected [B, T, D]", fmt::join(x.shape(), "x")));
  MoEDims dims;
  for (int d = 0; d < ndim; ++d) {
    const Placement& p = m.fc_weight.placements()[d];
    int* slot = is_shard(p, 0) ? &dims.ep : is_shard(p, 1) ? &dims.tp : nullptr;
    if (!is_replicate(p) && (!slot || *slot >= 0))
      throw LayoutError(fmt::format("[MoE] experts.fc.weight in layout {}; expected S(0) on at most one mesh dim "
                                    "(ep), S(1) on at most one (tp), R elsewhere",
                                    m.fc_weight.placements()));
    if (slot) *slot = d;
  }
  for (int d = 0; d < ndim; ++d) {
    const Placement& p = x.placements()[d];
    if (is_shard(p, 0) && d != dims.tp) {
      dims.token_dims.push_back(d);
    } else if (!is_replicate(p)) {
      throw LayoutError(fmt::format("[MoE] x in layout {}; expected S(0) (the batch) or R on each mesh dim, R on "
                                    "tp (dim {})",
                                    x.placements(), dims.tp));
    }
  }
  // Tokens replicated over ep (generation, whose one sequence every rank
  // holds): each rank sends its copy to the experts and gets its own answer
  // back. Only without a gradient: the experts would sum ep equal copies.
  const bool recording = grad_enabled() && (x.requires_grad() || m.router.requires_grad() ||
                                            m.fc_weight.requires_grad() || m.proj_weight.requires_grad());
  if (dims.ep >= 0 && !dims.splits_tokens(dims.ep) && recording)
    throw LayoutError(fmt::format("[MoE] x in layout {} with the experts split over mesh dim {}, recording a "
                                  "gradient; expected the tokens split there too (S(0)): ep borrows data-parallel "
                                  "ranks (replicated tokens run only without a gradient, as in generation)",
                                  x.placements(), dims.ep));
  const std::int64_t experts = m.config.experts;
  if (dims.ep >= 0 && experts % x.mesh().size(dims.ep) != 0)
    throw ValueError(fmt::format("[MoE] {} experts over an ep dim of {} ranks; expected a multiple of {}", experts,
                                 x.mesh().size(dims.ep), x.mesh().size(dims.ep)));
  const std::pair<const DTensor*, Layout> expected[] = {
      {&m.router, compute_layout(dims, ndim, -1, false)},
      {&m.fc_weight, compute_layout(dims, ndim, 1, true)},
      {&m.fc_bias, compute_layout(dims, ndim, 1, true)},
      {&m.proj_weight, compute_layout(dims, ndim, 2, true)},
      {&m.proj_bias, compute_layout(dims, ndim, -1, true)}};
  const char* names[] = {"router.weight", "experts.fc.weight", "experts.fc.bias", "experts.proj.weight",
                         "experts.proj.bias"};
  for (std::size_t i = 0; i < std::size(expected); ++i)
    if (expected[i].first->placements() != expected[i].second)
      throw LayoutError(fmt::format("[MoE] {} in layout {}; expected {} beside experts.fc.weight's {}", names[i],
                                    expected[i].first->placements(), expected[i].second,
                                    m.fc_weight.placements()));
  return dims;
}

// all_to_allv of rows [n, W]: send_rows[p] consecutive rows to peer p,
// recv_rows[p] from it, in peer order.
Tensor exchange_rows(const Tensor& rows, std::span<const std::int64_t> send_rows,
                     std::span<const std::int64_t> recv_rows, Communicator& comm) {
  const std::int64_t width = rows.shape()[1];
  const std::size_t row_bytes = static_cast<std::size_t>(width) * itemsize(rows.dtype());
  const auto peers = static_cast<std::size_t>(comm.size());
  std::vector<std::size_t> send_bytes(peers), send_offsets(peers), recv_bytes(peers), recv_offsets(peers);
  std::size_t sent = 0, received = 0;
  for (std::size_t p = 0; p < peers; ++p) {
    send_offsets[p] = sent;
    send_bytes[p] = static_cast<std::size_t>(send_rows[p]) * row_bytes;
    sent += send_bytes[p];
    recv_offsets[p] = received;
    recv_bytes[p] = static_cast<std::size_t>(recv_rows[p]) * row_bytes;
    received += recv_bytes[p];
  }
  if (sent != rows.nbytes())
    throw ValueError(fmt::format("[MoE] {} rows to send, the splits name {}", rows.shape()[0], sent / row_bytes));
  Tensor out = Tensor::empty({static_cast<std::int64_t>(received / row_bytes), width}, rows.dtype(), rows.device());
  comm.all_to_all(rows.data(), send_bytes, send_offsets, out.data(), recv_bytes, recv_offsets);
  return out;
}

// Identity forward; the backward sums the gradient over `comm` (the gates
// under tp: each tp rank's combine sees only its part of the experts' sum).
Tensor sum_gradient_over(const Tensor& t, Communicator& comm) {
  Communicator* group = &comm;
  return record_custom("moe gates (sum over tp)", std::span<const Tensor>(&t, 1), t.detach(),
                       [group](const Tensor& g) -> std::vector<std::optional<Tensor>> {
                         Tensor out = Tensor::empty(g.shape(), g.dtype(), g.device());
                         group->all_reduce(g.data(), out.data(), static_cast<std::size_t>(g.numel()), g.dtype(),
                                           ReduceOp::Sum);
                         return {out};
                       });
}

struct LocalExperts {
  Tensor fc_w, fc_b, proj_w, proj_b;
};

// What the dispatch knows once the counts are exchanged: rows per peer each
// way, rows per local expert, and the permutation from the received order
// (by source, then expert) to the experts' (by expert, then source).
struct Exchange {
  std::vector<std::int64_t> send_rows, recv_rows, expert_rows;
  std::vector<std::int64_t> by_expert;  // by_expert[i]: the received row at position i of the experts' order
  bool permuted = false;
};

Exchange exchange_counts(const std::vector<std::int64_t>& counts, Communicator* ep) {
  const std::int64_t experts = static_cast<std::int64_t>(counts.size());
  const int peers = ep ? ep->size() : 1;
  const std::int64_t local = experts / peers;
  std::vector<std::int64_t> received = counts;  // [source][local expert]
  if (peers > 1) {
    TraceRegion region([] { return std::string("moe count exchange"); });
    const std::size_t block = static_cast<std::size_t>(local) * sizeof(std::int64_t);
    std::vector<std::size_t> bytes(static_cast<std::size_t>(peers), block), offsets;
    for (int p = 0; p < peers; ++p) offsets.push_back(static_cast<std::size_t>(p) * block);
    ep->all_to_all(counts.data(), bytes, offsets, received.data(), bytes, offsets);
  }
  Exchange x;
  x.expert_rows.assign(static_cast<std::size_t>(local), 0);
  std::vector<std::int64_t> start(received.size());
  std::int64_t at = 0;
  for (int p = 0; p < peers; ++p) {
    std::int64_t to_p = 0, from_p = 0;
    for (std::int64_t e = 0; e < local; ++e) {
      const auto i = static_cast<std::size_t>(p * local + e);
      to_p += counts[i];
      from_p += received[i];
      start[i] = at;
      at += received[i];
      x.expert_rows[static_cast<std::size_t>(e)] += received[i];
    }
    x.send_rows.push_back(to_p);
    x.recv_rows.push_back(from_p);
  }
  x.permuted = peers > 1 && local > 1;
  if (x.permuted)
    for (std::int64_t e = 0; e < local; ++e)
      for (int p = 0; p < peers; ++p) {
        const auto i = static_cast<std::size_t>(p * local + e);
        for (std::int64_t r = 0; r < received[i]; ++r) x.by_expert.push_back(start[i] + r);
      }
  return x;
}

// The rows [n, D] (grouped by expert, counts[e] for expert e) to their
// experts' ranks over `ep` (null: every expert is here), through the local
// experts, and back: [n, D] in the rows' order. One recorded node whose
// backward sends the gradients the same two ways in reverse; inside it the
// experts' own graph (fresh leaves: the received rows and the weights)
// gives their gradients, zeros for a weight no row reached, so that every
// rank's gradients take part in the same reductions.
Tensor through_experts(const Tensor& rows, const std::vector<std::int64_t>& counts, const LocalExperts& w,
                       Communicator* ep, bool with_proj_bias, MoEState<DTensor>& state) {
  const Exchange plan = exchange_counts(counts, ep);
  state.sent_rows = ep ? plan.send_rows : std::vector<std::int64_t>{};
  state.received_rows = ep ? plan.recv_rows : std::vector<std::int64_t>{};
  const bool across = ep && ep->size() > 1;
  Tensor received = [&] {
    if (!across) return rows.detach();
    TraceRegion region([] { return std::string("moe dispatch"); });
    return exchange_rows(rows, plan.send_rows, plan.recv_rows, *ep);
  }();
  const Tensor weights[] = {w.fc_w, w.fc_b, w.proj_w, w.proj_b};
  bool recording = grad_enabled() && rows.requires_grad();
  for (const Tensor& t : weights) recording = recording || (grad_enabled() && t.requires_grad());

  // The experts' own graph, on leaves of this node's inputs.
  Tensor in = received;
  std::vector<Tensor> leaves;
  for (const Tensor& t : weights) leaves.push_back(t.detach());
  if (recording) {
    in.requires_grad_();
    for (Tensor& t : leaves) t.requires_grad_();
  }
  const Tensor grouped = plan.permuted ? embedding(index_tensor(plan.by_expert), in) : in;
  Tensor out = run_experts(grouped, plan.expert_rows, leaves[0], leaves[1], leaves[2], leaves[3], with_proj_bias);
  if (plan.permuted) {
    std::vector<std::int64_t> back(plan.by_expert.size());
    for (std::size_t i = 0; i < back.size(); ++i) back[static_cast<std::size_t>(plan.by_expert[i])] = static_cast<std::int64_t>(i);
    out = embedding(index_tensor(back), out);  // by source again
  }
  Tensor returned = [&] {
    if (!across) return out.detach();
    TraceRegion region([] { return std::string("moe combine"); });
    return exchange_rows(out.detach(), plan.recv_rows, plan.send_rows, *ep);
  }();
  if (!recording) return returned;

  const Tensor inputs[] = {rows, w.fc_w, w.fc_b, w.proj_w, w.proj_b};
  return record_custom(
      "moe experts", inputs, returned,
      [plan, across, ep, in, leaves, out](const Tensor& grad) -> std::vector<std::optional<Tensor>> {
        const Tensor to_experts = [&] {
          if (!across) return grad;
          TraceRegion region([] { return std::string("moe combine (backward)"); });
          return exchange_rows(grad, plan.send_rows, plan.recv_rows, *ep);
        }();
        if (out.requires_grad()) out.backward(to_experts);
        auto grad_or_zeros = [](const Tensor& leaf) {
          if (auto g = leaf.grad()) return *g;
          return Tensor::zeros(leaf.shape(), leaf.dtype(), leaf.device());
        };
        const Tensor to_rows = grad_or_zeros(in);
        std::vector<std::optional<Tensor>> grads;
        if (across) {
          TraceRegion region([] { return std::string("moe dispatch (backward)"); });
          grads.push_back(exchange_rows(to_rows, plan.recv_rows, plan.send_rows, *ep));
        } else {
          grads.push_back(to_rows);
        }
        for (const Tensor& leaf : leaves) grads.push_back(grad_or_zeros(leaf));
        return grads;
      });
}

}  // namespace

DTensor forward_parallel(const MoE<DTensor>& m, const DTensor& x) {
  const MoEDims dims = read_dims(m, x);
  const DeviceMesh& mesh = x.mesh();
  const int ndim = mesh.ndim();
  MoEState<DTensor>& state = *m.state;

  // Local shards, each with the layout its gradient comes back in.
  const Tensor x_router = x.to_local(x.placements());
  const Tensor x_experts = dims.tp >= 0 ? x.to_local(x.placements().with(dims.tp, Partial{})) : x_router;
  auto local = [&](const DTensor& weight, bool partial_over_tp = false) {
    return weight.to_local(grad_layout(weight.placements(), dims, partial_over_tp));
  };
  const LocalExperts experts{local(m.fc_weight), local(m.fc_bias), local(m.proj_weight),
                             local(m.proj_bias, dims.tp >= 0)};
  const Tensor router = local(m.router);

  const std::int64_t batch = x_router.shape()[0], len = x_router.shape()[1], dim = x_router.shape()[2];
  const Routing r = route(reshape(x_router, {batch * len, dim}), router, m.config, state.bias, len);
  Tensor gates = r.gates;
  if (dims.tp >= 0 && mesh.size(dims.tp) > 1) gates = sum_gradient_over(gates, mesh.dim_comm(dims.tp));
  const Tensor rows = moe_dispatch(reshape(x_experts, {batch * len, dim}), r.plan);
  Communicator* ep = dims.ep >= 0 ? &mesh.dim_comm(dims.ep) : nullptr;
  const bool first_tp_rank = dims.tp < 0 || mesh.coordinate()[static_cast<std::size_t>(dims.tp)] == 0;
  const Tensor y = through_experts(rows, r.plan.counts, experts, ep, first_tp_rank, state);
  const Tensor out = reshape(moe_combine(y, gates, r.plan), {batch, len, dim});

  // The whole batch's statistics: one all_reduce over the token dims.
  Tensor statistics = routing_statistics(r, m.config);
  if (!dims.token_dims.empty()) {
    const Layout partial = with_each(ndim, [&](int d) -> Placement {
      return dims.splits_tokens(d) ? Placement{Partial{}} : Placement{Replicate{}};
    });
    const Layout whole = Layout::replicated(ndim);
    statistics = DTensor::from_local(statistics, mesh, partial, statistics.shape(), FromLocalCheck::Trust)
                     .redistribute(whole)
                     .to_local(whole);
  }
  const Balancing b = balancing(statistics, x.shape()[0] * x.shape()[1], m.config);
  record(state, m.config, b);
  state.pending_loss.reset();
  if (b.loss)
    state.pending_loss = DTensor::from_local(*b.loss, mesh, Layout::replicated(ndim), Shape{}, FromLocalCheck::Trust);
  const Layout out_layout = dims.tp >= 0 ? x.placements().with(dims.tp, Partial{}) : x.placements();
  return DTensor::from_local(out, mesh, out_layout, x.shape(), FromLocalCheck::Trust);
}

}  // namespace dtensor::nn::detail
