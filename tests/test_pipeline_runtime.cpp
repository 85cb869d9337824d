// The pipeline runtime (nn/pipeline_runtime.h) through the trainer: the GPT
// over a pp mesh dim under each runnable schedule gives the one-rank run's
// losses (f64, 1e-9 relative), with 2·m messages per stage boundary that
// crosses ranks, each of the activation's bytes (its shard under pp x dp and
// pp x tp_sp); what cannot run is refused before any message.
#include <unistd.h>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <filesystem>
#include <map>
#include <mutex>
#include <tuple>

#include <dtensor/checkpoint/checkpoint.h>
#include <dtensor/nn/pipeline_runtime.h>

#include "dtensor/train/trainer.h"
#include "support.h"

using namespace dtensor;

namespace pipeline_runtime_suite {

constexpr std::int64_t kBatch = 2, kSeq = 16, kDModel = 32;

train::TrainOptions small_model(std::int64_t layers, std::int64_t micro_batches) {
  train::TrainOptions o;
  o.model = {.vocab = 256, .seq = kSeq, .layers = layers, .d_model = kDModel, .heads = 4, .dtype = DType::Float64};
  o.batch = kBatch;
  o.micro_batches = micro_batches;
  o.steps = 3;
  o.warmup = 1;
  o.lr = 3e-3;
  o.weight_decay = 0.1;
  o.seed = 7;
  o.val_batches = 1;
  return o;
}

const train::TextData& slice() {
  static const train::TextData data(train::committed_slice_path());
  return data;
}

// The step's messages over pp on one rank, as its comm lists them: a
// message is a send at its sender and a recv at its receiver, each with
// the message's bytes.
struct Messages {
  std::uint64_t sends = 0, recvs = 0, sent_bytes = 0, received_bytes = 0;
};
Messages pipeline_messages(const train::TrainResult& r) {
  Messages m;
  for (const auto& c : r.comm) {
    if (c.phase != "pipeline" || c.mesh_dims != std::vector<std::string>{"pp"}) continue;
    if (c.kind == "send") m.sends += c.count, m.sent_bytes += c.bytes;
    if (c.kind == "recv") m.recvs += c.count, m.received_bytes += c.bytes;
  }
  return m;
}

// A run on the test backend: the reporting rank's result (rank 0 on
// threads, each process under MPI), and the messages summed over all ranks.
struct Outcome {
  train::TrainResult result;
  int rank = 0;
  Messages messages;  // summed over every rank
};
Outcome run_pipeline(const train::TrainOptions& o) {
  Outcome out;
  std::mutex mu;
  testing::run_ranks(static_cast<int>(numel(o.mesh)), [&](Communicator& world) {
    train::TrainResult r = train::train(o, slice(), &world);
    const Messages m = pipeline_messages(r);
    std::array<double, 4> totals{static_cast<double>(m.sends), static_cast<double>(m.recvs),
                                 static_cast<double>(m.sent_bytes), static_cast<double>(m.received_bytes)};
    world.all_reduce(std::span<double>(totals), ReduceOp::Sum);
    if (!testing::reports_results(world)) return;
    std::lock_guard lock(mu);
    const auto whole = [&](int i) { return static_cast<std::uint64_t>(totals[static_cast<std::size_t>(i)]); };
    out = {std::move(r), world.rank(), Messages{whole(0), whole(1), whole(2), whole(3)}};
  });
  return out;
}

// `o` over a pipeline: the mesh, its dims' names and plans, the schedule.
train::TrainOptions pipelined(train::TrainOptions o, std::string schedule, Shape mesh, std::vector<std::string> dims,
                              std::vector<std::string> plans, std::int64_t virtual_stages = 1) {
  o.schedule = std::move(schedule);
  o.mesh = std::move(mesh);
  o.dims = std::move(dims);
  o.plans = std::move(plans);
  o.virtual_stages = virtual_stages;
  return o;
}

struct Case {
  std::string schedule;
  Shape mesh;
  std::vector<std::string> dims, plans;
  std::int64_t micro_batches, virtual_stages, layers;
  int boundaries_across_ranks;  // stage boundaries whose two stages are on different ranks
  // Into how many shards the other mesh dim cuts the activation a stage
  // sends (dp the batch, tp_sp the sequence; tp replicates it).
  std::int64_t shards = 1;
  double clip = 0;  // --clip: the gradient norm over every stage
  std::int64_t activation_bytes() const { return kBatch * kSeq * kDModel * 8 / shards; }
  // One pipeline per rank of the other mesh dims, each sending its shard.
  std::uint64_t pipelines() const { return static_cast<std::uint64_t>(numel(mesh) / mesh[0]); }
  std::string name() const {
    return fmt::format("{} on mesh {} ({}) m={} v={}{}", schedule, fmt::join(mesh, "x"), fmt::join(plans, ","),
                       micro_batches, virtual_stages, clip > 0 ? fmt::format(" clip={}", clip) : "");
  }
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all{
      {"gpipe", {2}, {"pp"}, {"pp"}, 2, 1, 4, 1},
      {"1f1b", {2}, {"pp"}, {"pp"}, 3, 1, 4, 1},
      {"interleaved", {2}, {"pp"}, {"pp"}, 2, 2, 4, 3},
      {"gpipe", {4}, {"pp"}, {"pp"}, 4, 1, 4, 3},
      {"1f1b", {4}, {"pp"}, {"pp"}, 4, 1, 4, 3},
      {"interleaved", {4}, {"pp"}, {"pp"}, 4, 2, 8, 7},
      // The split backward (I then W): zb-h1 one stage per rank; zbv two per
      // rank in a V (stages 0 and 3 on rank 0, 1 and 2 on rank 1), so one of
      // its three boundaries stays on a rank. DualPipeV: the same V, full
      // backwards (B) beside I and W, and m >= 2p microbatches.
      {"zb-h1", {2}, {"pp"}, {"pp"}, 2, 1, 4, 1},
      {"zb-h1", {4}, {"pp"}, {"pp"}, 4, 1, 4, 3},
      {"zbv", {2}, {"pp"}, {"pp"}, 2, 2, 4, 2},
      {"dualpipev", {2}, {"pp"}, {"pp"}, 4, 2, 4, 2},
      // The V on 4 ranks: stages r and 7-r on rank r, so 6 of 7 boundaries cross ranks.
      {"zbv", {4}, {"pp"}, {"pp"}, 4, 2, 8, 6},
      {"dualpipev", {4}, {"pp"}, {"pp"}, 8, 2, 8, 6},
      {"1f1b", {2, 2}, {"pp", "dp"}, {"pp", "ddp"}, 2, 1, 4, 1, 2},
      {"gpipe", {2, 2}, {"pp", "dp"}, {"pp", "ddp"}, 3, 1, 4, 1, 2},
      {"interleaved", {2, 2}, {"pp", "dp"}, {"pp", "ddp"}, 2, 2, 4, 3, 2},
      {"1f1b", {2, 2}, {"pp", "tp"}, {"pp", "tp"}, 2, 1, 4, 1, 1},
      {"1f1b", {2, 2}, {"pp", "tp"}, {"pp", "tp_sp"}, 2, 1, 4, 1, 2},
      {"zb-h1", {2, 2}, {"pp", "dp"}, {"pp", "ddp"}, 2, 1, 4, 1, 2},
      {"zb-h1", {2, 2}, {"pp", "tp"}, {"pp", "tp"}, 2, 1, 4, 1, 1},
      // ZeRO-1 beside pp: each stage's AdamW states sharded over dp.
      {"1f1b", {2, 2}, {"pp", "dp"}, {"pp", "zero1"}, 2, 1, 4, 1, 2},
      // FSDP beside pp: each stage's parameters sharded over dp, gathered
      // per piece (the split backward's I and W included).
      {"1f1b", {2, 2}, {"pp", "dp"}, {"pp", "fsdp"}, 2, 1, 4, 1, 2},
      {"zb-h1", {2, 2}, {"pp", "dp"}, {"pp", "fsdp"}, 2, 1, 4, 1, 2, 0.05},
      // Clipped by the whole model's norm: each stage's part summed over pp
      // (0.05 is below every step's norm here, so every step clips).
      {"1f1b", {2}, {"pp"}, {"pp"}, 2, 1, 4, 1, 1, 0.05},
      {"zb-h1", {2, 2}, {"pp", "dp"}, {"pp", "zero1"}, 2, 1, 4, 1, 2, 0.05},
      // Three dims on 8 ranks: pp x dp x tp, 2 pipelines per dp rank (tp
      // replicates the activation, so each tp rank sends its dp shard whole).
      {"1f1b", {2, 2, 2}, {"pp", "dp", "tp"}, {"pp", "ddp", "tp"}, 2, 1, 4, 1, 2},
      {"interleaved", {2, 2, 2}, {"pp", "dp", "tp"}, {"pp", "ddp", "tp"}, 2, 2, 4, 3, 2, 0.05},
      {"1f1b", {2, 2, 2}, {"pp", "dp", "tp"}, {"pp", "fsdp", "tp"}, 2, 1, 4, 1, 2},
  };
  return all;
}

// The one-rank run with the same micro-batches (and clipping): the reference.
const train::TrainResult& one_rank(std::int64_t layers, std::int64_t micro_batches, double clip = 0) {
  static std::map<std::tuple<std::int64_t, std::int64_t, double>, train::TrainResult> cache;
  auto it = cache.find({layers, micro_batches, clip});
  if (it == cache.end()) {
    train::TrainOptions o = small_model(layers, micro_batches);
    o.clip = clip;
    it = cache.emplace(std::tuple{layers, micro_batches, clip}, train::train(o, slice(), nullptr)).first;
  }
  return it->second;
}

using testing::ranks_available;
// Under MPI a rank that throws aborts the job: a dying stage is tried on threads.
boost::test_tools::assertion_result threads_only(boost::unit_test::test_unit_id) {
  boost::test_tools::assertion_result on_threads(testing::test_backend() == "threads");
  on_threads.message() << "a rank that throws ends an MPI job";
  return on_threads;
}

// A case whose ranks share one temporary folder by name: one process.
boost::test_tools::assertion_result one_process(boost::unit_test::test_unit_id) {
  boost::test_tools::assertion_result on_threads(testing::test_backend() == "threads");
  on_threads.message() << "the ranks share a temporary folder named by the process";
  return on_threads;
}

}  // namespace pipeline_runtime_suite

