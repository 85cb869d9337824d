// The GPT of examples/train_gpt trained on the committed Shakespeare slice:
// on every mesh and plan the losses of 20 steps equal the plain one-rank
// run's (1e-9 relative in f64, 1e-4 in f32), greedy generation gives the
// same bytes, and each plan costs the collectives Megatron's and ZeRO's
// analysis says, counted by phase.
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

#include <dtensor/nn/parallel_plan.h>
#include <nlohmann/json.hpp>

#include "dtensor/train/trainer.h"
#include "support.h"

using namespace dtensor;
namespace fs = std::filesystem;

namespace gpt_suite {

train::TrainOptions small_model(DType dtype, std::int64_t steps = 20, std::int64_t layers = 2) {
  train::TrainOptions o;
  o.model = {.vocab = 256, .seq = 8, .layers = layers, .d_model = 16, .heads = 4, .dtype = dtype};
  o.batch = 4;
  o.steps = steps;
  o.warmup = std::min<std::int64_t>(2, steps);
  o.lr = 3e-3;
  o.weight_decay = 0.1;
  o.seed = 7;
  o.val_batches = 1;
  return o;
}

const train::TextData& slice() {
  static const train::TextData data(train::committed_slice_path());  // the same text with or without the cache
  return data;
}

// Rank 0's result of training on `mesh` under `plans` (thread ranks).
train::TrainResult run(train::TrainOptions o, Shape mesh, std::vector<std::string> dims, std::vector<std::string> plans) {
  o.mesh = mesh;
  o.dims = std::move(dims);
  o.plans = std::move(plans);
  train::TrainResult out;
  std::mutex mu;
  testing::run_ranks(static_cast<int>(numel(mesh)), [&](Communicator& world) {
    train::TrainResult r = train::train(o, slice(), &world);
    if (world.rank() == 0) {
      std::lock_guard lock(mu);
      out = std::move(r);
    }
  });
  return out;
}

// The Chrome trace of the last step of `o` on `mesh` under `plans` (thread
// ranks), read back; `tag` names its temporary file.
nlohmann::json traced(train::TrainOptions o, const Shape& mesh, const std::vector<std::string>& dims,
                      const std::vector<std::string>& plans, const std::string& tag) {
  const fs::path path = fs::temp_directory_path() / fmt::format("dtensor_gpt_{}_{}.json", tag, ::getpid());
  o.trace = path.string();
  run(o, mesh, dims, plans);
  std::ifstream in(path);
  BOOST_TEST_REQUIRE(in.good(), "no trace at " << path);
  nlohmann::json trace = nlohmann::json::parse(in);
  fs::remove(path);
  return trace;
}

void check_same_losses(const train::TrainResult& want, const train::TrainResult& got, double rtol,
                       const std::string& what) {
  BOOST_TEST_REQUIRE(got.losses.size() == want.losses.size(), what);
  for (std::size_t i = 0; i < want.losses.size(); ++i) {
    const double rel = std::abs(got.losses[i] - want.losses[i]) / std::abs(want.losses[i]);
    BOOST_TEST(rel <= rtol, what << ": step " << i << " loss " << got.losses[i] << " vs one rank's " << want.losses[i]
                                 << " (relative " << rel << ")");
  }
  const double val_rel = std::abs(got.val_loss - want.val_loss) / std::abs(want.val_loss);
  BOOST_TEST(val_rel <= rtol, what << ": validation loss " << got.val_loss << " vs " << want.val_loss);
}

struct Case {
  Shape mesh;
  std::vector<std::string> dims, plans;
};
std::string name_of(const Case& c) {
  return fmt::format("mesh {} ({}) plan {}", fmt::join(c.mesh, "x"), fmt::join(c.dims, ","), fmt::join(c.plans, ","));
}

const std::vector<Case>& every_plan() {
  static const std::vector<Case> cases{
      {{1}, {"dp"}, {"ddp"}},
      {{2}, {"dp"}, {"ddp"}},
      {{4}, {"dp"}, {"ddp"}},
      {{2}, {"dp"}, {"zero1"}},
      {{4}, {"dp"}, {"zero1"}},
      {{2}, {"tp"}, {"tp"}},
      {{4}, {"tp"}, {"tp"}},
      {{2}, {"tp"}, {"tp_sp"}},
      {{4}, {"tp"}, {"tp_sp"}},
      {{2, 2}, {"dp", "tp"}, {"ddp", "tp"}},
      {{2, 2}, {"dp", "tp"}, {"ddp", "tp_sp"}},
      {{2, 2}, {"dp", "tp"}, {"zero1", "tp"}},
      {{1}, {"dp"}, {"fsdp"}},  // fsdp dims of one rank: no recomputation (fully_shard.cpp)
      {{1, 2}, {"dp", "tp"}, {"fsdp", "tp"}},
      {{2}, {"dp"}, {"fsdp"}},
      {{4}, {"dp"}, {"fsdp"}},
      {{2, 2}, {"rep", "shard"}, {"ddp", "fsdp"}},  // HSDP
      {{2, 4}, {"dp", "tp"}, {"ddp", "tp"}},
      {{2, 4}, {"dp", "tp"}, {"ddp", "tp_sp"}},
      {{2, 4}, {"dp", "shard"}, {"ddp", "fsdp"}},
      {{2, 2}, {"dp", "tp"}, {"fsdp", "tp"}},
      {{2, 2}, {"dp", "tp"}, {"fsdp", "tp_sp"}},
      {{2, 4}, {"dp", "tp"}, {"fsdp", "tp"}},
  };
  return cases;
}

// The collectives one steady step issued in `phase`, of `kind`.
std::uint64_t count(const train::TrainResult& r, std::string_view phase, std::string_view kind) {
  std::uint64_t n = 0;
  for (const auto& c : r.comm)
    if (c.phase == phase && c.kind == kind) n += c.count;
  return n;
}
// The same, over exactly these mesh dims.
std::uint64_t count_over(const train::TrainResult& r, std::string_view phase, std::string_view kind,
                         const std::vector<std::string>& dims) {
  std::uint64_t n = 0;
  for (const auto& c : r.comm)
    if (c.phase == phase && c.kind == kind && c.mesh_dims == dims) n += c.count;
  return n;
}
// A run of the overlap tests.
struct Overlap {
  DType dtype;
  Shape mesh;
  std::vector<std::string> dims, plans;
  std::int64_t micro_batches;
};

std::uint64_t total(const train::TrainResult& r, std::string_view phase) {
  std::uint64_t n = 0;
  for (const auto& c : r.comm)
    if (c.phase == phase) n += c.count;
  return n;
}

// The overlap tests' claim "when, never what": the same losses, bit for bit.
void check_same_bits(const train::TrainResult& want, const train::TrainResult& got, const std::string& what) {
  BOOST_TEST_REQUIRE(got.losses.size() == want.losses.size(), what);
  for (std::size_t i = 0; i < want.losses.size(); ++i)
    BOOST_TEST(got.losses[i] == want.losses[i], what << ": step " << i);
  BOOST_TEST(got.val_loss == want.val_loss, what);
}

// A run's collectives, one line per phase, kind and dims, with counts and bytes.
std::vector<std::string> comm_rows(const train::TrainResult& r) {
  std::vector<std::string> out;
  for (const auto& c : r.comm)
    out.push_back(
        fmt::format("{} {} over {}: x{} {} bytes", c.phase, c.kind, fmt::join(c.mesh_dims, ","), c.count, c.bytes));
  return out;
}

}  // namespace gpt_suite

