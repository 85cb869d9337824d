// Mixture of experts on one rank: routing, the dispatch plan, the experts'
// GEMMs by row range, the combine and the balancing losses (moe.h).
#include "dtensor/nn/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "dtensor/api/autograd.h"
#include "dtensor/api/embedding.h"
#include "dtensor/api/linalg.h"
#include "dtensor/api/pointwise.h"
#include "dtensor/api/reduction.h"
#include "dtensor/api/shape_ops.h"
#include "dtensor/core/error.h"
#include "moe_detail.h"

namespace dtensor::nn {

void MoEConfig::check() const {
  if (!enabled()) return;
  if (top_k < 1 || top_k > 2 || top_k > experts)
    throw ValueError(fmt::format("[MoE] top_k = {} with {} experts; expected 1 or 2, at most the experts", top_k,
                                 experts));
  if (every < 1) throw ValueError(fmt::format("[MoE] every = {}; expected at least 1", every));
  if (capacity_factor && !(*capacity_factor > 0))
    throw ValueError(fmt::format("[MoE] capacity factor {}; expected > 0 (or none: dropless)", *capacity_factor));
  for (auto [value, name] : {std::pair{aux_loss, "aux_loss"}, {z_loss, "z_loss"}, {bias_rate, "bias_rate"}})
    if (!(value >= 0) || !std::isfinite(value))
      throw ValueError(fmt::format("[MoE] {} = {}; expected a finite value >= 0", name, value));
}

std::int64_t expert_capacity(std::int64_t tokens, std::int64_t top_k, std::int64_t experts, double factor) {
  const double rows = static_cast<double>(tokens * top_k) / static_cast<double>(experts) * factor;
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(rows - 1e-9)));
}

DispatchPlan plan_dispatch(std::span<const std::int64_t> expert_ids, std::span<const double> probabilities,
                           std::int64_t top_k, std::int64_t experts, std::optional<std::int64_t> capacity,
                           DropPolicy policy, std::int64_t group_tokens) {
  const auto assignments = static_cast<std::int64_t>(expert_ids.size());
  if (top_k < 1 || experts < 1 || assignments % top_k != 0 || probabilities.size() != expert_ids.size())
    throw ValueError(fmt::format("[moe] {} expert ids, {} probabilities, top_k {}, {} experts; expected T * k of "
                                 "each, k >= 1 and E >= 1",
                                 expert_ids.size(), probabilities.size(), top_k, experts));
  if (group_tokens < 0 || (group_tokens > 0 && (assignments / top_k) % group_tokens != 0))
    throw ValueError(fmt::format("[moe] capacity groups of {} tokens over {} tokens; expected a divisor (or 0: one "
                                 "group)",
                                 group_tokens, assignments / top_k));
  DispatchPlan plan;
  plan.tokens = assignments / top_k;
  plan.top_k = top_k;
  plan.experts = experts;
  plan.routed.assign(static_cast<std::size_t>(experts), 0);
  std::vector<std::vector<std::int64_t>> by_expert(static_cast<std::size_t>(experts));
  for (std::int64_t a = 0; a < assignments; ++a) {
    const std::int64_t e = expert_ids[static_cast<std::size_t>(a)];
    if (e < 0 || e >= experts)
      throw ValueError(fmt::format("[moe] token {} chooses expert {}; expected [0, {})", a / top_k, e, experts));
    for (std::int64_t j = a - a % top_k; j < a; ++j)
      if (expert_ids[static_cast<std::size_t>(j)] == e)
        throw ValueError(fmt::format("[moe] token {} chooses expert {} twice", a / top_k, e));
    ++plan.routed[static_cast<std::size_t>(e)];
    by_expert[static_cast<std::size_t>(e)].push_back(a);  // in token order
  }
  plan.row_of_assignment.assign(static_cast<std::size_t>(assignments), -1);
  const std::int64_t group_assignments = (group_tokens > 0 ? group_tokens : plan.tokens) * top_k;
  for (auto& routed : by_expert) {
    std::vector<std::int64_t> kept;
    // Capacity per group: the group's assignments (contiguous, in token order) one run at a time.
    for (auto first = routed.begin(); first != routed.end();) {
      const std::int64_t group = *first / group_assignments;
      auto last = std::find_if(first, routed.end(), [&](std::int64_t a) { return a / group_assignments != group; });
      std::vector<std::int64_t> run(first, last);
      if (capacity && static_cast<std::int64_t>(run.size()) > *capacity) {
        if (policy == DropPolicy::Probs) {
          // The most probable first (ties: the earlier token), then back in token order.
          std::stable_sort(run.begin(), run.end(), [&](std::int64_t x, std::int64_t y) {
            return probabilities[static_cast<std::size_t>(x)] > probabilities[static_cast<std::size_t>(y)];
          });
          run.resize(static_cast<std::size_t>(*capacity));
          std::sort(run.begin(), run.end());
        } else {
          run.resize(static_cast<std::size_t>(*capacity));  // the earliest tokens
        }
      }
      kept.insert(kept.end(), run.begin(), run.end());
      first = last;
    }
    plan.counts.push_back(static_cast<std::int64_t>(kept.size()));
    for (std::int64_t a : kept) {
      plan.row_of_assignment[static_cast<std::size_t>(a)] = plan.rows();
      plan.token_of_row.push_back(a / top_k);
    }
  }
  for (std::int64_t& row : plan.row_of_assignment)
    if (row < 0) {
      row = plan.rows();  // the zero row moe_combine appends
      ++plan.dropped;
    }
  return plan;
}

