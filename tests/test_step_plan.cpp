// StepPlan strings (nn::StepPlan) and validate(): strings round-trip and
// bad ones are named; every rule has an accepting and a rejecting case with
// its exact message; and validate() agrees with running one step of the
// trainer on thread ranks over a grid of plans for two small GPTs on 1-4
// ranks, and over every pipeline schedule: no false accept, no false
// reject.
#include <boost/test/unit_test.hpp>

#include <dtensor/nn/step_plan.h>

#include "dtensor/train/trainer.h"
#include "support.h"

using namespace dtensor;
using nn::StepPlan;

namespace step_plan_suite {

nn::GPTConfig small(std::int64_t layers = 2, std::int64_t heads = 4, std::int64_t seq = 8) {
  return {.vocab = 256, .seq = seq, .layers = layers, .d_model = 16, .heads = heads, .dtype = DType::Float64};
}

std::string rules_of(const std::vector<nn::Violation>& broken) {
  std::vector<std::string> out;
  for (const auto& v : broken) out.push_back(v.rule);
  return fmt::format("{}", fmt::join(out, ","));
}

// Every ordered way to write `world` as a product of 1 or 2 factors above 1
// (world 1: one dim of size 1).
std::vector<Shape> meshes_of(std::int64_t world) {
  if (world == 1) return {{1}};
  std::vector<Shape> out{{world}};
  for (std::int64_t a = 2; a < world; ++a)
    if (world % a == 0 && world / a > 1) out.push_back({a, world / a});
  return out;
}

// Runs one trainer step of `plan` on thread ranks and notes in `log` where
// validate() disagrees with it (a plan accepted whose step fails, or a plan
// rejected whose step trains); counts the verdicts.
struct Oracle {
  const train::TextData data{train::committed_slice_path()};
  testing::FailureLog log;
  std::size_t accepted = 0, rejected = 0;

  void check(const nn::StepPlan& plan, const nn::GPTConfig& config, std::int64_t batch) {
    const std::int64_t world = numel(plan.mesh());
    const auto broken = nn::validate(plan, config, batch, world);
    train::TrainOptions o;
    o.model = config;
    o.batch = batch;
    o.micro_batches = plan.micro_batches;
    o.steps = 1;
    o.warmup = 0;
    o.val_batches = 0;
    o.mesh = plan.mesh();
    o.dims = plan.dim_names();
    o.plans = plan.plans();
    o.schedule = plan.schedule;
    o.virtual_stages = plan.virtual_stages;
    std::string error;
    try {
      testing::run_ranks(static_cast<int>(world), [&](Communicator& comm) { train::train(o, data, &comm); });
    } catch (const Error& e) {
      error = e.what();
    }
    const std::string what = fmt::format("{} (heads {}, layers {}, seq {}, batch {})", plan.str(), config.heads,
                                         config.layers, config.seq, batch);
    if (broken.empty() && !error.empty()) log.add(fmt::format("{}: accepted, but the step failed: {}", what, error));
    if (!broken.empty() && error.empty())
      log.add(
          fmt::format("{}: rejected ({}: {}), but the step trained", what, rules_of(broken), broken.front().message));
    (broken.empty() ? accepted : rejected) += 1;
  }
};

}  // namespace step_plan_suite

using namespace step_plan_suite;

BOOST_AUTO_TEST_SUITE(step_plan)

