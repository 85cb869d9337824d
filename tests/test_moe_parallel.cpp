// Expert parallelism (nn/moe.h on DTensors, the ep plan): f64 training
// under ep, ep x dp, ep x tp and dp x ep x tp equals one rank's (losses to
// 1e-9 with clipping on, so the global norm must match too); one step's
// gradient of every parameter equals one rank's to 1e-12, the experts'
// reduced over exactly the ranks that hold them (their layout says which,
// and a gradient reduced over ep as well comes out 2x and is caught); the
// bias update matches one rank's bit for bit; a layer's collectives and
// bytes are those of the routing (one count exchange and two all_to_allv
// forward, two backward, each rank sending exactly its off-rank rows).
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <mutex>
#include <numeric>

#include <fmt/ranges.h>

#include <dtensor/nn/modules.h>
#include <dtensor/nn/optim.h>
#include <dtensor/nn/parallel_plan.h>

#include "dtensor/api/functional.h"
#include "dtensor/api/pointwise.h"
#include "dtensor/api/reduction.h"
#include "dtensor/train/trainer.h"
#include "support.h"

using namespace dtensor;

namespace moe_parallel_suite {

const train::TextData& slice() {
  static const train::TextData data(train::committed_slice_path());
  return data;
}

nn::GPTConfig small_config() {
  return {.vocab = 256, .seq = 8, .layers = 2, .d_model = 16, .heads = 4, .dtype = DType::Float64};
}

struct Run {
  Shape mesh;
  std::vector<std::string> dims, plans;
  nn::MoEConfig moe;
};
std::string name_of(const Run& r) {
  return fmt::format("mesh {} ({}) plan {}, {} experts top-{} capacity {} {} {}", fmt::join(r.mesh, "x"),
                     fmt::join(r.dims, ","), fmt::join(r.plans, ","), r.moe.experts, r.moe.top_k,
                     r.moe.capacity_factor ? fmt::format("{}", *r.moe.capacity_factor) : std::string("none"),
                     r.moe.drop_policy == nn::DropPolicy::Probs ? "probs" : "position",
                     r.moe.balance == nn::Balance::Bias ? "bias" : "aux");
}

using nn::Balance;
using nn::DropPolicy;

// Every mesh of the issue under each plan, spread over the routing
// variants: dropless, capacity under both drop policies, both balancing
// rules, top-1 and top-2, renormalised gates.
const std::vector<Run>& runs() {
  static const std::vector<Run> all{
      {{2}, {"ep"}, {"ep"}, {.experts = 4, .top_k = 2, .z_loss = 1e-3}},
      {{4}, {"ep"}, {"ep"}, {.experts = 4, .top_k = 2, .capacity_factor = 1.0, .drop_policy = DropPolicy::Probs}},
      {{4}, {"ep"}, {"ep"}, {.experts = 8, .top_k = 1, .balance = Balance::Bias, .bias_rate = 1e-2}},
      {{2, 2},
       {"dp", "ep"},
       {"ddp", "ep"},
       {.experts = 4, .top_k = 2, .capacity_factor = 0.75, .drop_policy = DropPolicy::Position}},
      {{2, 4}, {"dp", "ep"}, {"zero1", "ep"}, {.experts = 8, .top_k = 2, .renormalize = true}},
      {{2, 2}, {"ep", "tp"}, {"ep", "tp"}, {.experts = 4, .top_k = 2, .z_loss = 1e-3}},
      {{2, 4},
       {"ep", "tp"},
       {"ep", "tp_sp"},
       {.experts = 4, .top_k = 2, .capacity_factor = 1.0, .balance = Balance::Bias, .bias_rate = 1e-2}},
      {{2, 2, 2},
       {"dp", "ep", "tp"},
       {"ddp", "ep", "tp"},
       {.experts = 4, .top_k = 2, .capacity_factor = 0.75, .drop_policy = DropPolicy::Probs, .z_loss = 1e-3}},
  };
  return all;
}

train::TrainOptions options(const nn::MoEConfig& moe) {
  train::TrainOptions o;
  o.model = small_config();
  o.model.moe = moe;
  o.batch = 8;
  o.steps = 20;
  o.warmup = 2;
  o.lr = 3e-3;
  o.weight_decay = 0.1;
  o.clip = 0.5;  // the gradients exceed it: every step's update scales by the global norm
  o.seed = 7;
  o.val_batches = 1;
  return o;
}

train::TrainResult run_on_mesh(train::TrainOptions o, const Run& r) {
  o.mesh = r.mesh;
  o.dims = r.dims;
  o.plans = r.plans;
  train::TrainResult out;
  std::mutex mu;
  testing::run_ranks(static_cast<int>(numel(r.mesh)), [&](Communicator& world) {
    train::TrainResult got = train::train(o, slice(), &world);
    if (testing::reports_results(world)) {
      std::lock_guard lock(mu);
      out = std::move(got);
    }
  });
  return out;
}

double relative(double got, double want) { return std::abs(got - want) / std::max(std::abs(want), 1e-300); }

std::vector<double> values(const Tensor& t) {
  const Tensor d = t.detach().to(DType::Float64);
  return {d.data_as<double>(), d.data_as<double>() + d.numel()};
}

// Gradients against one rank's, relative to the parameter's largest (or,
// for one whose gradient is zero up to rounding, as attention's key bias,
// 1e-6 of the model's largest): the first mismatch (NaN fails).
std::vector<std::string> mismatches(const std::string& name, const std::vector<double>& got,
                                    const std::vector<double>& want, double rtol, double model_scale) {
  if (got.size() != want.size())
    return {fmt::format("{}: {} gradient values, one rank has {}", name, got.size(), want.size())};
  double scale = 1e-6 * model_scale;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (std::size_t i = 0; i < want.size(); ++i)
    if (!(std::abs(got[i] - want[i]) <= rtol * scale))
      return {fmt::format("{}[{}]: {} vs one rank's {} (largest {})", name, i, got[i], want[i], scale)};
  return {};
}

// A batch of the committed text, [8, 8] tokens and their targets.
std::pair<Tensor, Tensor> batch() {
  const train::Batch b = slice().next_batch(train::Split::Train, 8, 8, 0, 3);
  return {Tensor::from_vector(b.inputs, {8, 8}), Tensor::from_vector(b.targets, {8, 8})};
}

struct OneRank {
  std::vector<std::pair<std::string, std::vector<double>>> grads;
  double norm = 0;
  std::vector<std::vector<double>> bias;  // per MoE block, after one end_moe_step
  double scale = 0;                       // the largest gradient element
};

OneRank one_rank_step(const nn::GPTConfig& config) {
  auto model = nn::GPT<Tensor>::init(config, 7, nn::plain_parameters(DType::Float64));
  const auto [tokens, targets] = batch();
  model.loss(tokens, targets).backward();
  OneRank out;
  for (const auto& [name, p] : model.named_parameters()) {
    out.grads.emplace_back(name, values(*p->grad()));
    for (double g : out.grads.back().second) out.scale = std::max(out.scale, std::abs(g));
  }
  const std::vector<Tensor> params = model.parameters();
  out.norm = nn::clip_grad_norm<Tensor>(params, 1e300);
  model.end_moe_step();
  for (const auto& block : model.blocks)
    if (block.moe) out.bias.push_back(block.moe->state->bias);
  return out;
}

}  // namespace moe_parallel_suite