namespace detail {

Tensor index_tensor(const std::vector<std::int64_t>& values) {
  return Tensor::from_vector(values, {static_cast<std::int64_t>(values.size())});
}

namespace {

// Each token's k experts: the largest probabilities (plus the selection
// bias), ties to the lower expert; token-major ids and the chosen
// probabilities (without the bias).
std::pair<std::vector<std::int64_t>, std::vector<double>> top_k_choices(const Tensor& probs, std::int64_t k,
                                                                        const std::vector<double>& bias) {
  const Tensor p = probs.detach().to(DType::Float64);
  const std::int64_t tokens = p.shape()[0], experts = p.shape()[1];
  const double* values = p.data_as<double>();
  std::vector<std::int64_t> ids, order(static_cast<std::size_t>(experts));
  std::vector<double> chosen;
  for (std::int64_t t = 0; t < tokens; ++t) {
    const double* row = values + t * experts;
    auto score = [&](std::int64_t e) { return row[e] + (bias.empty() ? 0.0 : bias[static_cast<std::size_t>(e)]); };
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](std::int64_t x, std::int64_t y) {
      return score(x) > score(y) || (score(x) == score(y) && x < y);
    });
    for (std::int64_t j = 0; j < k; ++j) {
      ids.push_back(order[static_cast<std::size_t>(j)]);
      chosen.push_back(row[order[static_cast<std::size_t>(j)]]);
    }
  }
  return {std::move(ids), std::move(chosen)};
}

// Expert e's matrix or bias out of the stacked [n, ...] tensor.
Tensor expert_slice(const Tensor& stacked, std::int64_t e) {
  Shape shape(stacked.shape().begin() + 1, stacked.shape().end());
  return reshape(narrow(stacked, 0, e, 1), shape);
}

double value_of(const Tensor& scalar) { return scalar.detach().to(DType::Float64).data_as<double>()[0]; }

}  // namespace

Routing route(const Tensor& flat, const Tensor& router, const MoEConfig& config, const std::vector<double>& bias,
              std::int64_t sequence_length) {
  const std::int64_t tokens = flat.shape()[0], experts = config.experts, k = config.top_k;
  Routing r;
  r.logits = linear(flat, router);  // [T, E]
  r.probs = softmax(r.logits, -1);
  const auto [ids, chosen] =
      top_k_choices(r.probs, k, config.balance == Balance::Bias ? bias : std::vector<double>{});
  const std::optional<std::int64_t> capacity =
      config.capacity_factor ? std::optional(expert_capacity(sequence_length, k, experts, *config.capacity_factor))
                             : std::nullopt;
  r.plan = plan_dispatch(ids, chosen, k, experts, capacity, config.drop_policy, sequence_length);
  // The gates: each choice's probability, differentiable (the router learns through them).
  r.gates = reshape(
      pick(reshape(expand(unsqueeze(r.probs, 1), {tokens, k, experts}), {tokens * k, experts}), index_tensor(ids)),
      {tokens, k});
  if (config.renormalize && k > 1) r.gates = div(r.gates, sum(r.gates, {1}, true));
  return r;
}

Tensor run_experts(const Tensor& rows, std::span<const std::int64_t> counts, const Tensor& fc_w, const Tensor& fc_b,
                   const Tensor& proj_w, const Tensor& proj_b, bool with_proj_bias) {
  std::vector<Tensor> outputs;
  std::int64_t first = 0;
  for (std::size_t e = 0; e < counts.size(); ++e) {
    const std::int64_t n = counts[e];
    if (n == 0) continue;
    const auto i = static_cast<std::int64_t>(e);
    const Tensor mine = narrow(rows, 0, first, n);
    const Tensor hidden = gelu(add(linear(mine, expert_slice(fc_w, i)), expert_slice(fc_b, i)));
    Tensor out = linear(hidden, expert_slice(proj_w, i));
    outputs.push_back(with_proj_bias ? add(out, expert_slice(proj_b, i)) : out);
    first += n;
  }
  if (outputs.empty()) return Tensor::zeros({0, proj_w.shape()[1]}, rows.dtype(), rows.device());
  return outputs.size() == 1 ? outputs.front() : cat(std::span<const Tensor>(outputs), 0);
}