using namespace gpt_suite;

BOOST_AUTO_TEST_SUITE(gpt_training)

// With gradient clipping on (at a norm the gradients exceed), so that each
// plan's norm must equal the unsharded one for the losses to agree.
BOOST_AUTO_TEST_CASE(every_plan_matches_one_rank_in_f64) {
  auto o = small_model(DType::Float64);
  o.clip = 0.5;
  const train::TrainResult plain = train::train(o, slice(), nullptr);
  BOOST_TEST(plain.losses.back() < plain.losses.front(),
             "the loss goes down: " << plain.losses.front() << " -> " << plain.losses.back());
  for (const Case& c : every_plan()) check_same_losses(plain, run(o, c.mesh, c.dims, c.plans), 1e-9, name_of(c));
}

// GPT-2's tie: the lm_head reads the token embedding's weight, one
// parameter fewer ([vocab, d_model]) whose gradient sums both uses; every
// kind of plan (replicated, ZeRO, Megatron's vocab-parallel table and head
// on one S(0) weight, FSDP's root unit, FSDP over tp) gives one rank's
// losses, clipping included.
BOOST_AUTO_TEST_CASE(tied_embeddings_match_one_rank_under_every_kind_of_plan) {
  auto o = small_model(DType::Float64, 8);
  o.clip = 0.5;
  const train::TrainResult untied = train::train(o, slice(), nullptr);
  o.model.tie_embeddings = true;
  const train::TrainResult plain = train::train(o, slice(), nullptr);
  BOOST_TEST(plain.losses.back() != untied.losses.back(), "tying changes nothing: " << plain.losses.back());
  BOOST_TEST(plain.parameter_bytes + 256u * 16u * 8u == untied.parameter_bytes,
             "tied " << plain.parameter_bytes << " bytes of parameters, untied " << untied.parameter_bytes);
  auto model = nn::GPT<Tensor>::init(o.model, o.seed, nn::plain_parameters(DType::Float64));
  for (const auto& [name, p] : model.named_parameters()) BOOST_TEST(!name.starts_with("lm_head"), name);
  for (const Case& c : {Case{{2}, {"dp"}, {"ddp"}}, Case{{2}, {"dp"}, {"zero1"}}, Case{{2}, {"tp"}, {"tp"}},
                        Case{{2}, {"tp"}, {"tp_sp"}}, Case{{2}, {"dp"}, {"fsdp"}},
                        Case{{2, 2}, {"dp", "tp"}, {"fsdp", "tp"}}})
    check_same_losses(plain, run(o, c.mesh, c.dims, c.plans), 1e-9, "tied, " + name_of(c));
}

BOOST_AUTO_TEST_CASE(f32_matches_one_rank_to_1e_4) {
  const auto o = small_model(DType::Float32);
  const train::TrainResult plain = train::train(o, slice(), nullptr);
  for (const Case& c : {Case{{2, 2}, {"dp", "tp"}, {"ddp", "tp_sp"}}, Case{{4}, {"tp"}, {"tp"}}})
    check_same_losses(plain, run(o, c.mesh, c.dims, c.plans), 1e-4, name_of(c));
}

BOOST_AUTO_TEST_CASE(generation_gives_one_rank_bytes) {
  auto o = small_model(DType::Float64, 4);
  o.generate = 12;  // longer than seq: the cache restarts on the way
  const train::TrainResult plain = train::train(o, slice(), nullptr);
  BOOST_TEST(plain.generated.size() == 12u);
  for (const Case& c :
       {Case{{2, 2}, {"dp", "tp"}, {"ddp", "tp"}}, Case{{2}, {"tp"}, {"tp_sp"}}, Case{{2}, {"dp"}, {"fsdp"}}})
    BOOST_TEST(run(o, c.mesh, c.dims, c.plans).generated == plain.generated, name_of(c));
}

// The collective counts below are formulas in the number of blocks L; each
// runs at two block counts, so that two formulas agreeing at one L (3L+1 and
// 2L+2 at L = 1) cannot pass for each other.
const auto kLayerCounts = boost::unit_test::data::make({1, 3});