using namespace pipeline_runtime_suite;

BOOST_AUTO_TEST_SUITE(pipeline_runtime)

// Same seed, f64: every schedule's losses and validation loss equal one
// rank's with the same micro-batches; the messages of a step are 2·m per
// boundary across ranks, each of the activation's (or its dp shard's) bytes.
BOOST_AUTO_TEST_CASE(schedules_match_one_rank_and_count_their_messages, *boost::unit_test::timeout(120)) {
  for (const Case& c : cases()) {
    if (!testing::can_run(numel(c.mesh))) continue;
    train::TrainOptions o =
        pipelined(small_model(c.layers, c.micro_batches), c.schedule, c.mesh, c.dims, c.plans, c.virtual_stages);
    o.clip = c.clip;
    const Outcome got = run_pipeline(o);
    const train::TrainResult& want = one_rank(c.layers, c.micro_batches, c.clip);
    if (c.clip > 0)  // else a pipeline that ignored --clip would pass too
      BOOST_TEST(want.losses.back() != one_rank(c.layers, c.micro_batches).losses.back(),
                 c.name() << ": clipping changes nothing");
    const std::vector<double>& losses = got.result.losses;
    BOOST_TEST_REQUIRE(losses.size() == want.losses.size(), c.name());
    double worst = 0;  // the largest relative difference, logged (--log_level=message)
    for (std::size_t i = 0; i < want.losses.size(); ++i) {
      worst = std::max(worst, std::abs(losses[i] - want.losses[i]) / std::abs(want.losses[i]));
      BOOST_TEST(testing::close(losses[i], want.losses[i], 1e-9 * std::abs(want.losses[i])),
                 c.name() << ": step " << i << " loss " << losses[i] << " vs one rank's " << want.losses[i]);
    }
    BOOST_TEST_MESSAGE(c.name() << ": largest relative loss difference " << worst);
    BOOST_TEST(testing::close(got.result.val_loss, want.val_loss, 1e-9 * std::abs(want.val_loss)),
               c.name() << ": validation loss " << got.result.val_loss << " vs " << want.val_loss);
    const std::uint64_t messages = static_cast<std::uint64_t>(2 * c.micro_batches * c.boundaries_across_ranks);
    const std::uint64_t copies = c.pipelines();
    const std::uint64_t bytes = messages * copies * static_cast<std::uint64_t>(c.activation_bytes());
    BOOST_TEST(got.messages.sends == messages * copies, c.name() << ": sends");
    BOOST_TEST(got.messages.recvs == messages * copies, c.name() << ": recvs");
    BOOST_TEST(got.messages.sent_bytes == bytes, c.name() << ": bytes sent");
    BOOST_TEST(got.messages.received_bytes == bytes, c.name() << ": bytes received");
    // ZeRO-1 keeps AdamW's two moments sharded over dp: less than twice
    // the parameters' bytes (which every other plan here holds).
    const bool zero1 = std::find(c.plans.begin(), c.plans.end(), "zero1") != c.plans.end();
    BOOST_TEST((got.result.optimizer_state_bytes < 2 * got.result.parameter_bytes) == zero1,
               c.name() << ": optimizer states " << got.result.optimizer_state_bytes << " bytes, parameters "
                        << got.result.parameter_bytes);
    // FSDP keeps about a quarter of the model on each rank of pp x dp (half
    // a stage's), gathering it piece by piece over dp inside the pipeline,
    // where no other plan gathers (ddp's ranks hold half the model each).
    const bool fsdp = std::find(c.plans.begin(), c.plans.end(), "fsdp") != c.plans.end();
    std::uint64_t gathers = 0;
    for (const auto& comm : got.result.comm)
      if (comm.phase == "pipeline" && comm.kind == "all_gather" && comm.mesh_dims == std::vector<std::string>{"dp"})
        gathers += comm.count;
    // Per microbatch: the stage's root once, each block in its forward and
    // again in its backward (one stage per rank here).
    const auto blocks = static_cast<std::uint64_t>(c.layers / c.mesh[0]);
    const std::uint64_t want_gathers = fsdp ? static_cast<std::uint64_t>(c.micro_batches) * (1 + 2 * blocks) : 0;
    BOOST_TEST(gathers == want_gathers, c.name() << ": " << gathers << " all_gathers over dp in the pipeline phase");
    const double held = static_cast<double>(got.result.parameter_bytes) / static_cast<double>(want.parameter_bytes);
    if (fsdp) BOOST_TEST(held < 0.3, c.name() << ": the busiest rank holds " << held << " of the parameters");
    // The run reports the schedule it ran and a measured bubble in [0, 1).
    BOOST_TEST_REQUIRE(got.result.schedule.has_value(), c.name());
    BOOST_TEST(got.result.schedule->name == c.schedule, c.name());
    BOOST_TEST(got.result.schedule->ranks() == static_cast<int>(c.mesh[0]), c.name());
    BOOST_TEST((got.result.bubble_fraction >= 0 && got.result.bubble_fraction < 1),
               c.name() << ": measured bubble " << got.result.bubble_fraction);
  }
}

