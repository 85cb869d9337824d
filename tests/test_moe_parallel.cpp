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


// A layer of E = 4 experts on D = 8 over a 1-D ep mesh, whose router sends
// token t (of each sequence of 4) to experts t and t + 1 (mod 4): every
// expert gets 2 of each sequence's 8 assignments. x [b * ranks, 4, 8].
struct BalancedLayer {
  nn::MoE<DTensor> layer;
  DTensor x;
};
constexpr std::int64_t kE = 4, kD = 8, kLen = 4;
BalancedLayer balanced_layer(const DeviceMesh& mesh, std::int64_t local_batch, std::optional<double> capacity) {
  const Layout r = Layout::replicated(1), s0{Shard{0}};
  Tensor router = Tensor::zeros({kE, kD}, DType::Float64);
  for (std::int64_t e = 0; e < kE; ++e) router.set({e, e}, 10.0);
  const std::int64_t batch = local_batch * mesh.size();
  Tensor x = Tensor::zeros({batch, kLen, kD}, DType::Float64);
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t t = 0; t < kLen; ++t) {
      x.set({b, t, t % kE}, 1.0);
      x.set({b, t, (t + 1) % kE}, 0.5);
      x.set({b, t, 4 + (t + b) % 4}, 0.1);  // tokens differ by sequence
    }
  auto param = [&](Shape shape, std::uint64_t seed, const Layout& layout) {
    DTensor p = distribute_tensor(mul(Tensor::randn(std::move(shape), DType::Float64, seed), 0.3), mesh, layout);
    p.requires_grad_();
    return p;
  };
  DTensor router_d = distribute_tensor(router, mesh, r);
  router_d.requires_grad_();
  nn::MoE<DTensor> layer{router_d,
                         param({kE, 4 * kD, kD}, 1, s0),
                         param({kE, 4 * kD}, 2, s0),
                         param({kE, kD, 4 * kD}, 3, s0),
                         param({kE, kD}, 4, s0),
                         {.experts = kE, .top_k = 2, .capacity_factor = capacity, .aux_loss = 0.01}};
  DTensor xd = distribute_tensor(x, mesh, s0);
  xd.requires_grad_();
  return {std::move(layer), std::move(xd)};
}