// Megatron's counts for L blocks on a tp dim of 2: an all_reduce where
// each row-parallel projection and the vocab-parallel embedding leave their
// Partial sums, 2L+1 in each direction. Two differences, each the planner's
// choice by bytes, asserted as such:
// - the loss: Megatron all_reduces three per-row values (row max, sum of
//   exps, target logit). Here the max is all_reduced (both its uses need it
//   whole), but the other two are reduce_scattered to the rows' shards (half
//   the bytes each), and the backward all_gathers the rows' log-sum-exp once.
// - the layer norms' weight gradients: their backward is linear in the
//   incoming Partial gradient, so it passes the Partial on instead of
//   reducing it first; the norms' weight and bias gradients are then reduced
//   in the step's one coalesced all_reduce.
BOOST_DATA_TEST_CASE(tensor_parallel_collectives, kLayerCounts, layers) {
  const auto r = run(small_model(DType::Float64, 2, layers), {2}, {"tp"}, {"tp"});
  const std::uint64_t L = static_cast<std::uint64_t>(layers);
  BOOST_TEST(count(r, "forward", "all_reduce") == 2 * L + 1 + 1);
  BOOST_TEST(count(r, "forward", "reduce_scatter") == 2u);
  BOOST_TEST(total(r, "forward") == 2 * L + 1 + 3);
  BOOST_TEST(count(r, "backward", "all_reduce") == 2 * L + 1);
  BOOST_TEST(count(r, "backward", "all_gather") == 1u);
  BOOST_TEST(total(r, "backward") == 2 * L + 1 + 1);
  BOOST_TEST(count(r, "optimizer", "all_reduce") == 1u);
  BOOST_TEST(total(r, "optimizer") == 1u);
}

// Sequence parallelism: each all_reduce of tp becomes an all_gather before
// the column-parallel layers (and the lm_head) and a reduce_scatter after
// the row-parallel ones (and the embedding), 2L+1 each way in each pass;
// the loss as under tp; the norms' and the position embedding's gradients,
// Partial over tp, in the step's one coalesced all_reduce (Megatron's
// all-reduce of sequence-parallel gradients).
BOOST_DATA_TEST_CASE(sequence_parallel_collectives, kLayerCounts, layers) {
  const auto r = run(small_model(DType::Float64, 2, layers), {2}, {"tp"}, {"tp_sp"});
  const std::uint64_t L = static_cast<std::uint64_t>(layers);
  BOOST_TEST(count(r, "forward", "all_gather") == 2 * L + 1);
  BOOST_TEST(count(r, "forward", "reduce_scatter") == 2 * L + 1 + 2);
  BOOST_TEST(count(r, "forward", "all_reduce") == 1u);
  BOOST_TEST(total(r, "forward") == 2 * (2 * L + 1) + 3);
  BOOST_TEST(count(r, "backward", "all_gather") == 2 * L + 1 + 1);
  BOOST_TEST(count(r, "backward", "reduce_scatter") == 2 * L + 1);
  BOOST_TEST(total(r, "backward") == 2 * (2 * L + 1) + 1);
  BOOST_TEST(count(r, "optimizer", "all_reduce") == 1u);
  BOOST_TEST(total(r, "optimizer") == 1u);
}

// DDP: nothing in the forward or backward; the gradients' one coalesced
// all_reduce in the step (this model fits one 25 MiB bucket). ZeRO-1: one
// coalesced reduce_scatter of the gradients to the states' shards, one
// all_gather of the updated parameters.
BOOST_AUTO_TEST_CASE(data_parallel_collectives) {
  for (const char* plan : {"ddp", "zero1"}) {
    const auto r = run(small_model(DType::Float64, 2), {4}, {"dp"}, {plan});
    BOOST_TEST(total(r, "forward") == 0u, plan);
    BOOST_TEST(total(r, "backward") == 0u, plan);
    if (std::string_view(plan) == "ddp") {
      BOOST_TEST(count(r, "optimizer", "all_reduce") == 1u);
      BOOST_TEST(total(r, "optimizer") == 1u);
    } else {
      BOOST_TEST(count(r, "optimizer", "reduce_scatter") == 1u);
      BOOST_TEST(count(r, "optimizer", "all_gather") == 1u);
      BOOST_TEST(total(r, "optimizer") == 2u);
      // The states are a quarter of DDP's (dp = 4: every parameter's dim 0
      // divides by 4), the parameters whole.
      const auto d = run(small_model(DType::Float64, 1), {4}, {"dp"}, {"ddp"});
      BOOST_TEST(r.parameter_bytes == d.parameter_bytes);
      BOOST_TEST(r.optimizer_state_bytes * 4 == d.optimizer_state_bytes);
    }
  }
}

// FSDP (ZeRO-3), L blocks: the forward gathers each block's unit and the root
// once (L+1); the backward gathers each block's again (its gathered
// parameters were freed after the forward) and reduce_scatters every unit's
// gradient (L+1); the step has nothing left to move.
BOOST_DATA_TEST_CASE(fully_sharded_collectives, kLayerCounts, layers) {
  const auto r = run(small_model(DType::Float64, 2, layers), {4}, {"dp"}, {"fsdp"});
  const std::uint64_t L = static_cast<std::uint64_t>(layers);
  BOOST_TEST(count(r, "forward", "all_gather") == L + 1);
  BOOST_TEST(total(r, "forward") == L + 1);
  BOOST_TEST(count(r, "backward", "all_gather") == L);
  BOOST_TEST(count(r, "backward", "reduce_scatter") == L + 1);
  BOOST_TEST(total(r, "backward") == 2 * L + 1);
  BOOST_TEST(total(r, "optimizer") == 0u);
}

// FSDP over tensor parallelism, L blocks: each parameter is its tp shard split
// again over dp (S(0)[1],S(0)[0] where both split dim 0). The root
// (embeddings, final norm, lm_head) is gathered over dp by one all_gather
// before the embedding and kept, each block by one all_gather in the
// forward and one again in the backward: the forward's L+1 and the
// backward's L of FSDP on one dim. Each unit's gradients leave in one call
// per collective they need: the tp-sharded ones one reduce_scatter over dp
// (L+1), the ones replicated over tp (norms, row-parallel biases, the
// position embedding), Partial over both dims, one all_reduce over dp,tp
// then a slice (L+1), so the step has nothing left to reduce. The tp dim's
// collectives are tp's, and the blocks' forward ones again in the backward
// (checkpointed).
BOOST_DATA_TEST_CASE(fully_sharded_over_tensor_parallel_collectives, kLayerCounts, layers) {
  const auto r = run(small_model(DType::Float64, 2, layers), {2, 2}, {"dp", "tp"}, {"fsdp", "tp"});
  const std::uint64_t L = static_cast<std::uint64_t>(layers);
  const std::vector<std::string> dp{"dp"}, tp{"tp"}, both{"dp", "tp"};
  BOOST_TEST(count_over(r, "forward", "all_gather", dp) == L + 1);
  BOOST_TEST(count_over(r, "forward", "all_reduce", tp) == 2 * L + 1 + 1);
  BOOST_TEST(count_over(r, "backward", "all_gather", dp) == L);
  BOOST_TEST(count_over(r, "backward", "reduce_scatter", dp) == L + 1);
  BOOST_TEST(count_over(r, "backward", "all_reduce", both) == L + 1);
  BOOST_TEST(count_over(r, "backward", "all_reduce", tp) == 2 * L + 1 + 2 * L);
  BOOST_TEST(count_over(r, "optimizer", "all_reduce", dp) == 0u);
  BOOST_TEST(count_over(r, "optimizer", "reduce_scatter", dp) == 0u);
}