// Generation runs each new byte's positions through the stages with a KV
// cache per stage: greedy bytes equal one rank's, the V placement (stages 0
// and 3 on one rank) and tp_sp's sharded activations included.
BOOST_AUTO_TEST_CASE(generation_gives_the_one_rank_bytes, *boost::unit_test::precondition(ranks_available{4})) {
  train::TrainOptions one = small_model(4, 2);
  one.generate = 24;  // past seq = 16: the caches restart once
  const train::TrainResult want = train::train(one, slice(), nullptr);
  BOOST_TEST_REQUIRE(want.generated.size() == 24u);
  struct Run {
    std::string schedule;
    Shape mesh;
    std::vector<std::string> dims, plans;
    std::int64_t virtual_stages;
  };
  for (const Run& run : {Run{"1f1b", {2}, {"pp"}, {"pp"}, 1}, Run{"zbv", {2}, {"pp"}, {"pp"}, 2},
                         Run{"1f1b", {2, 2}, {"pp", "tp"}, {"pp", "tp_sp"}, 1}}) {
    if (!testing::can_run(numel(run.mesh))) continue;  // under MPI: the job's size only
    const Outcome got = run_pipeline(pipelined(one, run.schedule, run.mesh, run.dims, run.plans, run.virtual_stages));
    BOOST_TEST(got.result.generated == want.generated,
               run.schedule << " on " << fmt::format("{}", fmt::join(run.plans, ",")) << ": generated "
                            << fmt::format("{:?}", got.result.generated) << " vs "
                            << fmt::format("{:?}", want.generated));
  }
}