Tensor routing_statistics(const Routing& routing, const MoEConfig& config) {
  const DType dtype = routing.probs.dtype();
  std::vector<double> counts(routing.plan.routed.begin(), routing.plan.routed.end());
  counts.push_back(static_cast<double>(routing.plan.dropped));
  const Tensor constant = Tensor::from_vector(counts, {static_cast<std::int64_t>(counts.size())}).to(dtype);
  Tensor z_sum = Tensor::zeros({1}, dtype);
  if (config.z_loss > 0) {
    // logsumexp(logits) = logits - log_softmax(logits), at any column.
    const Tensor lse = sub(narrow(routing.logits, 1, 0, 1), narrow(log_softmax(routing.logits, -1), 1, 0, 1));
    z_sum = reshape(sum(mul(lse, lse)), {1});
  }
  return cat({constant, sum(routing.probs, {0}), z_sum}, 0);
}

Balancing balancing(const Tensor& statistics, std::int64_t tokens, const MoEConfig& config) {
  const std::int64_t experts = config.experts;
  const Tensor host = statistics.detach().to(DType::Float64);
  const double* v = host.data_as<double>();
  Balancing b;
  for (std::int64_t e = 0; e < experts; ++e) b.load.push_back(std::llround(v[e]));
  b.dropped = std::llround(v[experts]);
  const auto total = static_cast<double>(tokens);
  if (config.balance == Balance::AuxLoss && config.aux_loss > 0) {
    // alpha * E * sum_i f_i P_i: f_i = count_i / (T k), a constant; P_i = (sum of p_i) / T.
    std::vector<double> fraction;
    for (std::int64_t e = 0; e < experts; ++e)
      fraction.push_back(v[e] / (total * static_cast<double>(config.top_k)));
    const Tensor f = Tensor::from_vector(fraction, {experts}).to(statistics.dtype());
    const Tensor aux =
        mul(sum(mul(narrow(statistics, 0, experts + 1, experts), f)), config.aux_loss * static_cast<double>(experts) / total);
    b.aux_loss = value_of(aux);
    b.loss = aux;
  }
  if (config.z_loss > 0) {
    const Tensor z = mul(reshape(narrow(statistics, 0, 2 * experts + 1, 1), Shape{}), config.z_loss / total);
    b.z_loss = value_of(z);
    b.loss = b.loss ? add(*b.loss, z) : z;
  }
  return b;
}

}  // namespace detail

template <TensorOrDTensor X>
X moe_dispatch(const X& x, const DispatchPlan& plan) {
  if constexpr (std::same_as<X, DTensor>) {
    throw UnsupportedError(
        "[moe_dispatch] on a DTensor: the rows have a size per rank, so the MoE layer moves them itself (under ep, "
        "by all_to_allv); call it on a Tensor");
  } else {
    if (x.dim() != 2 || x.shape()[0] != plan.tokens)
      throw ShapeError(fmt::format("[moe_dispatch] x of shape {}; expected [{}, D] (the plan's tokens)",
                                   fmt::join(x.shape(), "x"), plan.tokens));
    return embedding(detail::index_tensor(plan.token_of_row), x);
  }
}

template <TensorOrDTensor X>
X moe_combine(const X& y, const X& gates, const DispatchPlan& plan) {
  if constexpr (std::same_as<X, DTensor>) {
    throw UnsupportedError(
        "[moe_combine] on a DTensor: the rows have a size per rank, so the MoE layer moves them itself (under ep, "
        "by all_to_allv); call it on a Tensor");
  } else {
    if (y.dim() != 2 || y.shape()[0] != plan.rows() || gates.shape() != Shape{plan.tokens, plan.top_k})
      throw ShapeError(fmt::format("[moe_combine] y of shape {} and gates of shape {}; expected [{}, D] and [{}, {}]",
                                   fmt::join(y.shape(), "x"), fmt::join(gates.shape(), "x"), plan.rows(),
                                   plan.tokens, plan.top_k));
    const std::int64_t dim = y.shape()[1];
    // A dropped assignment reads the zero row after the last.
    const Tensor padded = cat({y, Tensor::zeros({1, dim}, y.dtype(), y.device())}, 0);
    const Tensor rows = embedding(detail::index_tensor(plan.row_of_assignment), padded);  // [T k, D], token-major
    const Tensor weighted = mul(rows, reshape(gates, {plan.tokens * plan.top_k, 1}));
    return sum(reshape(weighted, {plan.tokens, plan.top_k, dim}), {1});
  }
}