// FSDP on dp = 4 keeps a quarter of DDP's parameter, gradient and optimizer
// state bytes per rank (up to one element per unit and tensor kind where a
// unit's length does not divide by 4); the gathered block is transient.
// Both are read from the peak of a step, activations included.
BOOST_AUTO_TEST_CASE(fully_sharded_memory_is_a_quarter_of_ddp) {
  // Wider and deeper than small_model, so that the states outweigh the
  // activations, as they do in the models FSDP is for.
  train::TrainOptions o = small_model(DType::Float64, 2);
  o.model.layers = 4;
  o.model.d_model = 64;
  const auto fsdp = run(o, {4}, {"dp"}, {"fsdp"});
  const auto ddp = run(o, {4}, {"dp"}, {"ddp"});
  const std::uint64_t fsdp_bytes = fsdp.parameter_bytes + fsdp.gradient_bytes + fsdp.optimizer_state_bytes;
  const std::uint64_t ddp_bytes = ddp.parameter_bytes + ddp.gradient_bytes + ddp.optimizer_state_bytes;
  const std::uint64_t units = 5, rounding = 4 * units * 4 * sizeof(double);  // the root and 4 blocks
  BOOST_TEST(4 * fsdp_bytes <= ddp_bytes + rounding, "fsdp " << fsdp_bytes << " B per rank, ddp " << ddp_bytes);
  BOOST_TEST(4 * fsdp_bytes >= ddp_bytes);

  // The peak of a step (everything the rank held at once, activations
  // included): FSDP saves DDP's 3/4 of the states above, less what it holds
  // for a moment, the gathered root and one gathered block with their
  // gradients (a unit's members' gradients become the flat's by one cat:
  // split's one node, not a zero-padded copy of the unit per member). DDP
  // holds one more copy of its gradients, the packed bucket of its
  // all_reduce, about as much at this size: measured 0.0x the gathered root
  // and block beyond DDP's peak; before the one cat it was 2.3x. With the
  // overlap (the default), FSDP also holds the next block's unit gathered
  // ahead and the last block's gradient in flight: measured 1.04x. Bound:
  // the root and three blocks.
  std::uint64_t root_bytes = 0, block_bytes = 0;
  auto plain = nn::GPT<Tensor>::init(o.model, 7, nn::plain_parameters(DType::Float64), {});
  for (const auto& [name, p] : plain.named_parameters()) {
    if (name.rfind("blocks.", 0) != 0) root_bytes += p->nbytes();
    if (name.rfind("blocks.0.", 0) == 0) block_bytes += p->nbytes();
  }
  const std::uint64_t transient = root_bytes + 3 * block_bytes;
  BOOST_TEST(fsdp.peak_bytes >= fsdp_bytes);
  BOOST_TEST(ddp.peak_bytes >= ddp_bytes);
  BOOST_TEST(fsdp.peak_bytes + (ddp_bytes - fsdp_bytes) <= ddp.peak_bytes + transient,
             "peak per rank: fsdp " << fsdp.peak_bytes << " B, ddp " << ddp.peak_bytes << " B; states fsdp "
                                    << fsdp_bytes << " B, ddp " << ddp_bytes << " B; gathered root " << root_bytes
                                    << " B, block " << block_bytes << " B");
  BOOST_TEST_MESSAGE("peak per rank: fsdp " << fsdp.peak_bytes << " B, ddp " << ddp.peak_bytes << " B; fsdp's transient "
                                           << (static_cast<double>(fsdp.peak_bytes + ddp_bytes - fsdp_bytes) -
                                               static_cast<double>(ddp.peak_bytes)) /
                                                  static_cast<double>(root_bytes + block_bytes)
                                           << " x the gathered root and block beyond ddp's");
}

// A checkpoint saved at step 10 on 2x4 with ddp,tp_sp and resumed on 4
// ranks with fsdp continues exactly: steps 11-20 equal the uninterrupted
// one-rank run's (the saved moments and step count included).
BOOST_AUTO_TEST_CASE(resumed_on_another_mesh_and_plan_continues_exactly) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("dtensor_gpt_resume_{}", ::getpid());
  fs::remove_all(dir);
  train::TrainOptions o = small_model(DType::Float64, 20);
  const train::TrainResult whole = train::train(o, slice(), nullptr);
  train::TrainOptions first = o;
  first.steps = 10;
  first.schedule_steps = 20;
  first.save_dir = dir.string();
  const auto saved = run(first, {2, 4}, {"dp", "tp"}, {"ddp", "tp_sp"});
  train::TrainOptions second = o;
  second.resume_dir = dir.string();
  const auto resumed = run(second, {4}, {"dp"}, {"fsdp"});
  fs::remove_all(dir);
  BOOST_TEST(resumed.first_step == 10);
  train::TrainResult joined = resumed;
  joined.losses.insert(joined.losses.begin(), saved.losses.begin(), saved.losses.end());
  check_same_losses(whole, joined, 1e-9, "saved on 2x4 ddp,tp_sp at step 10, resumed on 4 with fsdp");
}

// Gradient accumulation: gradients stay Partial across micro-batches, so
// a step of 3 micro-batches still reduces once; the loss equals one rank's.
BOOST_AUTO_TEST_CASE(accumulated_micro_batches_reduce_once) {
  auto o = small_model(DType::Float64, 3);
  o.micro_batches = 3;
  const train::TrainResult plain = train::train(o, slice(), nullptr);
  const auto r = run(o, {4}, {"dp"}, {"ddp"});
  check_same_losses(plain, r, 1e-9, "ddp on 4 with 3 micro-batches");
  BOOST_TEST(total(r, "backward") == 0u);
  BOOST_TEST(count(r, "optimizer", "all_reduce") == 1u);
  BOOST_TEST(total(r, "optimizer") == 1u);
}