// Tied embeddings across stages: the first stage's wte and the last
// stage's lm_head are two copies of one weight whose gradients are summed
// once per step, between two ranks (one message each way per pipeline, of
// the weight's local bytes) or on one rank where a V puts both there; the
// losses are one rank's tied run's, with clipping counting the weight once.
BOOST_AUTO_TEST_CASE(tied_embeddings_match_one_rank, *boost::unit_test::precondition(ranks_available{4})) {
  struct Run {
    std::string schedule;
    Shape mesh;
    std::vector<std::string> dims, plans;
    std::int64_t micro_batches, virtual_stages;
    std::int64_t weight_shards;  // into how many pieces the other dims cut the tied weight (tp: its rows)
    bool local;                  // first and last stage on one rank: no message
    double clip;
  };
  const std::vector<Run> runs{
      {"1f1b", {2}, {"pp"}, {"pp"}, 2, 1, 1, false, 0.05},
      {"zbv", {2}, {"pp"}, {"pp"}, 2, 2, 1, true, 0.05},
      {"interleaved", {2}, {"pp"}, {"pp"}, 2, 2, 1, false, 0},
      {"1f1b", {4}, {"pp"}, {"pp"}, 4, 1, 1, false, 0},
      {"1f1b", {2, 2}, {"pp", "tp"}, {"pp", "tp"}, 2, 1, 2, false, 0},
      {"zb-h1", {2, 2}, {"pp", "dp"}, {"pp", "zero1"}, 2, 1, 1, false, 0.05},
  };
  for (const Run& run : runs) {
    if (!testing::can_run(numel(run.mesh))) continue;
    train::TrainOptions one = small_model(4, run.micro_batches);
    one.model.tie_embeddings = true;
    one.clip = run.clip;
    const train::TrainResult want = train::train(one, slice(), nullptr);
    const std::string what = fmt::format("{} on {} v={} clip={}", run.schedule, fmt::join(run.plans, ","),
                                         run.virtual_stages, run.clip);
    const Outcome got = run_pipeline(pipelined(one, run.schedule, run.mesh, run.dims, run.plans, run.virtual_stages));
    BOOST_TEST_REQUIRE(got.result.losses.size() == want.losses.size(), what);
    for (std::size_t i = 0; i < want.losses.size(); ++i)
      BOOST_TEST(testing::close(got.result.losses[i], want.losses[i], 1e-9 * std::abs(want.losses[i])),
                 what << ": step " << i << " loss " << got.result.losses[i] << " vs one rank's " << want.losses[i]);
    // The rank's messages over pp outside the pipeline phase: the tied
    // exchange, on the first and last stages' ranks only.
    std::uint64_t sends = 0, sent_bytes = 0;
    for (const auto& c : got.result.comm)
      if (c.phase != "pipeline" && c.kind == "send" && c.mesh_dims == std::vector<std::string>{"pp"})
        sends += c.count, sent_bytes += c.bytes;
    const std::int64_t pp_coordinate = got.rank / (numel(run.mesh) / run.mesh[0]);  // pp is the first dim
    const bool at_an_end = pp_coordinate == 0 || pp_coordinate == run.mesh[0] - 1;
    const std::uint64_t want_sends = run.local || !at_an_end ? 0 : 1;
    BOOST_TEST(sends == want_sends, what << ": rank " << got.rank << " sent " << sends << " tied messages");
    BOOST_TEST(sent_bytes == want_sends * static_cast<std::uint64_t>(256 * kDModel * 8 / run.weight_shards),
               what << ": rank " << got.rank << " sent " << sent_bytes << " tied bytes");
  }
}

