// Mixture of experts on one rank (nn/moe.h): the dispatch plan by hand
// (rows grouped by expert, tokens in order, drops by probability or
// position); the layer against a per-token reference built from plain ops
// (output and every gradient to 1e-12 in f64, top-1 and top-2, with and
// without renormalisation and capacity); the balancing losses against
// their formulas; the bias rule; and a GPT with MoE blocks that trains.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

#include <dtensor/nn/modules.h>

#include "dtensor/api/embedding.h"
#include "dtensor/api/linalg.h"
#include "dtensor/api/pointwise.h"
#include "dtensor/api/reduction.h"
#include "dtensor/api/shape_ops.h"
#include "dtensor/train/trainer.h"
#include "support.h"

using namespace dtensor;
using nn::DispatchPlan;
using nn::DropPolicy;

namespace moe_suite {

constexpr std::int64_t kDim = 8, kExperts = 4;

std::vector<double> values(const Tensor& t) {
  const Tensor d = t.detach().to(DType::Float64);
  return {d.data_as<double>(), d.data_as<double>() + d.numel()};
}

// A layer of E experts on D = 8 with seeded N(0, 0.5) weights (so that the
// router's choices differ by token), f64.
nn::MoE<Tensor> layer(nn::MoEConfig config, std::uint64_t seed) {
  auto make = [&](Shape shape) {
    Tensor p = mul(Tensor::randn(std::move(shape), DType::Float64, seed++), 0.5);
    p.requires_grad_();
    return p;
  };
  const std::int64_t E = config.experts, H = 4 * kDim;
  nn::MoE<Tensor> out{make({E, kDim}), make({E, H, kDim}), make({E, H}), make({E, kDim, H}), make({E, kDim}),
                      config};
  return out;
}

// The layer computed token by token from its weights with plain ops: the
// router's softmax, the k largest probabilities (ties to the lower expert),
// an expert over capacity keeping its most probable (or earliest) tokens,
// each kept choice's MLP output times its gate, summed.
Tensor reference(const nn::MoE<Tensor>& m, const Tensor& x) {
  const nn::MoEConfig& c = m.config;
  const std::int64_t tokens = x.shape()[0] * x.shape()[1], k = c.top_k, E = c.experts;
  const Tensor flat = reshape(x, {tokens, kDim});
  std::vector<Tensor> probs;
  std::vector<std::vector<std::int64_t>> choice(static_cast<std::size_t>(tokens));
  std::vector<std::vector<std::int64_t>> by_expert(static_cast<std::size_t>(E));
  for (std::int64_t t = 0; t < tokens; ++t) {
    probs.push_back(softmax(linear(narrow(flat, 0, t, 1), m.router), -1));  // [1, E]
    const std::vector<double> p = values(probs.back());
    std::vector<std::int64_t> order(static_cast<std::size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return p[a] > p[b]; });
    for (std::int64_t j = 0; j < k; ++j) {
      choice[t].push_back(order[j]);
      by_expert[order[j]].push_back(t);
    }
  }
  std::vector<std::vector<bool>> kept(static_cast<std::size_t>(tokens), std::vector<bool>(k, true));
  if (c.capacity_factor) {
    // Capacity per sequence: ceil(len k / E * factor) of each expert's choices in each.
    const std::int64_t len = x.shape()[1];
    const auto capacity = static_cast<std::size_t>(
        std::max(1.0, std::ceil(static_cast<double>(len * k) / static_cast<double>(E) * *c.capacity_factor - 1e-9)));
    for (std::int64_t e = 0; e < E; ++e)
      for (std::int64_t sequence = 0; sequence < x.shape()[0]; ++sequence) {
        std::vector<std::int64_t> ts;
        for (std::int64_t t : by_expert[e])
          if (t / len == sequence) ts.push_back(t);
        if (c.drop_policy == DropPolicy::Probs)
          std::stable_sort(ts.begin(), ts.end(),
                           [&](auto a, auto b) { return values(probs[a])[e] > values(probs[b])[e]; });
        for (std::size_t i = capacity; i < ts.size(); ++i) {
          const std::int64_t t = ts[i];
          const auto j = std::find(choice[t].begin(), choice[t].end(), e) - choice[t].begin();
          kept[t][j] = false;
        }
      }
  }
  auto slice = [](const Tensor& stacked, std::int64_t e) {
    Shape shape(stacked.shape().begin() + 1, stacked.shape().end());
    return reshape(narrow(stacked, 0, e, 1), shape);
  };
  std::vector<Tensor> rows;
  for (std::int64_t t = 0; t < tokens; ++t) {
    const Tensor xt = narrow(flat, 0, t, 1);
    Tensor denominator = Tensor::zeros({1, 1}, DType::Float64);
    for (std::int64_t e : choice[t]) denominator = add(denominator, narrow(probs[t], 1, e, 1));
    Tensor out = Tensor::zeros({1, kDim}, DType::Float64);
    for (std::int64_t j = 0; j < k; ++j) {
      if (!kept[t][j]) continue;
      const std::int64_t e = choice[t][j];
      Tensor gate = narrow(probs[t], 1, e, 1);
      if (c.renormalize && k > 1) gate = div(gate, denominator);
      const Tensor hidden = gelu(add(linear(xt, slice(m.fc_weight, e)), slice(m.fc_bias, e)));
      out = add(out, mul(add(linear(hidden, slice(m.proj_weight, e)), slice(m.proj_bias, e)), gate));
    }
    rows.push_back(out);
  }
  return reshape(cat(std::span<const Tensor>(rows), 0), x.shape());
}