BOOST_AUTO_TEST_CASE(strings_round_trip) {
  for (const char* text : {"dp2.zero1,tp2.sp,mb4", "dp8.ddp", "pp2.1f1b,dp2.fsdp,mb2", "pp2.interleaved.v2,mb4",
                           "ep2.ep,tp2.tp", "rep2.ddp,shard4.fsdp", "pp4.zbv.v2,mb8", "world1.ddp"}) {
    const StepPlan s = StepPlan::parse(text);
    BOOST_TEST(s.str() == text);
    BOOST_TEST((StepPlan::parse(s.str()) == s), text);
  }
  BOOST_TEST(StepPlan::parse("tp2.tp_sp").str() == "tp2.sp");
  const StepPlan s = StepPlan::parse("dp2.zero1,tp4.sp,mb4");
  BOOST_TEST(s.mesh() == (Shape{2, 4}));
  BOOST_TEST(s.dim_names() == (std::vector<std::string>{"dp", "tp"}));
  BOOST_TEST(s.plans() == (std::vector<std::string>{"zero1", "tp_sp"}));
  BOOST_TEST(s.micro_batches == 4);
  const StepPlan p = StepPlan::parse("pp2.interleaved.v2,dp2.ddp");
  BOOST_TEST(p.plans() == (std::vector<std::string>{"pp", "ddp"}));
  BOOST_TEST(p.schedule == "interleaved");
  BOOST_TEST(p.virtual_stages == 2);
}

BOOST_AUTO_TEST_CASE(bad_strings_are_named) {
  for (const auto& [text, why] : {
           std::pair{"", "item '' does not start with a mesh dim's name (lower-case letters and '_')"},
           std::pair{"DP2.ddp", "item 'DP2.ddp' does not start with a mesh dim's name"},
           std::pair{"dp", "item 'dp' has no positive size after the dim's name"},
           std::pair{"dp0.ddp", "item 'dp0.ddp' has no positive size after the dim's name"},
           std::pair{"dp2", "item 'dp2' has no plan after the size"},
           std::pair{"dp2.foo",
                     "item 'dp2.foo' names no plan ('foo'; plans: ddp, zero1, fsdp, tp, sp, ep; "
                     "schedules: gpipe, 1f1b, interleaved, zb-h1, zbv, dualpipev)"},
           std::pair{"dp2.pp", "item 'dp2.pp' names plan pp without its schedule (pp2.1f1b)"},
           std::pair{"pp2.1f1b,pq2.gpipe", "item 'pq2.gpipe' is a second pipeline dim"},
           std::pair{"pp2.interleaved.x2", "item 'pp2.interleaved.x2' ends in something other than vV"},
           std::pair{"pp2.interleaved.v2.v3", "item 'pp2.interleaved.v2.v3' has more than a schedule and vV"},
           std::pair{"dp2.ddp.x", "item 'dp2.ddp.x' has more than a plan after the size"},
           std::pair{"dp2.ddp,mb0", "item 'mb0' has no positive count of micro-batches"},
           std::pair{"dp2.ddp,mb2,mb4", "item 'mb4' gives the micro-batches a second time"},
           std::pair{"mb4", "item 'mb4' has no mesh dim"},
       })
    testing::check_throws<ParseError>([&] { (void)StepPlan::parse(text); },
                                      fmt::format("[step plan] '{}': {}", text, why));
}