// A checkpoint is the whole model's whatever wrote it: saved after 2 of 4
// steps under a pipeline it resumes on one rank, and saved on one rank it
// resumes under pp x zero1, each continuing the uninterrupted run's losses.
// (Threads: one process, so one temporary folder serves every rank.)
BOOST_AUTO_TEST_CASE(checkpoints_cross_between_pipelined_and_unpipelined_runs,
                     *boost::unit_test::precondition(one_process)) {
  train::TrainOptions one = small_model(4, 2);
  one.steps = 4;
  const train::TrainResult want = train::train(one, slice(), nullptr);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("dtensor_pipeline_ckpt_{}", ::getpid());
  auto check_rest = [&](const train::TrainResult& rest, const char* what) {
    BOOST_TEST_REQUIRE(rest.first_step == 2, what);
    BOOST_TEST_REQUIRE(rest.losses.size() == 2u, what);
    for (std::size_t i = 0; i < 2; ++i)
      BOOST_TEST(testing::close(rest.losses[i], want.losses[i + 2], 1e-9 * std::abs(want.losses[i + 2])),
                 what << ": step " << i + 2 << " loss " << rest.losses[i] << " vs " << want.losses[i + 2]);
  };
  train::TrainOptions first = one;
  first.steps = 2;
  first.schedule_steps = 4;
  train::TrainOptions rest = one;
  rest.schedule_steps = 4;
  first.save_dir = rest.resume_dir = (dir / "from_pp").string();
  run_pipeline(pipelined(first, "1f1b", {2}, {"pp"}, {"pp"}));
  check_rest(train::train(rest, slice(), nullptr), "saved under pp = 2, resumed on one rank");
  first.save_dir = rest.resume_dir = (dir / "to_pp").string();
  train::train(first, slice(), nullptr);
  check_rest(run_pipeline(pipelined(rest, "1f1b", {2, 2}, {"pp", "dp"}, {"pp", "zero1"})).result,
             "saved on one rank, resumed under pp x zero1");
  std::filesystem::remove_all(dir);
}