// DDP's all_reduce started during the backward (--overlap): losses bit for
// bit those of the blocking path in f32 (and equal to one rank's in f64),
// the same collectives in the same phases; with micro-batches and on
// dp x tp; other plans refuse it.
BOOST_AUTO_TEST_CASE(overlapped_gradient_reduction_changes_when_not_what) {
  for (const Overlap& c : {Overlap{DType::Float32, {2}, {"dp"}, {"ddp"}, 1},
                           Overlap{DType::Float64, {4}, {"dp"}, {"ddp"}, 2},
                           Overlap{DType::Float32, {2, 2}, {"dp", "tp"}, {"ddp", "tp"}, 1},
                           Overlap{DType::Float32, {4}, {"dp"}, {"zero1"}, 1},
                           Overlap{DType::Float64, {2, 2}, {"dp", "tp"}, {"zero1", "tp"}, 2}}) {
    auto o = small_model(c.dtype, 3);
    o.micro_batches = c.micro_batches;
    const std::string what = fmt::format("{} {} on {} with {} micro-batches", c.dtype, fmt::join(c.plans, ","),
                                         fmt::join(c.mesh, "x"), c.micro_batches);
    const auto blocking = run(o, c.mesh, c.dims, c.plans);
    o.overlap_grad_reduce = true;
    const auto overlapped = run(o, c.mesh, c.dims, c.plans);
    check_same_bits(blocking, overlapped, what);
    for (const char* phase : {"forward", "backward", "optimizer"})
      BOOST_TEST(total(overlapped, phase) == total(blocking, phase), what << " " << phase);
    for (const char* kind : {"all_reduce", "reduce_scatter", "all_gather"})
      BOOST_TEST(count(overlapped, "optimizer", kind) == count(blocking, "optimizer", kind), what << " " << kind);
    if (c.dtype == DType::Float64) {
      auto one_rank = o;
      one_rank.overlap_grad_reduce = false;
      check_same_losses(train::train(one_rank, slice(), nullptr), overlapped, 1e-9, what);
    }
  }
  auto o = small_model(DType::Float64, 1);
  o.overlap_grad_reduce = true;
  testing::check_throws<RankFailed>([&] { run(o, {2}, {"dp"}, {"fsdp"}); }, "overlap_grad_reduce with plan 'fsdp'");
  o.micro_batches = 2;
  testing::check_throws<RankFailed>([&] { run(o, {2}, {"pp"}, {"pp"}); }, "overlap_param_gather with plan 'pp'");
  o.micro_batches = 1;
  testing::check_throws<ValueError>([&] { train::train(o, slice(), nullptr); },
                                    "overlap_grad_reduce on plain tensors");
}

// ZeRO's all_gather of the updated parameters under the next forward
// (overlap_param_gather) changes when, never what: losses bit for bit
// those of the step's own gather in f32, and one rank's to 1e-9 in f64; the
// same collectives, each all_gather counted in the forward, where the
// first op that reads one of its parameters waits for it, not in the
// optimizer.
BOOST_AUTO_TEST_CASE(zero_parameter_gather_runs_under_the_next_forward) {
  for (const Overlap& c : {Overlap{DType::Float32, {2}, {"dp"}, {"zero1"}, 1},
                           Overlap{DType::Float64, {4}, {"dp"}, {"zero1"}, 2},
                           Overlap{DType::Float64, {2, 2}, {"dp", "tp"}, {"zero1", "tp"}, 1}}) {
    auto o = small_model(c.dtype, 3);
    o.micro_batches = c.micro_batches;
    const std::string what = fmt::format("{} {} on {} with {} micro-batches", c.dtype, fmt::join(c.plans, ","),
                                         fmt::join(c.mesh, "x"), c.micro_batches);
    o.overlap_grad_reduce = true;
    const auto in_step = run(o, c.mesh, c.dims, c.plans);
    o.overlap_param_gather = true;
    const auto overlapped = run(o, c.mesh, c.dims, c.plans);
    check_same_bits(in_step, overlapped, what);
    const std::uint64_t gathers = count(in_step, "optimizer", "all_gather");
    BOOST_TEST(gathers > 0u, what);
    BOOST_TEST(count(overlapped, "optimizer", "all_gather") == 0u, what);
    BOOST_TEST(count(overlapped, "forward", "all_gather") == count(in_step, "forward", "all_gather") + gathers, what);
    BOOST_TEST(total(overlapped, "forward") + total(overlapped, "optimizer") ==
                   total(in_step, "forward") + total(in_step, "optimizer"),
               what);
    BOOST_TEST(total(overlapped, "backward") == total(in_step, "backward"), what);
    if (c.dtype == DType::Float64) {
      auto one_rank = o;
      one_rank.overlap_grad_reduce = one_rank.overlap_param_gather = false;
      check_same_losses(train::train(one_rank, slice(), nullptr), overlapped, 1e-9, what);
    }
  }
}