struct Case {
  std::int64_t top_k;
  bool renormalize;
  std::optional<double> capacity_factor;
  DropPolicy drop = DropPolicy::Probs;
};
std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << "k=" << c.top_k << (c.renormalize ? " renormalized" : "") << " capacity "
            << (c.capacity_factor ? std::to_string(*c.capacity_factor) : std::string("none"))
            << (c.drop == DropPolicy::Probs ? " drop probs" : " drop position");
}

// The parameters' and the input's gradients of sum(out * w).
std::vector<std::vector<double>> gradients(const Tensor& out, const Tensor& w, nn::MoE<Tensor>& m, const Tensor& x) {
  sum(mul(out, w)).backward();
  std::vector<std::vector<double>> g;
  std::vector<std::pair<std::string, Tensor*>> named;
  m.named_parameters("", named);
  for (auto& [name, p] : named) {
    g.push_back(values(*p->grad()));
    p->zero_grad();
  }
  g.push_back(values(*x.grad()));
  Tensor(x).zero_grad();
  return g;
}

}  // namespace moe_suite

using namespace moe_suite;

BOOST_AUTO_TEST_SUITE(moe)

BOOST_AUTO_TEST_CASE(a_plan_groups_rows_by_expert_and_drops_by_rule) {
  // 4 tokens, k = 2, 3 experts: token t's choices at 2t, 2t + 1.
  const std::vector<std::int64_t> ids{0, 1, 1, 2, 1, 0, 2, 1};
  const std::vector<double> probs{0.5, 0.3, 0.6, 0.2, 0.4, 0.35, 0.7, 0.25};
  const DispatchPlan all = nn::plan_dispatch(ids, probs, 2, 3, std::nullopt, DropPolicy::Probs);
  BOOST_TEST(all.routed == (std::vector<std::int64_t>{2, 4, 2}));
  BOOST_TEST(all.counts == all.routed);
  BOOST_TEST(all.token_of_row == (std::vector<std::int64_t>{0, 2, 0, 1, 2, 3, 1, 3}));
  BOOST_TEST(all.row_of_assignment == (std::vector<std::int64_t>{0, 2, 3, 6, 4, 1, 7, 5}));
  BOOST_TEST(all.dropped == 0);
  // Capacity 3: expert 1 (tokens 0, 1, 2, 3 at 0.3, 0.6, 0.4, 0.25) keeps three.
  const DispatchPlan by_probs = nn::plan_dispatch(ids, probs, 2, 3, 3, DropPolicy::Probs);
  BOOST_TEST(by_probs.counts == (std::vector<std::int64_t>{2, 3, 2}));
  BOOST_TEST(by_probs.token_of_row == (std::vector<std::int64_t>{0, 2, 0, 1, 2, 1, 3}));  // token 3 dropped
  BOOST_TEST(by_probs.row_of_assignment[7] == by_probs.rows());
  BOOST_TEST(by_probs.dropped == 1);
  const DispatchPlan by_position = nn::plan_dispatch(ids, probs, 2, 3, 3, DropPolicy::Position);
  BOOST_TEST(by_position.token_of_row == (std::vector<std::int64_t>{0, 2, 0, 1, 2, 1, 3}));
  const DispatchPlan tight = nn::plan_dispatch(ids, probs, 2, 3, 1, DropPolicy::Probs);
  BOOST_TEST(tight.token_of_row == (std::vector<std::int64_t>{0, 1, 3}));  // 0.5 of 0; 0.6 of 1; 0.7 of 2
  const DispatchPlan earliest = nn::plan_dispatch(ids, probs, 2, 3, 1, DropPolicy::Position);
  BOOST_TEST(earliest.token_of_row == (std::vector<std::int64_t>{0, 0, 1}));
  // Capacity 1 per group of 2 tokens (a sequence): expert 1 keeps token 1
  // (0.6 over 0.3) in the first and token 2 (0.4 over 0.25) in the second;
  // experts 0 and 2 have one choice per group and keep both.
  const DispatchPlan grouped = nn::plan_dispatch(ids, probs, 2, 3, 1, DropPolicy::Probs, 2);
  BOOST_TEST(grouped.token_of_row == (std::vector<std::int64_t>{0, 2, 1, 2, 1, 3}));
  BOOST_TEST(grouped.dropped == 2);
  testing::check_throws<ValueError>([&] { nn::plan_dispatch(ids, probs, 2, 3, 1, DropPolicy::Probs, 3); },
                                    "capacity groups of 3 tokens over 4 tokens");
  BOOST_TEST(nn::expert_capacity(4, 2, 3, 1.0) == 3);  // ceil(8 / 3)
  BOOST_TEST(nn::expert_capacity(6, 2, 4, 1.0) == 3);
  BOOST_TEST(nn::expert_capacity(1, 1, 8, 0.5) == 1);
  const std::vector<std::int64_t> bad{0, 3}, twice{1, 1};
  const std::vector<double> two{0.5, 0.5};
  testing::check_throws<ValueError>([&] { nn::plan_dispatch(bad, two, 2, 3, std::nullopt, DropPolicy::Probs); },
                                    "token 0 chooses expert 3; expected [0, 3)");
  testing::check_throws<ValueError>([&] { nn::plan_dispatch(twice, two, 2, 3, std::nullopt, DropPolicy::Probs); },
                                    "token 0 chooses expert 1 twice");
}