// Tied, the checkpoint holds the weight once ("wte.weight", no lm_head):
// saved under a V (both copies on rank 0) it resumes on one rank, and saved
// on one rank it resumes under 1f1b, each copy loaded into its own storage.
BOOST_AUTO_TEST_CASE(tied_checkpoints_hold_the_weight_once, *boost::unit_test::precondition(one_process)) {
  train::TrainOptions one = small_model(4, 2);
  one.model.tie_embeddings = true;
  one.steps = 4;
  const train::TrainResult want = train::train(one, slice(), nullptr);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("dtensor_pipeline_tied_{}", ::getpid());
  train::TrainOptions first = one, rest = one;
  first.steps = 2;
  first.schedule_steps = rest.schedule_steps = 4;
  auto check_rest = [&](const train::TrainResult& got, const char* what) {
    BOOST_TEST_REQUIRE(got.losses.size() == 2u, what);
    for (std::size_t i = 0; i < 2; ++i)
      BOOST_TEST(testing::close(got.losses[i], want.losses[i + 2], 1e-9 * std::abs(want.losses[i + 2])),
                 what << ": step " << i + 2 << " loss " << got.losses[i] << " vs " << want.losses[i + 2]);
  };
  first.save_dir = rest.resume_dir = (dir / "from_v").string();
  run_pipeline(pipelined(first, "zbv", {2}, {"pp"}, {"pp"}, 2));
  const std::map<std::string, Tensor> saved = dcp::load_full((dir / "from_v").string());
  BOOST_TEST(saved.contains("wte.weight"));
  BOOST_TEST(saved.contains("exp_avg.wte.weight"));
  for (const auto& [name, t] : saved) BOOST_TEST(name.find("lm_head") == std::string::npos, name);
  check_rest(train::train(rest, slice(), nullptr), "tied, saved under zbv, resumed on one rank");
  first.save_dir = rest.resume_dir = (dir / "to_pp").string();
  train::train(first, slice(), nullptr);
  check_rest(run_pipeline(pipelined(rest, "1f1b", {2}, {"pp"}, {"pp"})).result, "tied, saved on one rank, resumed under pp");
  std::filesystem::remove_all(dir);
}