namespace {

// The plain forward: x [B, T, D] through the router, the experts and the
// combine, with the balancing losses of its own tokens.
std::pair<Tensor, detail::Balancing> forward_local(const Tensor& x, const MoE<Tensor>& m,
                                                   const std::vector<double>& bias) {
  if (x.dim() != 3) throw ShapeError(fmt::format("[MoE] x of shape {}; expected [B, T, D]", fmt::join(x.shape(), "x")));
  const std::int64_t batch = x.shape()[0], len = x.shape()[1], dim = x.shape()[2];
  const Tensor flat = reshape(x, {batch * len, dim});
  const detail::Routing r = detail::route(flat, m.router, m.config, bias, len);
  const Tensor y =
      detail::run_experts(moe_dispatch(flat, r.plan), r.plan.counts, m.fc_weight, m.fc_bias, m.proj_weight,
                          m.proj_bias, true);
  Tensor out = reshape(moe_combine(y, r.gates, r.plan), {batch, len, dim});
  return {std::move(out), detail::balancing(detail::routing_statistics(r, m.config), batch * len, m.config)};
}

}  // namespace

template <TensorOrDTensor X>
void detail::record(MoEState<X>& s, const MoEConfig& config, const Balancing& b) {
  s.aux_loss = b.aux_loss;
  s.z_loss = b.z_loss;
  s.last_load = b.load;
  s.last_dropped = b.dropped;
  if (grad_enabled()) {  // the training forwards' load, for the bias update
    s.step_load.resize(static_cast<std::size_t>(config.experts), 0);
    for (std::size_t e = 0; e < b.load.size(); ++e) s.step_load[e] += b.load[e];
    s.step_dropped += b.dropped;
  }
}

template <TensorOrDTensor X>
X MoE<X>::operator()(const X& x) const {
  MoEState<X>& s = *state;
  if (s.bias.empty()) s.bias.assign(static_cast<std::size_t>(config.experts), 0.0);
  if constexpr (std::same_as<X, DTensor>) {
    return detail::forward_parallel(*this, x);
  } else {
    auto [out, b] = forward_local(x, *this, s.bias);
    detail::record(s, config, b);
    s.pending_loss = b.loss;
    return out;
  }
}

template <TensorOrDTensor X>
void MoE<X>::named_parameters(const std::string& prefix, std::vector<std::pair<std::string, X*>>& out) {
  out.emplace_back(prefix + "router.weight", &router);
  out.emplace_back(prefix + "experts.fc.weight", &fc_weight);
  out.emplace_back(prefix + "experts.fc.bias", &fc_bias);
  out.emplace_back(prefix + "experts.proj.weight", &proj_weight);
  out.emplace_back(prefix + "experts.proj.bias", &proj_bias);
}

template <TensorOrDTensor X>
void MoE<X>::end_step() {
  MoEState<X>& s = *state;
  s.step_dropped = 0;
  if (s.step_load.empty()) return;
  if (config.balance != Balance::Bias) {
    s.step_load.assign(s.step_load.size(), 0);
    return;
  }
  s.bias.resize(static_cast<std::size_t>(config.experts), 0.0);
  const double mean_load = static_cast<double>(std::accumulate(s.step_load.begin(), s.step_load.end(), std::int64_t{0})) /
                           static_cast<double>(config.experts);
  for (std::size_t e = 0; e < s.bias.size(); ++e) {
    const double gap = mean_load - static_cast<double>(s.step_load[e]);
    s.bias[e] += config.bias_rate * static_cast<double>((gap > 0) - (gap < 0));
  }
  s.step_load.assign(s.step_load.size(), 0);
}

template Tensor moe_dispatch(const Tensor&, const DispatchPlan&);
template DTensor moe_dispatch(const DTensor&, const DispatchPlan&);
template Tensor moe_combine(const Tensor&, const Tensor&, const DispatchPlan&);
template DTensor moe_combine(const DTensor&, const DTensor&, const DispatchPlan&);
template void detail::record(MoEState<Tensor>&, const MoEConfig&, const detail::Balancing&);
template void detail::record(MoEState<DTensor>&, const MoEConfig&, const detail::Balancing&);
template struct MoE<Tensor>;
template struct MoE<DTensor>;

}  // namespace dtensor::nn