using namespace moe_parallel_suite;

BOOST_AUTO_TEST_SUITE(moe_parallel)

// 20 steps with clipping on every runnable mesh and plan: one rank's losses
// to 1e-9, and the last step's load per expert and drops exactly.
BOOST_DATA_TEST_CASE(every_plan_trains_as_one_rank, boost::unit_test::data::xrange(runs().size()), index) {
  const Run& r = runs()[index];
  if (!testing::can_run(numel(r.mesh))) {
    BOOST_TEST_MESSAGE("skipped here (an MPI job of another size): " << name_of(r));
    BOOST_TEST(testing::test_backend() == "mpi");
    return;
  }
  const train::TrainOptions o = options(r.moe);
  const train::TrainResult want = train::train(o, slice(), nullptr);
  const train::TrainResult got = run_on_mesh(o, r);
  BOOST_TEST(want.losses.back() < want.losses.front(), name_of(r) << ": the loss goes down");
  BOOST_TEST_REQUIRE(got.losses.size() == want.losses.size(), name_of(r));
  for (std::size_t i = 0; i < want.losses.size(); ++i)
    BOOST_TEST(relative(got.losses[i], want.losses[i]) <= 1e-9,
               name_of(r) << ": step " << i << " loss " << got.losses[i] << " vs one rank's " << want.losses[i]);
  BOOST_TEST(relative(got.val_loss, want.val_loss) <= 1e-9, name_of(r) << ": validation loss");
  BOOST_TEST(got.expert_load == want.expert_load, name_of(r) << ": the last step's load per expert");
  BOOST_TEST(got.dropped == want.dropped, name_of(r) << ": dropped " << got.dropped << " vs " << want.dropped);
  if (r.moe.capacity_factor && *r.moe.capacity_factor < 1) BOOST_TEST(want.dropped > 0, name_of(r));
}