// In f32 too, pp = 2 under 1f1b, zb-h1 and dualpipev gives the one-rank
// run's losses bit for bit: each stage computes what one rank computes, in
// the same order (the loss scale is applied to each microbatch before its
// backward, and gradients accumulate over microbatches in their order on
// both: a stage's backwards, and its W's, take the microbatches in turn).
BOOST_AUTO_TEST_CASE(f32_losses_are_bitwise_those_of_one_rank, *boost::unit_test::precondition(ranks_available{2})) {
  struct Run {
    std::string schedule;
    std::int64_t micro_batches, virtual_stages;
  };
  for (const Run& run : {Run{"1f1b", 2, 1}, Run{"zb-h1", 2, 1}, Run{"dualpipev", 4, 2}}) {
    train::TrainOptions one = small_model(4, run.micro_batches);
    one.model.dtype = DType::Float32;
    const train::TrainResult want = train::train(one, slice(), nullptr);
    const Outcome got = run_pipeline(pipelined(one, run.schedule, {2}, {"pp"}, {"pp"}, run.virtual_stages));
    BOOST_TEST_REQUIRE(got.result.losses.size() == want.losses.size(), run.schedule);
    for (std::size_t i = 0; i < want.losses.size(); ++i)
      BOOST_TEST(got.result.losses[i] == want.losses[i],
                 run.schedule << " step " << i << ": " << got.result.losses[i] << " vs one rank's " << want.losses[i]);
  }
}

// With dp beside pp, a stage's gradients stay Partial over the backwards
// and are reduced once, by the optimizer step: the pipeline phase of stage
// 0 (which reads no loss) runs no all_reduce over dp.
BOOST_AUTO_TEST_CASE(data_parallel_reduction_runs_once_per_step, *boost::unit_test::precondition(ranks_available{4})) {
  train::TrainOptions o = small_model(4, 3);
  o.mesh = {2, 2};
  o.dims = {"pp", "dp"};
  o.plans = {"pp", "ddp"};
  o.steps = 1;
  const Outcome got = run_pipeline(o);
  const bool first_stage = got.rank < 2;  // pp is the mesh's first dim
  std::uint64_t in_pipeline = 0, in_optimizer = 0;
  for (const auto& c : got.result.comm)
    if (c.kind == "all_reduce" && c.mesh_dims == std::vector<std::string>{"dp"})
      (c.phase == "pipeline" ? in_pipeline : in_optimizer) += c.count;
  BOOST_TEST((in_pipeline == 0u || !first_stage), in_pipeline << " all_reduces over dp in stage 0's pipeline phase");
  BOOST_TEST(in_optimizer > 0u);
}