std::uint64_t bytes_of(const CommCounterByDims& counter, CollectiveKind kind) {
  std::uint64_t n = 0;
  for (const DimsCount& c : counter.counts())
    if (c.kind == kind) n += c.bytes;
  return n;
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

// One MoE layer's collectives on an ep dim of e ranks, T local tokens, k =
// 2, D = 8 f64: forward one all_to_all of the counts (E / e int64 to each
// peer), the dispatch and the combine (each T k (e - 1) / e rows of D * 8
// bytes each way under this balanced routing) and the statistics'
// all_reduce; backward the two all_to_allv the other way and nothing else.
// With capacity factor 0.5 (C = 1 per expert and sequence) each sequence
// sends E * C rows, (e - 1) / e of them off-rank.
BOOST_AUTO_TEST_CASE(a_layer_moves_exactly_its_off_rank_rows) {
  for (const std::int64_t ranks : {2, 4}) {
    if (!testing::can_run(ranks)) continue;
    for (const std::optional<double> capacity : {std::optional<double>{}, std::optional<double>{0.5}}) {
      const std::string what = fmt::format("ep = {}, capacity {}", ranks, capacity ? "0.5" : "none");
      testing::FailureLog log;
      testing::run_ranks(static_cast<int>(ranks), [&](Communicator& world) {
        DeviceMesh mesh(world, {ranks}, {"ep"});
        const std::int64_t local_batch = 2, tokens = local_batch * kLen;
        BalancedLayer l = balanced_layer(mesh, local_batch, capacity);
        const DTensor g = distribute_tensor(Tensor::randn({local_batch * ranks, kLen, kD}, DType::Float64, 9), mesh,
                                            Layout{Shard{0}});
        const std::int64_t rows = capacity ? local_batch * kE * 1 : tokens * 2;  // this rank's kept assignments
        const std::uint64_t off_rank = static_cast<std::uint64_t>(rows * (ranks - 1) / ranks) * kD * 8;
        const std::uint64_t counts = static_cast<std::uint64_t>((ranks - 1) * (kE / ranks)) * 8;
        CommCounterByDims forward(mesh);
        const DTensor y = l.layer(l.x);
        auto expect = [&](const char* phase, std::uint64_t got, std::uint64_t want, const char* of) {
          if (got != want) log.add(fmt::format("{}: {} {}, expected {}", phase, got, of, want));
        };
        expect("forward", forward.count({0}, CollectiveKind::AllToAll), 3, "all_to_all");
        expect("forward", forward.count({0}, CollectiveKind::AllReduce), 1, "all_reduce");
        expect("forward", bytes_of(forward, CollectiveKind::AllToAll), counts + 2 * off_rank, "all_to_all bytes");
        std::uint64_t others = 0;
        for (const DimsCount& c : forward.counts())
          if (c.kind != CollectiveKind::AllToAll && c.kind != CollectiveKind::AllReduce) others += c.count;
        expect("forward", others, 0, "other collectives");
        const std::int64_t kept = std::accumulate(l.layer.state->last_load.begin(), l.layer.state->last_load.end(),
                                                  std::int64_t{0}) - l.layer.state->last_dropped;
        expect("forward", static_cast<std::uint64_t>(kept), static_cast<std::uint64_t>(rows * ranks), "rows kept");
        CommCounterByDims backward(mesh);
        y.backward(g);
        expect("backward", backward.count({0}, CollectiveKind::AllToAll), 2, "all_to_all");
        expect("backward", bytes_of(backward, CollectiveKind::AllToAll), 2 * off_rank, "all_to_all bytes");
        std::uint64_t calls = 0;
        for (const DimsCount& c : backward.counts()) calls += c.count;
        expect("backward", calls, 2, "collectives in all");
        if (!l.layer.fc_weight.grad() || !l.x.grad()) log.add("no gradient reached the experts or x");
      });
      log.report(what);
    }
  }
  BOOST_TEST(true);  // the cases above report their own checks (none at an MPI size other than 2 and 4)
}

// Layouts the layer cannot run name themselves: tokens replicated over the
// experts' dim, experts that do not divide by ep.
BOOST_AUTO_TEST_CASE(layouts_it_cannot_run_are_named, *boost::unit_test::precondition(testing::ranks_available{2})) {
  testing::FailureLog log;
  testing::run_ranks(2, [&](Communicator& world) {
    DeviceMesh mesh(world, {2}, {"ep"});
    BalancedLayer l = balanced_layer(mesh, 1, std::nullopt);
    const DTensor replicated = l.x.redistribute(Layout::replicated(1));
    try {
      l.layer(replicated);
      log.add("tokens replicated over ep ran");
    } catch (const LayoutError& e) {
      if (std::string(e.what()).find("ep borrows data-parallel ranks") == std::string::npos) log.add(e.what());
    }
    nn::MoE<DTensor> odd = l.layer;
    odd.config.experts = 3;
    const Layout s0{Shard{0}};
    auto make = [&](Shape shape) { return distribute_tensor(Tensor::zeros(std::move(shape), DType::Float64), mesh, s0); };
    odd.router = distribute_tensor(Tensor::zeros({3, kD}, DType::Float64), mesh, Layout::replicated(1));
    odd.fc_weight = make({3, 4 * kD, kD});
    odd.fc_bias = make({3, 4 * kD});
    odd.proj_weight = make({3, kD, 4 * kD});
    odd.proj_bias = make({3, kD});
    try {
      odd(l.x);
      log.add("3 experts over 2 ep ranks ran");
    } catch (const ValueError& e) {
      if (std::string(e.what()).find("3 experts over an ep dim of 2 ranks") == std::string::npos) log.add(e.what());
    }
  });
  log.report("bad layouts");
  nn::GPTConfig config = small_config();
  config.moe = {.experts = 6, .top_k = 2};
  const std::vector<nn::DimPlan> plans{nn::ep()};
  testing::check_throws<ValueError>([&] { nn::check_plans_fit(plans, Shape{4}, config, 8); },
                                    "moe experts = 6 is not divisible by mesh dim 0 of size 4 (plan ep)");
  const std::vector<nn::DimPlan> fsdp{nn::fsdp()};
  testing::check_throws<UnsupportedError>([&] { nn::check_plans_fit(fsdp, Shape{2}, config, 8); },
                                          "mixture of experts under plan fsdp");
}

// Ranks that disagree about the routing (here the number of experts, so
// the count exchange's sizes differ) get a typed error on every rank from
// the communicator, never a hang.
BOOST_AUTO_TEST_CASE(ranks_that_route_differently_fail_by_type,
                     *boost::unit_test::precondition(testing::ranks_available{2})) {
  if (testing::test_backend() != "threads") {
    BOOST_TEST_MESSAGE("threads only: under MPI a rank that throws ends the job");
    BOOST_TEST(testing::test_backend() == "mpi");
    return;
  }
  testing::FailureLog log;
  testing::run_ranks(
      2,
      [&](Communicator& world) {
        DeviceMesh mesh(world, {2}, {"ep"});
        const std::int64_t experts = world.rank() == 0 ? 4 : 2;
        const Layout s0{Shard{0}};
        // Each rank's own view (distribute_tensor would take rank 0's shapes).
        auto make = [&](Shape shape, bool split) {
          Shape local = shape;
          if (split) local[0] /= 2;
          return DTensor::from_local(Tensor::zeros(local, DType::Float64), mesh,
                                     split ? s0 : Layout::replicated(1), shape, FromLocalCheck::Trust);
        };
        nn::MoE<DTensor> layer{make({experts, kD}, false), make({experts, 4 * kD, kD}, true),
                               make({experts, 4 * kD}, true), make({experts, kD, 4 * kD}, true),
                               make({experts, kD}, true), {.experts = experts, .top_k = 2}};
        const DTensor x = distribute_tensor(Tensor::ones({2, kLen, kD}, DType::Float64), mesh, s0);
        try {
          NoGradGuard no_grad;
          layer(x);
          log.add(fmt::format("rank {}: routed with {} experts, its peer with another number, and returned",
                              world.rank(), experts));
        } catch (const CommError& e) {
          BOOST_TEST_MESSAGE("rank " << world.rank() << ": " << e.what());
        }
      },
      std::chrono::milliseconds(5000));
  log.report("ranks that route differently");
}

BOOST_AUTO_TEST_SUITE_END()