// One step's gradients on dp x ep (and ep x tp, dp x ep x tp): every
// parameter's equals one rank's to 1e-12, the global norm too, and the bias
// update (Balance::Bias) is one rank's bit for bit. The experts' gradients
// come back Partial over dp only: the optimizer reduces them over the ranks
// that hold the same experts. A mutant that also sums over ep (as if the
// experts were dense, replicated parameters) gives 2x, and the same check
// reports it.
BOOST_AUTO_TEST_CASE(one_step_gradients_equal_one_rank) {
  struct Mesh {
    Shape shape;
    std::vector<std::string> dims, plans;
  };
  const std::vector<Mesh> meshes{{{2, 2}, {"dp", "ep"}, {"ddp", "ep"}},
                                 {{2, 2}, {"ep", "tp"}, {"ep", "tp"}},
                                 {{2, 2, 2}, {"dp", "ep", "tp"}, {"ddp", "ep", "tp"}}};
  nn::GPTConfig config = small_config();
  config.moe = {.experts = 4, .top_k = 2, .capacity_factor = 1.0, .balance = Balance::Bias, .bias_rate = 0.5};
  const OneRank want = one_rank_step(config);
  int ran = 0;
  for (const Mesh& m : meshes) {
    if (!testing::can_run(numel(m.shape))) continue;
    ++ran;
    const std::string what = fmt::format("mesh {} ({})", fmt::join(m.shape, "x"), fmt::join(m.dims, ","));
    testing::FailureLog log;
    testing::run_ranks(static_cast<int>(numel(m.shape)), [&](Communicator& world) {
      DeviceMesh mesh(world, m.shape, m.dims);
      std::vector<nn::DimPlan> per_dim;
      for (const auto& p : m.plans) per_dim.push_back(nn::plan_named(p));
      nn::ParallelPlan plan(mesh, per_dim);
      auto model = nn::GPT<DTensor>::init(config, 7, plan.parameter_factory(DType::Float64), plan.activations());
      const auto [tokens, targets] = batch();
      const Layout batch_layout = plan.batch_layout();
      model.loss(distribute_tensor(tokens, mesh, batch_layout), distribute_tensor(targets, mesh, batch_layout))
          .backward();
      const int dp = mesh.dim_names().front() == "dp" ? 0 : -1;
      const int ep = mesh.dim_index("ep");
      std::size_t i = 0;
      for (const auto& [name, p] : model.named_parameters()) {
        const DTensor g = *p->grad();
        if (name.find(".experts.fc.weight") != std::string::npos) {
          // Partial over exactly the dims whose ranks hold the same experts and saw different tokens.
          for (int d = 0; d < mesh.ndim(); ++d) {
            const bool partial = std::holds_alternative<Partial>(g.placements()[d]);
            if (partial != (d == dp)) log.add(fmt::format("{} gradient in layout {}", name, g.placements()));
          }
          if (!is_shard(g.placements()[ep], 0)) log.add(fmt::format("{}: not S(0) over ep", name));
          if (dp >= 0) {
            // The mutant: the reduced gradient summed over ep as well.
            const Tensor reduced = g.full_tensor();
            const DTensor wrong = DTensor::from_local(reduced, mesh, Layout::replicated(mesh.ndim()).with(ep, Partial{}),
                                                      reduced.shape(), FromLocalCheck::Trust);
            if (mismatches(name, values(wrong.full_tensor()), want.grads[i].second, 1e-12, want.scale).empty())
              log.add(fmt::format("{}: a gradient reduced over ep too passed the check", name));
          }
        }
        for (const std::string& bad : mismatches(name, values(g.full_tensor()), want.grads[i].second, 1e-12, want.scale))
          log.add(bad);
        ++i;
      }
      const std::vector<DTensor> params = model.parameters();
      const double norm = nn::clip_grad_norm<DTensor>(params, 1e300);
      if (!(relative(norm, want.norm) <= 1e-12))
        log.add(fmt::format("global norm {} vs one rank's {}", norm, want.norm));
      model.end_moe_step();
      std::size_t b = 0;
      for (const auto& block : model.blocks)
        if (block.moe && block.moe->state->bias != want.bias[b++])
          log.add(fmt::format("block bias {} vs one rank's {}", block.moe->state->bias, want.bias[b - 1]));
    });
    log.report(what);
  }
  if (ran == 0) BOOST_TEST_MESSAGE("no mesh of this job's size");
  BOOST_TEST(ran + (testing::test_backend() == "mpi") > 0);
}

BOOST_AUTO_TEST_SUITE_END()
