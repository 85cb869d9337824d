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
                           DropPolicy policy) {
  const auto assignments = static_cast<std::int64_t>(expert_ids.size());
  if (top_k < 1 || experts < 1 || assignments % top_k != 0 || probabilities.size() != expert_ids.size())
    throw ValueError(fmt::format("[moe] {} expert ids, {} probabilities, top_k {}, {} experts; expected T * k of "
                                 "each, k >= 1 and E >= 1",
                                 expert_ids.size(), probabilities.size(), top_k, experts));
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
  for (auto& kept : by_expert) {
    if (capacity && static_cast<std::int64_t>(kept.size()) > *capacity) {
      if (policy == DropPolicy::Probs) {
        // The most probable first (ties: the earlier token), then back in token order.
        std::stable_sort(kept.begin(), kept.end(), [&](std::int64_t x, std::int64_t y) {
          return probabilities[static_cast<std::size_t>(x)] > probabilities[static_cast<std::size_t>(y)];
        });
        kept.resize(static_cast<std::size_t>(*capacity));
        std::sort(kept.begin(), kept.end());
      } else {
        kept.resize(static_cast<std::size_t>(*capacity));  // the earliest tokens
      }
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

namespace {

[[noreturn]] void not_on_dtensors(const char* what) {
  throw UnsupportedError(fmt::format(
      "[MoE] {} on DTensors: expert parallelism (the ep plan) is not built yet; mixture of experts runs on one rank",
      what));
}

Tensor indices(const std::vector<std::int64_t>& values) {
  return Tensor::from_vector(values, {static_cast<std::int64_t>(values.size())});
}

double value_of(const Tensor& scalar) { return scalar.detach().to(DType::Float64).data_as<double>()[0]; }

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

// Expert e's matrix or bias out of the stacked [E, ...] tensor.
Tensor expert_slice(const Tensor& stacked, std::int64_t e) {
  Shape shape(stacked.shape().begin() + 1, stacked.shape().end());
  return reshape(narrow(stacked, 0, e, 1), shape);
}

}  // namespace

template <TensorOrDTensor X>
X moe_dispatch(const X& x, const DispatchPlan& plan) {
  if constexpr (std::same_as<X, DTensor>) {
    not_on_dtensors("moe_dispatch");
  } else {
    if (x.dim() != 2 || x.shape()[0] != plan.tokens)
      throw ShapeError(fmt::format("[moe_dispatch] x of shape {}; expected [{}, D] (the plan's tokens)",
                                   fmt::join(x.shape(), "x"), plan.tokens));
    return embedding(indices(plan.token_of_row), x);
  }
}

template <TensorOrDTensor X>
X moe_combine(const X& y, const X& gates, const DispatchPlan& plan) {
  if constexpr (std::same_as<X, DTensor>) {
    not_on_dtensors("moe_combine");
  } else {
    if (y.dim() != 2 || y.shape()[0] != plan.rows() || gates.shape() != Shape{plan.tokens, plan.top_k})
      throw ShapeError(fmt::format("[moe_combine] y of shape {} and gates of shape {}; expected [{}, D] and [{}, {}]",
                                   fmt::join(y.shape(), "x"), fmt::join(gates.shape(), "x"), plan.rows(),
                                   plan.tokens, plan.top_k));
    const std::int64_t dim = y.shape()[1];
    // A dropped assignment reads the zero row after the last.
    const Tensor padded = cat({y, Tensor::zeros({1, dim}, y.dtype())}, 0);
    const Tensor rows = embedding(indices(plan.row_of_assignment), padded);  // [T k, D], token-major
    const Tensor weighted = mul(rows, reshape(gates, {plan.tokens * plan.top_k, 1}));
    return sum(reshape(weighted, {plan.tokens, plan.top_k, dim}), {1});
  }
}

namespace {

// One forward on plain tensors: the output, the balancing loss (if any),
// the plan and the losses' values.
struct LocalForward {
  Tensor out;
  std::optional<Tensor> balancing;
  DispatchPlan plan;
  double aux_loss = 0, z_loss = 0;
};

struct ExpertWeights {
  Tensor router, fc_weight, fc_bias, proj_weight, proj_bias;
};

LocalForward forward_local(const Tensor& x, const ExpertWeights& w, const MoEConfig& config,
                           const std::vector<double>& bias) {
  if (x.dim() != 3) throw ShapeError(fmt::format("[MoE] x of shape {}; expected [B, T, D]", fmt::join(x.shape(), "x")));
  const std::int64_t batch = x.shape()[0], len = x.shape()[1], dim = x.shape()[2];
  const std::int64_t tokens = batch * len, experts = config.experts, k = config.top_k;
  LocalForward r;
  const Tensor flat = reshape(x, {tokens, dim});
  const Tensor logits = linear(flat, w.router);  // [T, E]
  const Tensor probs = softmax(logits, -1);
  const auto [ids, chosen] = top_k_choices(probs, k, config.balance == Balance::Bias ? bias : std::vector<double>{});
  const std::optional<std::int64_t> capacity =
      config.capacity_factor ? std::optional(expert_capacity(tokens, k, experts, *config.capacity_factor))
                             : std::nullopt;
  r.plan = plan_dispatch(ids, chosen, k, experts, capacity, config.drop_policy);

  // The gates: each choice's probability, differentiable (the router learns through them).
  Tensor gates = reshape(
      pick(reshape(expand(unsqueeze(probs, 1), {tokens, k, experts}), {tokens * k, experts}), indices(ids)),
      {tokens, k});
  if (config.renormalize && k > 1) gates = div(gates, sum(gates, {1}, true));

  // Each expert's rows through its two matrices: one GEMM pair per expert.
  const Tensor rows = moe_dispatch(flat, r.plan);
  std::vector<Tensor> outputs;
  std::int64_t first = 0;
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t n = r.plan.counts[static_cast<std::size_t>(e)];
    if (n == 0) continue;
    const Tensor mine = narrow(rows, 0, first, n);
    const Tensor hidden = gelu(add(linear(mine, expert_slice(w.fc_weight, e)), expert_slice(w.fc_bias, e)));
    outputs.push_back(add(linear(hidden, expert_slice(w.proj_weight, e)), expert_slice(w.proj_bias, e)));
    first += n;
  }
  const Tensor y = outputs.size() == 1 ? outputs.front() : cat(std::span<const Tensor>(outputs), 0);
  r.out = reshape(moe_combine(y, gates, r.plan), {batch, len, dim});

  // Balancing losses over this forward's tokens.
  if (config.balance == Balance::AuxLoss && config.aux_loss > 0) {
    // f_i (a constant: the fraction of assignments routed to i) times P_i (the mean probability).
    std::vector<double> fraction;
    for (std::int64_t n : r.plan.routed) fraction.push_back(static_cast<double>(n) / static_cast<double>(tokens * k));
    const Tensor f = Tensor::from_vector(fraction, {experts}).to(probs.dtype());
    const Tensor aux = mul(sum(mul(mean(probs, {0}), f)), config.aux_loss * static_cast<double>(experts));
    r.aux_loss = value_of(aux);
    r.balancing = aux;
  }
  if (config.z_loss > 0) {
    // logsumexp(logits) = logits - log_softmax(logits), at any column.
    const Tensor lse = sub(narrow(logits, 1, 0, 1), narrow(log_softmax(logits, -1), 1, 0, 1));
    const Tensor z = mul(mean(mul(lse, lse)), config.z_loss);
    r.z_loss = value_of(z);
    r.balancing = r.balancing ? add(*r.balancing, z) : z;
  }
  return r;
}

}  // namespace

template <TensorOrDTensor X>
X MoE<X>::operator()(const X& x) const {
  MoEState<X>& s = *state;
  if (s.bias.empty()) s.bias.assign(static_cast<std::size_t>(config.experts), 0.0);
  auto record = [&](const LocalForward& r) {
    s.aux_loss = r.aux_loss;
    s.z_loss = r.z_loss;
    s.last_load = r.plan.routed;
    s.last_dropped = r.plan.dropped;
    if (grad_enabled()) {  // the training forwards' load, for the bias update
      s.step_load.resize(static_cast<std::size_t>(config.experts), 0);
      for (std::size_t e = 0; e < r.plan.routed.size(); ++e) s.step_load[e] += r.plan.routed[e];
      s.step_dropped += r.plan.dropped;
    }
  };
  if constexpr (std::same_as<X, DTensor>) {
    // On a mesh of one rank every layout is the whole tensor: the plain
    // forward on the shards, wrapped back (both steps recorded).
    if (x.mesh().size() != 1) not_on_dtensors("an MoE layer");
    // A fresh record of each shard per forward (to_local() keeps the first
    // on the tensor, whose graph a backward frees).
    auto local = [](const DTensor& t) { return t.to_local(t.placements()); };
    const LocalForward r = forward_local(
        local(x), {local(router), local(fc_weight), local(fc_bias), local(proj_weight), local(proj_bias)}, config,
        s.bias);
    record(r);
    s.pending_loss.reset();
    if (r.balancing)
      s.pending_loss = DTensor::from_local(*r.balancing, x.mesh(), Layout::replicated(x.mesh().ndim()), Shape{},
                                           FromLocalCheck::Trust);
    return DTensor::from_local(r.out, x.mesh(), x.placements(), x.shape(), FromLocalCheck::Trust);
  } else {
    const LocalForward r = forward_local(x, {router, fc_weight, fc_bias, proj_weight, proj_bias}, config, s.bias);
    record(r);
    s.pending_loss = r.balancing;
    return r.out;
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
template struct MoE<Tensor>;
template struct MoE<DTensor>;

}  // namespace dtensor::nn