// The trace of an overlapped step shows when each bucket started: every
// bucket's all_reduce (ddp) or reduce_scatter (zero1) was issued on each
// rank before that rank's backward ended (the event's start less its
// "queued_us"), and none of them waited for the optimizer. When the worker
// then began each one is up to the scheduler (these are 2-core machines), so
// that is not asserted.
BOOST_AUTO_TEST_CASE(overlapped_buckets_are_issued_inside_the_backward) {
  for (const auto& [plan, kind] : {std::pair{"ddp", "all_reduce"}, std::pair{"zero1", "reduce_scatter"}}) {
    auto o = small_model(DType::Float32, 2, 4);
    o.overlap_grad_reduce = true;
    // Buckets of 4 KiB (a 1 KiB first one): a dozen, in backward order.
    o.gradient_buckets = {.bucket_mib = 4.0 / 1024, .first_bucket_mib = 1.0 / 1024, .order = BucketOrder::LastFirst};
    const nlohmann::json trace = traced(o, {2}, {"dp"}, {plan}, fmt::format("overlap_{}", plan));
    for (int rank = 0; rank < 2; ++rank) {
      const std::string what = fmt::format("{} rank {}", plan, rank);
      std::optional<double> backward_end, optimizer_start;
      std::vector<double> issued;
      for (const auto& e : trace["traceEvents"]) {
        if (e["ph"] != "X" || e["pid"] != rank) continue;
        const double ts = e["ts"].get<double>();
        if (e["cat"] == "scope" && e["name"] == "backward") backward_end = ts + e["dur"].get<double>();
        if (e["cat"] == "scope" && e["name"] == "optimizer") optimizer_start = ts;
        if (e["cat"] == "collective" && e["name"] == kind && e["args"].contains("queued_us"))
          issued.push_back(ts - e["args"]["queued_us"].get<double>());
      }
      BOOST_TEST_REQUIRE(backward_end.has_value(), what << ": no backward scope");
      BOOST_TEST_REQUIRE(optimizer_start.has_value(), what << ": no optimizer scope");
      BOOST_TEST(issued.size() >= 8u, what << ": " << issued.size() << " started " << kind << " buckets");
      for (std::size_t b = 0; b < issued.size(); ++b) {
        BOOST_TEST(issued[b] <= *backward_end, what << ": bucket " << b << " issued at " << issued[b]
                                                    << " us, after the backward ended at " << *backward_end);
        BOOST_TEST(issued[b] < *optimizer_start, what << ": bucket " << b);
      }
    }
  }
}

// FSDP's overlap (the gathers prefetched in the forward and the backward,
// the reduce_scatters run under the block before's backward) changes when,
// never what: losses bit for bit those without it in f32, the same
// collectives, counts and bytes, phase by phase, with either part off. Its
// trace: every block's gather but the backward's first, and every block's
// reduce_scatter, is a started call, issued inside its pass with ops between
// each issue and the next (the compute it runs under).
BOOST_AUTO_TEST_CASE(fsdp_overlap_changes_when_not_what) {
  auto o = small_model(DType::Float32, 3, 4);
  const auto overlapped = run(o, {2}, {"dp"}, {"fsdp"});
  o.overlap_unit_reduce = false;
  const auto prefetched_only = run(o, {2}, {"dp"}, {"fsdp"});
  o.prefetch_units = false;
  const auto blocking = run(o, {2}, {"dp"}, {"fsdp"});
  for (const auto* run : {&overlapped, &prefetched_only}) {
    const std::string what = run == &overlapped ? "prefetch and reduce overlap" : "prefetch only";
    check_same_bits(blocking, *run, what);
    BOOST_TEST(comm_rows(*run) == comm_rows(blocking),
               fmt::format("{}:\n{}\nblocking:\n{}", what, fmt::join(comm_rows(*run), "\n"),
                           fmt::join(comm_rows(blocking), "\n")));
  }
  // At most two units gathered: prefetch adds at most one block's gathered
  // unit (12 d^2 + 13 d parameters of 4 bytes) to the peak; the reduction
  // in flight adds one unit's gradient more.
  const std::uint64_t d = static_cast<std::uint64_t>(o.model.d_model), one_unit = (12 * d * d + 13 * d) * 4;
  BOOST_TEST_MESSAGE("peak bytes: blocking " << blocking.peak_bytes << ", prefetched " << prefetched_only.peak_bytes
                                             << ", overlapped " << overlapped.peak_bytes << "; a unit " << one_unit);
  BOOST_TEST(prefetched_only.peak_bytes <= blocking.peak_bytes + one_unit,
             "peak " << prefetched_only.peak_bytes << " bytes with prefetch, " << blocking.peak_bytes << " without");
  BOOST_TEST(overlapped.peak_bytes <= blocking.peak_bytes + 2 * one_unit,
             "peak " << overlapped.peak_bytes << " bytes overlapped, " << blocking.peak_bytes << " blocking");

  o.prefetch_units = o.overlap_unit_reduce = true;
  const nlohmann::json trace = traced(o, {2}, {"dp"}, {"fsdp"}, "prefetch");
  for (int rank = 0; rank < 2; ++rank) {
    // The passes' windows (the backward's scope nests inside each
    // recomputation's: the outermost one), the ops' starts, and the issue
    // times of the started calls of each kind.
    std::map<std::string, std::pair<double, double>> pass;
    std::vector<double> ops;
    std::map<std::string, std::vector<double>> issued;
    for (const auto& e : trace["traceEvents"]) {
      if (e["ph"] != "X" || e["pid"] != rank) continue;
      const double ts = e["ts"].get<double>();
      if (e["cat"] == "scope") {
        const std::string name = e["name"];
        const std::pair<double, double> span{ts, ts + e["dur"].get<double>()};
        auto [it, fresh] = pass.emplace(name, span);
        if (!fresh) it->second = {std::min(it->second.first, span.first), std::max(it->second.second, span.second)};
      }
      if (e["cat"] == "op") ops.push_back(ts);
      if (e["cat"] == "collective" && e["args"].contains("queued_us"))
        issued[e["name"]].push_back(ts - e["args"]["queued_us"].get<double>());
    }
    BOOST_TEST_REQUIRE(pass.count("forward"), "rank " << rank << ": no forward scope");
    BOOST_TEST_REQUIRE(pass.count("backward"), "rank " << rank << ": no backward scope");
    std::vector<double> forward_gathers, backward_gathers;
    for (double t : issued["all_gather"]) (t <= pass["forward"].second ? forward_gathers : backward_gathers).push_back(t);
    // kind, issues, the pass they fall in, how many: 4 blocks; the
    // backward's first gather is not prefetched; every block's reduction
    // starts (the root's blocks the end).
    const std::tuple<const char*, std::vector<double>&, const char*, std::size_t> expected[] = {
        {"forward all_gather", forward_gathers, "forward", 4},
        {"backward all_gather", backward_gathers, "backward", 3},
        {"reduce_scatter", issued["reduce_scatter"], "backward", 4}};
    for (const auto& [kind, times, within, count] : expected) {
      const std::string what = fmt::format("rank {}: {}", rank, kind);
      std::sort(times.begin(), times.end());
      BOOST_TEST(times.size() == count, what << ": " << times.size() << " started, expected " << count);
      const auto [begin, end] = pass[within];
      for (std::size_t k = 0; k < times.size(); ++k) {
        BOOST_TEST((times[k] >= begin && times[k] <= end), what << " " << k << " issued outside the " << within);
        const double next = k + 1 < times.size() ? times[k + 1] : end;
        const auto between = std::count_if(ops.begin(), ops.end(), [&](double t) { return t > times[k] && t < next; });
        BOOST_TEST(between > 0, what << ": no op ran between call " << k << "'s issue and the next");
      }
    }
  }
}