// Output and every gradient (router, experts, input) equal the per-token
// reference's, dropless and with capacity under both drop policies.
BOOST_AUTO_TEST_CASE(the_layer_equals_a_token_by_token_reference) {
  const std::vector<Case> cases{{1, false, std::nullopt},
                                {2, false, std::nullopt},
                                {2, true, std::nullopt},
                                {2, false, 0.5, DropPolicy::Probs},
                                {2, true, 0.75, DropPolicy::Position},
                                {1, false, 1.0, DropPolicy::Probs}};
  std::uint64_t seed = 11;
  for (const Case& c : cases) {
    nn::MoE<Tensor> m = layer({.experts = kExperts, .top_k = c.top_k, .capacity_factor = c.capacity_factor,
                               .drop_policy = c.drop, .renormalize = c.renormalize, .aux_loss = 0},
                              seed);
    Tensor x = Tensor::randn({2, 5, kDim}, DType::Float64, seed + 100);
    x.requires_grad_();
    const Tensor w = Tensor::randn({2, 5, kDim}, DType::Float64, seed + 200);
    seed += 7;
    const Tensor got = m(x);
    const Tensor want = reference(m, x);
    if (c.capacity_factor && *c.capacity_factor < 1)
      BOOST_TEST(m.state->last_dropped > 0, c << ": nothing dropped");
    const std::vector<double> g = values(got), r = values(want);
    for (std::size_t i = 0; i < r.size(); ++i)
      BOOST_TEST(testing::close(g[i], r[i], 1e-12 * (1 + std::abs(r[i]))), c << ": output " << i << " " << g[i]
                                                                              << " vs " << r[i]);
    const auto got_grads = gradients(got, w, m, x);
    const auto want_grads = gradients(want, w, m, x);
    for (std::size_t p = 0; p < want_grads.size(); ++p)
      for (std::size_t i = 0; i < want_grads[p].size(); ++i)
        BOOST_TEST(testing::close(got_grads[p][i], want_grads[p][i], 1e-12 * (1 + std::abs(want_grads[p][i]))),
                   c << ": gradient " << p << "[" << i << "] " << got_grads[p][i] << " vs " << want_grads[p][i]);
  }
}

// Switch's loss alpha * E * sum_i f_i P_i is alpha when the probabilities
// are uniform (sum f_i = 1), whatever the routing; otherwise its formula on
// the host's values. The z-loss is mean(logsumexp(logits)^2) times its
// coefficient. Both reach the model's loss.
BOOST_AUTO_TEST_CASE(balancing_losses_follow_their_formulas) {
  nn::MoE<Tensor> uniform = layer({.experts = kExperts, .top_k = 2, .aux_loss = 0.01}, 3);
  uniform.router = Tensor::zeros({kExperts, kDim}, DType::Float64);
  const Tensor x = Tensor::randn({2, 3, kDim}, DType::Float64, 5);
  uniform(x);
  BOOST_TEST(std::abs(uniform.state->aux_loss - 0.01) < 1e-15, uniform.state->aux_loss);
  BOOST_TEST(uniform.state->pending_loss.has_value());

  nn::MoE<Tensor> m = layer({.experts = kExperts, .top_k = 2, .aux_loss = 0.1, .z_loss = 0.001}, 9);
  m(x);
  const std::vector<double> logits = values(linear(reshape(x, {6, kDim}), m.router));
  double aux = 0, z = 0;
  std::vector<double> mean_p(kExperts, 0);
  for (int t = 0; t < 6; ++t) {
    double top = -1e300, total = 0;
    for (int e = 0; e < kExperts; ++e) top = std::max(top, logits[t * kExperts + e]);
    for (int e = 0; e < kExperts; ++e) total += std::exp(logits[t * kExperts + e] - top);
    for (int e = 0; e < kExperts; ++e) mean_p[e] += std::exp(logits[t * kExperts + e] - top) / total / 6;
    z += std::pow(top + std::log(total), 2) / 6;
  }
  for (int e = 0; e < kExperts; ++e) aux += static_cast<double>(m.state->last_load[e]) / 12 * mean_p[e];
  aux *= 0.1 * kExperts;
  BOOST_TEST(std::abs(m.state->aux_loss - aux) < 1e-14, m.state->aux_loss << " vs " << aux);
  BOOST_TEST(std::abs(m.state->z_loss - 0.001 * z) < 1e-14, m.state->z_loss << " vs " << 0.001 * z);
  BOOST_TEST(std::accumulate(m.state->last_load.begin(), m.state->last_load.end(), std::int64_t{0}) == 12);
}