// Each rule: a strategy that keeps it (no violation) and one that breaks
// it (that violation alone, with its exact message); then all at once.
BOOST_AUTO_TEST_CASE(every_rule_accepts_and_rejects_with_its_message) {
  nn::GPTConfig moe = small();
  moe.moe = {.experts = 3, .top_k = 1};
  nn::GPTConfig odd_vocab = small();
  odd_vocab.vocab = 255;
  struct Rule {
    const char* rule;
    nn::GPTConfig config;
    std::int64_t batch, world;
    const char *keeps, *breaks, *message;
  };
  const Rule rules[] = {
      {"WORLD", small(), 4, 4, "dp2.ddp,tp2.tp", "dp2.ddp", "[step plan] a mesh of 2 is 2 ranks; the world has 4"},
      {"NAMES", small(), 4, 4, "dp2.ddp,tp2.tp", "dp2.ddp,dp2.tp",
       "[step plan] mesh dim 'dp' named twice; expected distinct names"},
      {"HEADS", small(), 4, 8, "dp2.ddp,tp4.tp", "tp8.tp",
       "[plan] heads = 4 is not divisible by mesh dim 0 of size 8 (plan tp)"},
      {"VOCAB", odd_vocab, 4, 4, "dp4.ddp", "dp2.ddp,tp2.tp",
       "[plan] vocab = 255 is not divisible by mesh dim 1 of size 2 (plan tp)"},
      {"BATCH", small(), 6, 4, "dp2.ddp,tp2.tp", "dp4.zero1",
       "[plan] batch = 6 is not divisible by mesh dim 0 of size 4 (plan zero1)"},
      {"SEQ", small(2, 4, 6), 4, 4, "tp2.sp,dp2.ddp", "tp4.sp",
       "[plan] seq = 6 is not divisible by mesh dim 0 of size 4 (plan tp_sp)"},
      {"MOE", moe, 4, 2, "dp2.zero1", "dp2.fsdp",
       "[plan] mixture of experts under plan fsdp (mesh dim 0 of size 2); expected ep, ddp, zero1, tp or tp_sp"},
      {"STATES", small(), 4, 4, "dp2.ddp,sh2.fsdp", "dp2.zero1,sh2.fsdp",
       "[plan] zero1 on mesh dim 0 with fsdp on mesh dim 1: ZeRO's optimizer states cannot split inside fsdp's "
       "parameter shards; expected fsdp on both (or ddp,fsdp: HSDP)"},
      {"LAYERS", small(3), 4, 4, "pp2.1f1b,dp2.ddp,mb2", "pp4.1f1b,mb4",
       "[plan] layers = 3 over mesh dim 0 of size 4 (plan pp): every stage needs at least one block"},
  };
  for (const Rule& r : rules) {
    const auto kept = nn::validate(StepPlan::parse(r.keeps), r.config, r.batch, r.world);
    BOOST_TEST(kept.empty(), r.rule << ": " << r.keeps << " broke " << rules_of(kept));
    const auto broken = nn::validate(StepPlan::parse(r.breaks), r.config, r.batch, r.world);
    // Too few layers for the stages also fails the schedule's split (PP).
    const std::string expected = std::string(r.rule) == "LAYERS" ? "LAYERS,PP" : r.rule;
    BOOST_TEST_REQUIRE(rules_of(broken) == expected, r.rule << ": " << r.breaks << " broke " << rules_of(broken));
    BOOST_TEST(broken[0].rule == r.rule);
    BOOST_TEST(broken[0].message == r.message);
    BOOST_TEST(broken[0].unsupported == (std::string(r.rule) == "MOE" || std::string(r.rule) == "STATES"), r.rule);
  }
  // EXPERTS: 3 experts over ep 2, and over ep 3.
  const auto experts = nn::validate(StepPlan::parse("ep2.ep"), moe, 4, 2);
  BOOST_TEST_REQUIRE(experts.size() == 1u, rules_of(experts));
  BOOST_TEST(experts[0].rule == "EXPERTS");
  BOOST_TEST(experts[0].message == "[plan] moe experts = 3 is not divisible by mesh dim 0 of size 2 (plan ep)");
  BOOST_TEST(nn::validate(StepPlan::parse("ep3.ep"), moe, 3, 3).empty());
  // PP: the schedule's own refusal (dualpipev needs m >= 2p), and a fit.
  BOOST_TEST(nn::validate(StepPlan::parse("pp2.dualpipev.v2,mb4"), small(4), 4, 2).empty());
  const auto pp = nn::validate(StepPlan::parse("pp2.dualpipev.v2,mb2"), small(4), 4, 2);
  BOOST_TEST_REQUIRE(pp.size() == 1u, rules_of(pp));
  BOOST_TEST(pp[0].rule == "PP");
  BOOST_TEST(pp[0].message.find("dualpipev") != std::string::npos, pp[0].message);
  // Two pipeline dims (a hand-built plan: the string refuses them).
  nn::StepPlan two = nn::StepPlan::parse("pp2.1f1b,dp2.ddp,mb2");
  two.dims[1].plan = "pp";
  const auto twice = nn::validate(two, small(4), 4, 4);
  BOOST_TEST_REQUIRE(!twice.empty());
  BOOST_TEST(twice[0].rule == "PP");
  BOOST_TEST(twice[0].message == "[plan] mesh dims 0, 1 all have plan pp; expected at most one pipeline dim");
  // Everything a strategy breaks, at once, in the catalogue's order.
  const auto all = nn::validate(StepPlan::parse("dp3.ddp,dp8.tp"), small(), 4, 16);
  BOOST_TEST(rules_of(all) == "WORLD,NAMES,BATCH,HEADS");
}