// Domino (GPT::domino): each rank's batch rows in two halves whose
// tensor-parallel collectives run under each other's computation. It
// changes when, never what: losses bit for bit those of the same halves
// waited for at once in f32 (and one rank's to 1e-9 in f64, micro-batches
// and a dp x tp mesh included); the same collectives, counts and bytes; the
// same bytes as the unsplit step's, each block point's call made once per
// half. The trace shows computation after each started call before the next
// is issued, in both passes. Refused where it cannot split.
BOOST_AUTO_TEST_CASE(domino_changes_when_not_what) {
  auto bytes = [](const train::TrainResult& r, std::string_view phase) {
    std::uint64_t n = 0;
    for (const auto& c : r.comm)
      if (c.phase == phase) n += c.bytes;
    return n;
  };
  for (const auto& [c, chunks] : {std::pair{Overlap{DType::Float32, {2}, {"tp"}, {"tp"}, 1}, 2},
                                  std::pair{Overlap{DType::Float32, {2}, {"tp"}, {"tp_sp"}, 1}, 2},
                                  std::pair{Overlap{DType::Float32, {2}, {"tp"}, {"tp_sp"}, 1}, 4},
                                  std::pair{Overlap{DType::Float64, {4}, {"tp"}, {"tp"}, 1}, 2},
                                  std::pair{Overlap{DType::Float64, {2, 2}, {"dp", "tp"}, {"ddp", "tp_sp"}, 2}, 2}}) {
    auto o = small_model(c.dtype, 3);
    o.micro_batches = c.micro_batches;
    o.domino_chunks = chunks;
    const std::string what = fmt::format("{} {} on {} with {} micro-batches, {} chunks", c.dtype,
                                         fmt::join(c.plans, ","), fmt::join(c.mesh, "x"), c.micro_batches, chunks);
    const auto unsplit = run(o, c.mesh, c.dims, c.plans);
    o.domino = true;
    const auto overlapped = run(o, c.mesh, c.dims, c.plans);
    o.domino_started = false;
    const auto reference = run(o, c.mesh, c.dims, c.plans);
    check_same_bits(reference, overlapped, what);
    BOOST_TEST(comm_rows(overlapped) == comm_rows(reference),
               fmt::format("{}:\n{}\nwaited for at once:\n{}", what, fmt::join(comm_rows(overlapped), "\n"),
                           fmt::join(comm_rows(reference), "\n")));
    // Per block and micro-batch, tp's two points move in each pass (the
    // input points' layout is the residual's), tp_sp's four.
    const std::uint64_t points = c.plans.back() == "tp" ? 2 : 4;
    const std::uint64_t extra = points * static_cast<std::uint64_t>(o.model.layers * c.micro_batches * (chunks - 1));
    for (const char* phase : {"forward", "backward"}) {
      BOOST_TEST(bytes(overlapped, phase) == bytes(unsplit, phase), what << " " << phase);
      BOOST_TEST(total(overlapped, phase) == total(unsplit, phase) + extra, what << " " << phase);
    }
    BOOST_TEST(comm_rows(overlapped).back() == comm_rows(unsplit).back(), what << ": the optimizer's calls");
    if (c.dtype == DType::Float64) {
      auto one_rank = o;
      one_rank.domino = false;
      check_same_losses(train::train(one_rank, slice(), nullptr), overlapped, 1e-9, what);
    }
  }

  // The trace: the rank runs ops between a started call's issue and the
  // return of its wait (program order, so on any load) under every call but
  // two; under none of the reference's, whose rank waits at once.
  auto o = small_model(DType::Float32, 1);
  o.domino = true;
  for (const bool started : {true, false}) {
    o.domino_started = started;
    const nlohmann::json trace = traced(o, {2}, {"tp"}, {"tp_sp"}, "domino");
    for (int rank = 0; rank < 2; ++rank) {
      std::vector<double> ops;
      std::vector<std::pair<double, double>> calls;  // issued, returned
      for (const auto& e : trace["traceEvents"]) {
        if (e["ph"] != "X" || e["pid"] != rank) continue;
        const double ts = e["ts"].get<double>();
        if (e["cat"] == "op") ops.push_back(ts);
        if (e["cat"] == "collective" && e["args"].contains("queued_us")) {
          const double issued = ts - e["args"]["queued_us"].get<double>();
          calls.emplace_back(issued, issued + e["args"]["returned_us"].get<double>());
        }
      }
      // Four points per block and half, in each pass.
      const std::size_t expected = 2 * 4 * 2 * static_cast<std::size_t>(o.model.layers);
      const std::string what = fmt::format("rank {}, started {}", rank, started);
      BOOST_TEST(calls.size() == expected, what << ": " << calls.size() << " started calls, expected " << expected);
      const auto under = std::count_if(calls.begin(), calls.end(), [&](const auto& call) {
        return std::any_of(ops.begin(), ops.end(), [&](double t) { return t > call.first && t < call.second; });
      });
      // All but the wavefront's fill and drain: chunk 0's first all_gather,
      // waited for before chunk 1 has begun, and its mirror in the backward.
      BOOST_TEST(static_cast<std::size_t>(under) == (started ? calls.size() - 2 : 0u),
                 what << ": ops ran under " << under << " of " << calls.size() << " calls");
    }
  }

  o.batch = 2;  // one row per rank on a 2 x 2 dp x tp mesh: nothing to split
  testing::check_throws<RankFailed>([&] { run(o, {2, 2}, {"dp", "tp"}, {"ddp", "tp"}); },
                                    "domino splits each rank's batch rows into 2 chunks: a batch of 2 over 2 shard(s)");
  o.batch = 4;
  o.domino_chunks = 1;
  testing::check_throws<RankFailed>([&] { run(o, {2}, {"tp"}, {"tp"}); }, "domino_chunks = 1; expected at least 2");
  o.domino_chunks = 2;
  testing::check_throws<RankFailed>([&] { run(o, {2}, {"dp"}, {"fsdp"}); }, "domino with plan 'fsdp'");
  testing::check_throws<RankFailed>([&] { run(o, {2}, {"dp"}, {"ddp"}); }, "expected a tp or tp_sp dim");
}