// Balance::Bias: b_i moves by the rate towards the mean load after each
// update, and the selection (not the gates) follows it.
BOOST_AUTO_TEST_CASE(the_selection_bias_moves_towards_the_mean_load) {
  nn::MoE<Tensor> m = layer({.experts = kExperts, .top_k = 1, .balance = nn::Balance::Bias, .bias_rate = 0.25}, 21);
  const Tensor x = Tensor::randn({2, 4, kDim}, DType::Float64, 8);
  m(x);
  const std::vector<std::int64_t> load = m.state->last_load;
  m.end_step();
  for (int e = 0; e < kExperts; ++e) {
    const double gap = 8.0 / kExperts - static_cast<double>(load[e]);
    BOOST_TEST(m.state->bias[e] == 0.25 * ((gap > 0) - (gap < 0)), "expert " << e);
  }
  BOOST_TEST(!m.state->pending_loss.has_value(), "no auxiliary loss under the bias rule");
  m.state->bias.assign(kExperts, 0.0);
  m.state->bias[kExperts - 1] = 10;  // above any probability: every token chooses the last expert
  m(x);
  BOOST_TEST(m.state->last_load == (std::vector<std::int64_t>{0, 0, 0, 8}));
}

// A GPT whose second block is an MoE trains on one rank (its loss, the
// balancing loss included, goes down), the same on a mesh of one rank
// (test_moe_parallel: on more).
BOOST_AUTO_TEST_CASE(a_gpt_with_moe_blocks_trains_on_one_rank) {
  train::TrainOptions o;
  o.model = {.vocab = 256, .seq = 8, .layers = 2, .d_model = 16, .heads = 4, .dtype = DType::Float64};
  o.model.moe = {.experts = 4, .top_k = 2, .every = 2};
  o.batch = 4;
  o.steps = 12;
  o.warmup = 2;
  o.lr = 3e-3;
  o.seed = 7;
  o.val_batches = 1;
  static const train::TextData data(train::committed_slice_path());
  const train::TrainResult r = train::train(o, data, nullptr);
  BOOST_TEST(r.losses.back() < r.losses.front(), r.losses.front() << " -> " << r.losses.back());
  auto model = nn::GPT<Tensor>::init(o.model, o.seed, nn::plain_parameters(DType::Float64));
  BOOST_TEST(!model.blocks[0].moe.has_value());
  BOOST_TEST(model.blocks[1].moe.has_value());
  std::size_t experts_named = 0;
  for (const auto& [name, p] : model.named_parameters()) experts_named += name.starts_with("blocks.1.moe.");
  BOOST_TEST(experts_named == 5u);
  // On a mesh of one rank (DTensors, as train_gpt runs one rank) the same losses.
  if (testing::can_run(1)) {
    o.mesh = {1};
    o.dims = {"dp"};
    o.plans = {"ddp"};
    std::vector<double> on_mesh;
    testing::run_ranks(1, [&](Communicator& world) { on_mesh = train::train(o, data, &world).losses; });
    BOOST_TEST_REQUIRE(on_mesh.size() == r.losses.size());
    for (std::size_t i = 0; i < on_mesh.size(); ++i)
      BOOST_TEST(testing::close(on_mesh[i], r.losses[i], 1e-12 * std::abs(r.losses[i])),
                 "step " << i << ": " << on_mesh[i] << " on a mesh of one rank vs " << r.losses[i]);
    BOOST_TEST(r.expert_load.size() == 1u);
    BOOST_TEST(std::accumulate(r.expert_load[0].begin(), r.expert_load[0].end(), std::int64_t{0}) == 4 * 8 * 2,
               "the last step's assignments: batch 4 x seq 8 tokens, 2 each");
  }
}

BOOST_AUTO_TEST_SUITE_END()