// The oracle: for two small GPTs (one that everything divides, one with 2
// heads, 3 layers, 6 positions and a batch of 6) and every strategy of 1 or
// 2 dims on 1-4 ranks (each dim's plan any of ddp, zero1, fsdp, tp, sp, ep
// and pp with 1F1B; 1 or 2 micro-batches), validate() accepts exactly the
// strategies whose first step trains.
BOOST_AUTO_TEST_CASE(validate_agrees_with_running_a_step) {
  const std::vector<std::string> plans{"ddp", "zero1", "fsdp", "tp", "tp_sp", "ep", "pp"};
  struct Model {
    nn::GPTConfig config;
    std::int64_t batch;
  };
  Oracle oracle;
  for (const Model& model : {Model{small(), 4}, Model{small(3, 2, 6), 6}})
    for (std::int64_t world = 1; world <= 4; ++world)
      for (const Shape& mesh : meshes_of(world)) {
        std::vector<std::vector<std::string>> choices{{}};
        for (std::size_t d = 0; d < mesh.size(); ++d) {
          std::vector<std::vector<std::string>> next;
          for (const auto& prefix : choices)
            for (const std::string& p : plans) {
              next.push_back(prefix);
              next.back().push_back(p);
            }
          choices = std::move(next);
        }
        for (const auto& chosen : choices)
          for (std::int64_t mb : {1, 2}) {
            StepPlan s;
            for (std::size_t d = 0; d < mesh.size(); ++d) s.dims.push_back({fmt::format("d{}", d), mesh[d], chosen[d]});
            s.micro_batches = mb;
            oracle.check(s, model.config, model.batch);
          }
      }
  BOOST_TEST_MESSAGE("validate() accepted " << oracle.accepted << " plans and rejected " << oracle.rejected);
  BOOST_TEST(oracle.accepted > 50u);
  BOOST_TEST(oracle.rejected > 50u);
  oracle.log.report("validate against a step");
}

// The oracle for pipelines: every schedule (with its stages per rank) on a
// pp dim of 2 or 4 ranks, alone or beside a data-parallel dim, for 1, 2, 4
// and 8 micro-batches and 4 or 6 blocks.
BOOST_AUTO_TEST_CASE(validate_agrees_with_running_a_pipeline_step) {
  Oracle oracle;
  for (std::int64_t layers : {4, 6})
    for (const char* text :
         {"pp2.gpipe", "pp2.1f1b", "pp2.interleaved.v2", "pp2.zb-h1", "pp2.zbv.v2", "pp2.dualpipev.v2", "pp4.1f1b",
          "pp4.interleaved.v2", "pp4.dualpipev.v2", "pp2.1f1b,dp2.ddp", "dp2.zero1,pp2.zbv.v2"})
      for (std::int64_t mb : {1, 2, 4, 8}) {
        StepPlan s = StepPlan::parse(text);
        s.micro_batches = mb;
        oracle.check(s, small(layers), 4);
      }
  BOOST_TEST_MESSAGE("validate() accepted " << oracle.accepted << " pipelined plans and rejected " << oracle.rejected);
  BOOST_TEST(oracle.accepted > 20u);
  BOOST_TEST(oracle.rejected > 5u);
  oracle.log.report("validate against a pipelined step");
}

BOOST_AUTO_TEST_SUITE_END()