// FSDP2's reshard_after_forward off: each block's gathered unit is kept for
// its backward, so the backward gathers nothing and recomputes nothing,
// with the same values (bit for bit in f32, one rank's in f64 with
// micro-batches), the same forward gathers and backward reduce_scatters,
// overlapped or not.
BOOST_AUTO_TEST_CASE(fsdp_kept_for_the_backward_gathers_once) {
  for (const Overlap& c : {Overlap{DType::Float32, {2}, {"dp"}, {"fsdp"}, 1},
                           Overlap{DType::Float64, {4}, {"dp"}, {"fsdp"}, 2}}) {
    for (const bool overlapped : {true, false}) {
      auto o = small_model(c.dtype, 3);
      o.micro_batches = c.micro_batches;
      o.overlap_unit_reduce = o.prefetch_units = overlapped;
      const std::string what = fmt::format("{} fsdp on {} with {} micro-batches, overlap {}", c.dtype,
                                           fmt::join(c.mesh, "x"), c.micro_batches, overlapped);
      const auto resharded = run(o, c.mesh, c.dims, c.plans);
      o.reshard_after_forward = false;
      const auto kept = run(o, c.mesh, c.dims, c.plans);
      BOOST_TEST_REQUIRE(kept.losses.size() == resharded.losses.size(), what);
      if (c.dtype == DType::Float32)
        for (std::size_t i = 0; i < kept.losses.size(); ++i)
          BOOST_TEST(kept.losses[i] == resharded.losses[i], what << ": step " << i);
      else
        check_same_losses(train::train(o, slice(), nullptr), kept, 1e-9, what);
      // Per micro-batch: the root's and every block's gather and reduce_scatter.
      const std::uint64_t L = static_cast<std::uint64_t>(o.model.layers), m = static_cast<std::uint64_t>(c.micro_batches);
      BOOST_TEST(count(resharded, "backward", "all_gather") == m * L, what);
      BOOST_TEST(count(kept, "backward", "all_gather") == 0u, what);
      BOOST_TEST(count(kept, "forward", "all_gather") == m * (L + 1), what);
      BOOST_TEST(count(kept, "backward", "reduce_scatter") == m * (L + 1), what);
      BOOST_TEST(total(kept, "optimizer") == total(resharded, "optimizer"), what);
    }
  }
}

// Clipping adds exactly one all_reduce (of one f64) to a step, whether it
// scales the gradients or not: the gradients' own coalesced reduction moves
// from the step into the clip (ddp, tp), or there is none (fsdp).
BOOST_AUTO_TEST_CASE(clipping_takes_one_all_reduce) {
  for (const Case& c : {Case{{4}, {"dp"}, {"fsdp"}}, Case{{4}, {"dp"}, {"ddp"}}, Case{{2}, {"tp"}, {"tp"}}}) {
    auto o = small_model(DType::Float64, 2);
    const auto unclipped = run(o, c.mesh, c.dims, c.plans);
    // A norm above the limit scales the gradients; one below leaves them,
    // but the gradients the clip reduced must not be reduced again.
    for (const double clip : {0.5, 1e9}) {
      o.clip = clip;
      const auto clipped = run(o, c.mesh, c.dims, c.plans);
      BOOST_TEST(count(clipped, "optimizer", "all_reduce") == count(unclipped, "optimizer", "all_reduce") + 1,
                 name_of(c) << " clip " << clip);
      BOOST_TEST(total(clipped, "optimizer") == total(unclipped, "optimizer") + 1, name_of(c) << " clip " << clip);
    }
  }
}

// A memory budget (TrainOptions::memory_budget, else DTENSOR_MEMORY_BUDGET):
// a plan whose peak fits trains exactly as without one; below its peak the
// run stops with an OutOfBudget naming the rank and the budget, from the
// option or the variable alike.
BOOST_AUTO_TEST_CASE(a_memory_budget_stops_a_plan_that_does_not_fit) {
  auto o = small_model(DType::Float32, 2);
  const auto unbounded = run(o, {2}, {"dp"}, {"zero1"});
  BOOST_TEST_REQUIRE(unbounded.peak_bytes > 0u);
  o.memory_budget = 2 * unbounded.peak_bytes;
  const auto bounded = run(o, {2}, {"dp"}, {"zero1"});
  BOOST_TEST(bounded.losses == unbounded.losses);
  o.memory_budget = unbounded.peak_bytes / 2;
  const std::string refused =
      fmt::format("past the budget of {}", human_bytes(static_cast<std::int64_t>(o.memory_budget)));
  testing::check_throws<RankFailed>([&] { run(o, {2}, {"dp"}, {"zero1"}); }, refused);
  testing::check_throws<OutOfBudget>([&] { train::train(o, slice(), nullptr); }, "[memory] rank 0: ");
  ::setenv("DTENSOR_MEMORY_BUDGET", fmt::format("{}B", o.memory_budget).c_str(), 1);
  o.memory_budget = 0;
  testing::check_throws<RankFailed>([&] { run(o, {2}, {"dp"}, {"zero1"}); }, refused);
  ::unsetenv("DTENSOR_MEMORY_BUDGET");
}

BOOST_AUTO_TEST_CASE(a_plan_that_does_not_fit_is_named) {
  auto o = small_model(DType::Float64, 1);
  o.model.heads = 2;
  // Every rank throws the ValueError; the thread launcher reports it as the
  // first rank's failure.
  BOOST_CHECK_EXCEPTION(run(o, {4}, {"tp"}, {"tp"}), Error, [](const Error& e) {
    return std::string(e.what()).find("heads = 2 is not divisible by mesh dim 0 of size 4") != std::string::npos;
  });
}

BOOST_AUTO_TEST_SUITE_END()