// 1F1B with fewer microbatches than pp ranks is refused by name, on every
// rank, before any message (torchtitan#775 was a hang).
BOOST_AUTO_TEST_CASE(too_few_microbatches_refused_before_any_message,
                     *boost::unit_test::precondition(ranks_available{4})) {
  train::TrainOptions o = small_model(4, 2);
  o.mesh = {4};
  o.dims = {"pp"};
  o.plans = {"pp"};
  testing::FailureLog log;
  testing::run_ranks(4, [&](Communicator& world) {
    const auto messages = [&] {
      return world.stats().count(CollectiveKind::Send) + world.stats().count(CollectiveKind::Recv);
    };
    const std::uint64_t sent_before = messages();  // an MPI world lives on
    try {
      train::train(o, slice(), &world);
      log.add("trained with m = 2 < p = 4");
    } catch (const ValueError& e) {
      const std::string what = e.what();
      if (what.find("1f1b") == std::string::npos || what.find('2') == std::string::npos)
        log.add("the refusal does not name 1f1b and m: " + what);
    }
    if (messages() != sent_before) log.add("a message was sent before the refusal");
  });
  log.report("1f1b with m < p");
}

BOOST_AUTO_TEST_CASE(layer_split_is_validated) {
  namespace pipe = nn::pipeline;
  BOOST_TEST(pipe::split_layers(5, 2).blocks_per_stage == (std::vector<std::int64_t>{3, 2}));
  const std::vector<std::int64_t> given{1, 3};
  BOOST_TEST(pipe::split_layers(4, 2, given).first_block(1) == 1);
  const std::vector<std::int64_t> empty_stage{4, 0};
  BOOST_CHECK_EXCEPTION(pipe::split_layers(4, 2, empty_stage), ValueError,
                        [](const ValueError& e) { return std::string(e.what()).find("4,0") != std::string::npos; });
  BOOST_CHECK_EXCEPTION(pipe::split_layers(1, 2), ValueError, [](const ValueError& e) {
    return std::string(e.what()).find("1 layers over 2 stages") != std::string::npos;
  });
}

// A stage that dies ends its neighbour's step with an error naming the
// neighbour's stage and the action it was in, within the deadline.
BOOST_AUTO_TEST_CASE(a_dead_stage_ends_its_neighbour_with_the_action, *boost::unit_test::precondition(threads_only)) {
  namespace pipe = nn::pipeline;
  const train::TrainOptions o = small_model(2, 2);
  const pipe::Schedule lowered = pipe::lower(pipe::make_schedule("1f1b", 2, 2));
  std::string seen;
  try {
    testing::run_ranks(
        2,
        [&](Communicator& world) {
          if (world.rank() == 1) throw Error("stage 1 died");
          nn::GPT<Tensor> whole = nn::GPT<Tensor>::init(o.model, o.seed, nn::plain_parameters(DType::Float64));
          pipe::GPTStage<Tensor> first = pipe::GPTStage<Tensor>::take(whole, pipe::split_layers(2, 2), 0);
          pipe::StepInputs<Tensor> in;
          for (int mb = 0; mb < 2; ++mb) {
            in.tokens.push_back(Tensor::zeros({kBatch, kSeq}, DType::Int64));
            in.targets.push_back(Tensor::zeros({kBatch, kSeq}, DType::Int64));
          }
          std::vector<pipe::GPTStage<Tensor>*> mine{&first};
          try {
            pipe::run_step<Tensor>(lowered, mine, world, in);
          } catch (const CommError& e) {
            seen = e.what();
            throw;
          }
        },
        std::chrono::milliseconds(5'000));
  } catch (const RankFailed&) {
  }
  BOOST_TEST(seen.find("schedule '1f1b', rank 0, stage 0, action") != std::string::npos, seen);
  BOOST_TEST((seen.find("SEND_F") != std::string::npos || seen.find("RECV_B") != std::string::npos), seen);
}

BOOST_AUTO_TEST_SUITE_END()
