// Pipeline schedules as data (nn/pipeline.h): the text and CSV forms round
// trip; every generator's schedule validates and lowers for p in {2, 4, 8}
// and m in {p, 2p, 4p} (DualPipeV: p in {2, 3, 4, 8}, m in {2p, 2p+1, 3p,
// 4p}, as it needs m >= 2p); the simulator reproduces the known makespans,
// bubbles and memory exactly at unit costs (F = I = W = 1, B = 2, free
// messages); refusals, the deadlock of two ranks both in send
// (pytorch#172668), and invalid schedules' messages.
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <dtensor/nn/pipeline.h>

#include "support.h"

using namespace dtensor;
using namespace dtensor::nn::pipeline;
namespace bdata = boost::unit_test::data;

namespace pipeline_suite {

struct Case {
  int ranks, microbatches, virtual_stages;
};
std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << "p=" << c.ranks << " m=" << c.microbatches << " v=" << c.virtual_stages;
}

// p in {2, 4, 8}, m in {p, 2p, 4p}, v as given.
std::vector<Case> cases(std::vector<int> virtual_stages) {
  std::vector<Case> all;
  for (int p : {2, 4, 8})
    for (int k : {1, 2, 4})
      for (int v : virtual_stages) all.push_back({p, k * p, v});
  return all;
}

int count_of(const Schedule& s, std::initializer_list<ActionKind> kinds) {
  int count = 0;
  for (const auto& list : s.actions)
    for (const Action& a : list) count += std::ranges::find(kinds, a.kind) != kinds.end() ? 1 : 0;
  return count;
}

// Rank 0 sends stage 0's output of microbatch 1 while rank 1 sends stage 1's
// gradient of microbatch 0: both block in send (pytorch#172668's pattern).
const char* kBothSendFirst =
    "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
    "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n";

}  // namespace pipeline_suite

using namespace pipeline_suite;

BOOST_AUTO_TEST_SUITE(pipeline_text)

BOOST_AUTO_TEST_CASE(every_kind_parses_and_prints_back) {
  for (std::string token : {"0F3", "1B2", "12I0", "3W15", "2SEND_F1", "3RECV_F1", "3SEND_B1", "2RECV_B1"})
    BOOST_TEST(action_text(parse_action(token)) == token);
  BOOST_TEST((parse_action("2SEND_F1") == Action{2, ActionKind::SendForward, 1}));
  BOOST_TEST((parse_action("10I7") == Action{10, ActionKind::BackwardInput, 7}));
}

BOOST_AUTO_TEST_CASE(random_actions_round_trip) {
  const std::uint64_t seed = testing::seeded(29);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 500; ++i) {
    Action a{static_cast<int>(rng() % 64), static_cast<ActionKind>(rng() % 8), static_cast<int>(rng() % 1000)};
    std::string text = action_text(a);
    BOOST_TEST((parse_action(text) == a), "seed " << seed << ": " << text);
  }
}

BOOST_AUTO_TEST_CASE(bad_tokens_are_parse_errors_naming_the_token) {
  for (std::string token : {"F3", "0X3", "0F", "00F1", "0F01", "", "0SEND3", "-1F0", "0 F0"})
    testing::check_throws<ParseError>([&] { parse_action(token); }, "'" + token + "'");
  testing::check_throws<ParseError>([] { parse_action("0Q1"); }, "unknown kind 'Q'");
}

BOOST_AUTO_TEST_CASE(csv_round_trips_for_every_generator) {
  for (const std::string& name : schedule_names()) {
    Schedule s = lower(make_schedule(name, 4, 8, name == "interleaved" ? 2 : 1));
    std::string csv = to_csv(s);
    Schedule back = from_csv(csv);
    BOOST_TEST(to_csv(back) == csv, name);
    BOOST_TEST((back.actions == s.actions), name);
    BOOST_TEST(back.stages == s.stages, name);
    BOOST_TEST(back.microbatches == s.microbatches, name);
    BOOST_TEST((back.stages_of_rank == s.stages_of_rank), name);
    BOOST_CHECK_NO_THROW(validate(back));
  }
}

BOOST_AUTO_TEST_CASE(csv_tolerates_spaces_and_a_missing_final_newline) {
  Schedule s = from_csv("0F0, 0B0\n");
  BOOST_TEST(to_csv(s) == "0F0,0B0\n");
  BOOST_TEST(to_csv(from_csv("0F0,0B0")) == "0F0,0B0\n");
}

BOOST_AUTO_TEST_CASE(a_bad_csv_token_names_rank_position_and_token) {
  testing::check_throws<ParseError>([] { from_csv("0F0,0F1\n1F0,1Q1\n"); }, "rank 1 (row 2), position 1");
  testing::check_throws<ParseError>([] { from_csv("0F0,0F1\n1F0,1Q1\n"); }, "'1Q1'");
}

BOOST_AUTO_TEST_CASE(the_grid_has_one_column_per_rank_and_marks_a_cell) {
  std::string grid = grid_text(one_f_one_b(2, 2), std::pair{1, 2});
  BOOST_TEST(grid.find("rank 0") != std::string::npos);
  BOOST_TEST(grid.find("rank 1") != std::string::npos);
  BOOST_TEST(grid.find("[1F1]") != std::string::npos, grid);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(pipeline_generators)

BOOST_DATA_TEST_CASE(gpipe_and_1f1b_take_3_m_plus_p_minus_1, bdata::make(cases({1})), c) {
  const int p = c.ranks, m = c.microbatches;
  for (Schedule s : {gpipe(p, m), one_f_one_b(p, m)}) {
    BOOST_CHECK_NO_THROW(validate(s));
    SimulationResult r = simulate(s);
    BOOST_TEST(r.makespan == 3.0 * (m + p - 1), s.name << " " << c);
    // Every rank computes 3m and waits 3(p-1): bubble over the makespan.
    for (int rank = 0; rank < p; ++rank) BOOST_TEST(r.idle[rank] == 3.0 * (p - 1), s.name << " " << c);
    BOOST_TEST(testing::close(r.bubble_fraction, double(p - 1) / (m + p - 1), 1e-12), c << ": " << r.bubble_fraction);
    BOOST_TEST(testing::close(r.bubble_ratio, double(p - 1) / m, 1e-12), c << ": " << r.bubble_ratio);
    for (int rank = 0; rank < p; ++rank)
      BOOST_TEST(r.peak_microbatches[rank] == (s.name == "gpipe" ? m : p - rank), s.name << " " << c);
  }
}

BOOST_DATA_TEST_CASE(zb_h1_takes_3m_plus_p_minus_1_holding_at_most_p, bdata::make(cases({1})), c) {
  const int p = c.ranks, m = c.microbatches;
  Schedule s = zero_bubble_h1(p, m);
  BOOST_CHECK_NO_THROW(validate(s));
  SimulationResult r = simulate(s);
  BOOST_TEST(r.makespan == 3.0 * m + p - 1, c);
  for (int rank = 0; rank < p; ++rank) {
    BOOST_TEST(r.idle[rank] == double(p - 1), c);  // a third of 1F1B's 3(p-1)
    BOOST_TEST(r.peak_microbatches[rank] <= p, c);
  }
  BOOST_TEST(r.peak_microbatches[0] == p, c);
  BOOST_TEST(testing::close(r.bubble_fraction, double(p - 1) / (3 * m + p - 1), 1e-12), c << ": " << r.bubble_fraction);
  BOOST_TEST(testing::close(r.bubble_ratio, double(p - 1) / (3 * m), 1e-12), c << ": " << r.bubble_ratio);
}

BOOST_DATA_TEST_CASE(interleaved_takes_3vm_plus_3_p_minus_1_chunk_units, bdata::make(cases({2, 4})), c) {
  const int p = c.ranks, m = c.microbatches, v = c.virtual_stages;
  Schedule s = interleaved(p, m, v);
  BOOST_TEST(s.stages == v * p);
  BOOST_TEST((s.stages_of_rank[1] == looped_placement(p, v)[1]));
  BOOST_CHECK_NO_THROW(validate(s));
  SimulationResult r = simulate(s);  // unit cost per stage (chunk): F = 1, B = 2
  BOOST_TEST(r.makespan == 3.0 * v * m + 3.0 * (p - 1), c);
  BOOST_TEST(testing::close(r.bubble_ratio, double(p - 1) / (v * m), 1e-12), c << ": " << r.bubble_ratio);
  BOOST_TEST(testing::close(r.bubble_fraction, double(p - 1) / (v * m + p - 1), 1e-12), c << ": " << r.bubble_fraction);
  // Warm-up plus one: (v-1)N + 2(p-1-r) + 1 chunks held on rank r (N = p here).
  for (int rank = 0; rank < p; ++rank)
    BOOST_TEST(r.peak_microbatches[rank] == std::min((v - 1) * p + 2 * (p - 1 - rank) + 1, v * m), c);
}

// The greedy ZBV order holds 2p stage activations on every rank (1F1B's p
// full stages) and takes 6m + p - 1 half-stage units (each of the 2p
// stages costs F = I = W = 1) for p in {2, 4} and at p = 8, m = 8, like
// PyTorch's order; at p = 8 with m = 16 and 32 it takes 4 units more.
BOOST_DATA_TEST_CASE(zbv_holds_2p_stages_and_nearly_takes_6m_plus_p_minus_1, bdata::make(cases({2})), c) {
  const int p = c.ranks, m = c.microbatches;
  Schedule s = zbv(p, m);
  BOOST_TEST((s.stages_of_rank[0] == std::vector<int>{0, 2 * p - 1}));
  BOOST_CHECK_NO_THROW(validate(s));
  SimulationResult r = simulate(s);
  for (int rank = 0; rank < p; ++rank) BOOST_TEST(r.peak_microbatches[rank] == 2 * p, c);
  const double ideal = 6.0 * m + p - 1;
  if (p <= 4 || m == p)
    BOOST_TEST(r.makespan == ideal, c);
  else
    BOOST_TEST((r.makespan >= ideal && r.makespan <= ideal + 4), c << ": makespan " << r.makespan);
  BOOST_TEST(r.makespan < 6.0 * (m + p - 1), c);  // 1F1B on p ranks of two stages each
}

// DualPipeV for p in {2, 3, 4, 8} and m in {2p, 2p+1, 3p, 4p} (it needs m >= 2p).
std::vector<Case> dualpipev_cases() {
  std::vector<Case> all;
  for (int p : {2, 3, 4, 8})
    for (int m : {2 * p, 2 * p + 1, 3 * p, 4 * p}) all.push_back({p, m, 2});
  return all;
}

BOOST_DATA_TEST_CASE(dualpipev_runs_every_stage_s_microbatches_and_lowers, bdata::make(dualpipev_cases()), c) {
  const int p = c.ranks, m = c.microbatches;
  Schedule s = dualpipev(p, m);
  BOOST_TEST(s.stages == 2 * p, c);
  BOOST_TEST((s.stages_of_rank == v_placement(p)), c);
  std::vector<int> forwards(s.stages, 0), backwards(s.stages, 0), inputs(s.stages, 0), weights(s.stages, 0);
  for (const auto& list : s.actions)
    for (const Action& a : list) {
      if (a.kind == ActionKind::Forward) ++forwards[a.stage];
      if (a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardInput) ++backwards[a.stage];
      if (a.kind == ActionKind::BackwardInput) ++inputs[a.stage];
      if (a.kind == ActionKind::BackwardWeight) ++weights[a.stage];
    }
  for (int stage = 0; stage < s.stages; ++stage) {
    BOOST_TEST(forwards[stage] == m, c << " stage " << stage);
    BOOST_TEST(backwards[stage] == m, c << " stage " << stage);
    BOOST_TEST(weights[stage] == inputs[stage], c << " stage " << stage);  // every I's W, none more
  }
  BOOST_CHECK_NO_THROW(validate(s));
  BOOST_CHECK_NO_THROW(validate(lower(s)));
}

// Unit costs, each of the 2p stages F = I = W = 1 (B = 2), so a rank's work
// is 2 stages x m x 3 = 6m. Memory: rank r holds 2(p-1-r) + 2(r+1) = 2p
// stage activations after its warm-up (phases 1 and 2; phase 3 frees one
// with each W before its next forward), and the main phase's first down
// forward comes before the up backward that frees one: 2p + 1 on every
// rank, DeepSeek's "PP + 1" with PP = 2p stages. Time: the V's turn, rank
// p-1, has nothing to run before microbatch 0 crosses the p-1 stages below
// it, so no V schedule beats 6m + p - 1; DualPipeV meets that bound (its
// turn never waits again). DeepSeek's bubble (PP/2 - 1)(F&B + B - 3W), with
// F&B = F + B = 3 (no overlap) and B = 2, allows 2(p-1), and ZB-H1 on p
// stages of twice the cost, 2(3m + p - 1) = 6m + 2(p-1), takes that too;
// 1F1B on them, 6(m + p - 1).
BOOST_DATA_TEST_CASE(dualpipev_holds_2p_plus_1_stages_and_takes_6m_plus_p_minus_1, bdata::make(dualpipev_cases()), c) {
  const int p = c.ranks, m = c.microbatches;
  SimulationResult r = simulate(dualpipev(p, m));
  for (int rank = 0; rank < p; ++rank) BOOST_TEST(r.peak_microbatches[rank] == 2 * p + 1, c << " rank " << rank);
  BOOST_TEST(r.makespan == 6.0 * m + p - 1, c);
  for (int rank = 0; rank < p; ++rank) BOOST_TEST(r.idle[rank] == double(p - 1), c << " rank " << rank);
  BOOST_TEST(testing::close(r.bubble_fraction, double(p - 1) / (6 * m + p - 1), 1e-12), c << ": " << r.bubble_fraction);
  BOOST_TEST(testing::close(r.bubble_ratio, double(p - 1) / (6 * m), 1e-12), c << ": " << r.bubble_ratio);
  BOOST_TEST(r.makespan <= 6.0 * m + 2 * (p - 1), c);  // DeepSeek's bubble
  BOOST_TEST(r.makespan <= simulate(zbv(p, m)).makespan, c);
  BOOST_TEST(r.makespan < 6.0 * (m + p - 1), c);  // 1F1B on p ranks of two stages each
}

// The order written out by hand from DualPipeV's eight phases for p = 2,
// m = 4. Rank 0 (stages 0 and 3): 2 down forwards; one pair 0F2,3F0; one
// 3I0,3W0,3F1; one main step 0F3,3B1,3F2,0B0; one 3B2,3F3,0B1; one cool-down
// pair 3B3 then 0I2 (even rank: the split starts at the down half); one
// 0W2,0I3; the last W. Rank 1 (stages 1 and 2) has no phases 1, 3, 5 or 7:
// two pairs, two main steps, the cool-down pairs 2B2,1B2 and 2I3,1I3 (odd
// rank: its middle pair is split whole), its two W's in their I's order.
BOOST_AUTO_TEST_CASE(dualpipev_on_2_ranks_and_4_microbatches_is_the_eight_phases) {
  BOOST_TEST(to_csv(dualpipev(2, 4)) ==
             "0F0,0F1,0F2,3F0,3I0,3W0,3F1,0F3,3B1,3F2,0B0,3B2,3F3,0B1,3B3,0I2,0W2,0I3,0W3\n"
             "1F0,2F0,1F1,2F1,1F2,2B0,2F2,1B0,1F3,2B1,2F3,1B1,2B2,1B2,2I3,1I3,2W3,1W3\n");
}

BOOST_AUTO_TEST_CASE(interleaved_groups_of_n_between_p_and_2p_keep_the_formula) {
  // p = 4: m = 6 (one round, N = 6) and m = 10 (two rounds, N = 5).
  for (int m : {5, 6, 10}) {
    SimulationResult r = simulate(interleaved(4, m, 2));
    BOOST_TEST(r.makespan == 3.0 * 2 * m + 3.0 * 3, "m=" << m);
  }
}

BOOST_DATA_TEST_CASE(every_generator_lowers_with_two_messages_per_boundary_and_microbatch, bdata::make(cases({1, 2})),
                     c) {
  for (const std::string& name : schedule_names()) {
    const bool v_shaped = name == "zbv" || name == "dualpipev";
    if ((name == "interleaved" || v_shaped) != (c.virtual_stages > 1)) continue;
    if (name == "dualpipev" && c.microbatches < 2 * c.ranks) continue;  // it needs m >= 2p
    Schedule s = make_schedule(name, c.ranks, c.microbatches, c.virtual_stages);
    Schedule lowered = lower(s);
    // One activation and one gradient per microbatch across each boundary
    // between ranks: every boundary but the V's turn (stages p-1 and p share
    // rank p-1) under zbv and dualpipev.
    const int boundaries = v_shaped ? s.stages - 2 : s.stages - 1;
    const int messages = 2 * c.microbatches * boundaries;
    BOOST_TEST(count_of(lowered, {ActionKind::SendForward, ActionKind::SendBackward}) == messages, name << " " << c);
    BOOST_TEST(count_of(lowered, {ActionKind::RecvForward, ActionKind::RecvBackward}) == messages, name << " " << c);
    BOOST_TEST(simulate(lowered).makespan == simulate(s).makespan, name << " " << c);
  }
}

BOOST_AUTO_TEST_CASE(generators_produce_compute_only_schedules) {
  for (const std::string& name : schedule_names())
    BOOST_TEST(!make_schedule(name, 4, 8, name == "interleaved" ? 2 : 1).has_communication(), name);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(pipeline_refusals)

BOOST_AUTO_TEST_CASE(one_f_one_b_refuses_fewer_microbatches_than_ranks_before_anything_runs) {
  testing::check_throws<ValueError>([] { one_f_one_b(8, 1); }, "1 microbatches on 8 ranks; 1f1b needs m >= p");
  testing::check_throws<ValueError>([] { make_schedule("zb-h1", 4, 3); }, "zb-h1 needs m >= p");
}

BOOST_AUTO_TEST_CASE(interleaved_refuses_m_not_divisible_by_its_rounds) {
  testing::check_throws<ValueError>([] { interleaved(4, 9, 2); }, "9 microbatches on 4 ranks");
  testing::check_throws<ValueError>([] { interleaved(4, 9, 2); }, "m divisible by m / p");
  testing::check_throws<ValueError>([] { interleaved(4, 3, 2); }, "m >= p");
  BOOST_CHECK_NO_THROW(interleaved(4, 10, 2));
}

BOOST_AUTO_TEST_CASE(bad_names_and_sizes_are_typed_errors_naming_the_value) {
  testing::check_throws<ValueError>([] { make_schedule("zbv2", 4, 8); }, "unknown schedule 'zbv2'");
  testing::check_throws<ValueError>([] { make_schedule("1f1b", 4, 8, 2); }, "2 stages per rank");
  testing::check_throws<ValueError>([] { gpipe(0, 4); }, "ranks = 0");
  testing::check_throws<ValueError>([] { interleaved(2, 4, 0); }, "virtual stages per rank = 0");
  testing::check_throws<ValueError>([] { zbv(1, 4); }, "zbv needs p >= 2");
  testing::check_throws<ValueError>([] { make_schedule("zbv", 4, 8, 3); }, "zbv holds exactly 2 per rank");
}

BOOST_AUTO_TEST_CASE(dualpipev_refuses_fewer_than_2p_microbatches_one_rank_and_other_than_2_stages_per_rank) {
  testing::check_throws<ValueError>([] { dualpipev(4, 7); }, "7 microbatches on 4 ranks; dualpipev needs m >= 2p");
  testing::check_throws<ValueError>([] { dualpipev(4, 7); }, "(here 8)");
  testing::check_throws<ValueError>([] { make_schedule("dualpipev", 2, 3, 2); }, "dualpipev needs m >= 2p");
  testing::check_throws<ValueError>([] { dualpipev(1, 4); }, "1 ranks; dualpipev needs p >= 2");
  testing::check_throws<ValueError>([] { dualpipev(0, 4); }, "0 ranks; dualpipev needs p >= 2");
  testing::check_throws<ValueError>([] { make_schedule("dualpipev", 4, 8, 3); },
                                    "3 stages per rank; dualpipev holds exactly 2 per rank");
  BOOST_CHECK_NO_THROW(dualpipev(4, 8));
  BOOST_TEST((make_schedule("dualpipev", 4, 8, 1) == make_schedule("dualpipev", 4, 8, 2)));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(pipeline_validation)

BOOST_AUTO_TEST_CASE(two_ranks_both_blocked_in_send_are_a_deadlock) {
  Schedule s = from_csv(kBothSendFirst);
  testing::check_throws<ValueError>([&] { validate(s); }, "deadlock with blocking sends");
  testing::check_throws<ValueError>([&] { validate(s); }, "rank 0, position 3 (0SEND_F1)");
  testing::check_throws<ValueError>([&] { validate(s); }, "rank 1 is at position 3 (1SEND_B0)");
  testing::check_throws<ValueError>([&] { validate(s); }, "[0SEND_F1]");
  // The same compute, lowered by lower(): the odd rank receives first.
  Schedule compute_only = s;
  for (auto& list : compute_only.actions) std::erase_if(list, [](const Action& a) { return !is_compute(a.kind); });
  BOOST_CHECK_NO_THROW(validate(lower(compute_only)));
}

// Where the sizes are known, a send's bytes must be its receive's: a
// stage that receives its input in another layout than the sender's is
// named with both sizes.
BOOST_AUTO_TEST_CASE(a_send_and_its_receive_must_move_the_same_bytes) {
  const Schedule s = lower(one_f_one_b(2, 2));
  auto activation = [](const Action&) -> std::uint64_t { return 4096; };
  BOOST_CHECK_NO_THROW(validate(s, activation));
  // Stage 1 expects a half-size input (a sequence shard, say) of microbatch 1.
  auto halved = [](const Action& a) -> std::uint64_t {
    return a.kind == ActionKind::RecvForward && a.microbatch == 1 ? 2048 : 4096;
  };
  testing::check_throws<ValueError>([&] { validate(s, halved); },
                                    "sends 4096 bytes; its receive 1RECV_F1 on rank 1 expects 2048 bytes");
  testing::check_throws<ValueError>([&] { validate(s, halved); }, "(0SEND_F1)");
}

BOOST_AUTO_TEST_CASE(an_invalid_schedule_names_rank_position_and_action_and_marks_the_grid) {
  Schedule s = one_f_one_b(2, 2);
  std::swap(s.actions[1][0], s.actions[1][1]);  // 1B0 before 1F0
  testing::check_throws<ValueError>([&] { validate(s); },
                                    "rank 1, position 0 (1B0): a backward before its forward 1F0");
  testing::check_throws<ValueError>([&] { validate(s); }, "[1B0]");
}

BOOST_AUTO_TEST_CASE(each_rule_has_its_message) {
  Schedule missing = gpipe(2, 2);
  missing.actions[0].pop_back();
  testing::check_throws<ValueError>([&] { validate(missing); }, "stage 0 has no backward of microbatch 1");
  Schedule weight_first = zero_bubble_h1(2, 2);
  auto& list = weight_first.actions[1];
  auto w = std::ranges::find(list, Action{1, ActionKind::BackwardWeight, 0});
  list.erase(w);
  list.insert(list.begin(), Action{1, ActionKind::BackwardWeight, 0});
  testing::check_throws<ValueError>([&] { validate(weight_first); }, "W before its I (1I0)");
  // An unmatched send: the receive removed.
  Schedule lowered = lower(one_f_one_b(2, 2));
  std::erase(lowered.actions[1], Action{1, ActionKind::RecvForward, 1});
  testing::check_throws<ValueError>([&] { validate(lowered); }, "no 1RECV_F1");
  // Input used before it arrived: a forward on rank 1 with no receive before it.
  Schedule early = lower(one_f_one_b(2, 2));
  std::erase(early.actions[0], Action{0, ActionKind::SendForward, 0});
  testing::check_throws<ValueError>([&] { validate(early); }, "no matching 0SEND_F0 on rank 0");
  // Stages 0 and 1 on one rank pass tensors without a message.
  Schedule local = interleaved(1, 1, 2);
  local.actions[0].insert(local.actions[0].begin() + 1, Action{0, ActionKind::SendForward, 0});
  testing::check_throws<ValueError>([&] { validate(local); }, "stages 0 and 1 are both on rank 0");
  // A compute-only schedule whose ranks wait on each other for ever.
  Schedule cycle = one_f_one_b(2, 2);
  cycle.actions[0] = {{0, ActionKind::Forward, 1},
                      {0, ActionKind::Backward, 1},
                      {0, ActionKind::Forward, 0},
                      {0, ActionKind::Backward, 0}};
  cycle.actions[1] = {{1, ActionKind::Forward, 0},
                      {1, ActionKind::Backward, 0},
                      {1, ActionKind::Forward, 1},
                      {1, ActionKind::Backward, 1}};
  testing::check_throws<ValueError>([&] { validate(cycle); }, "waiting for its input");
}

BOOST_AUTO_TEST_CASE(lowering_puts_sends_after_producers_and_receives_before_consumers) {
  // docs/pipeline.md shows this text. Rank 1 receives 1RECV_F1 before its
  // 1SEND_B0, earlier than just before 1F1: rank 0 sends 0SEND_F1 first, so
  // in the one global message order the activation comes first.
  BOOST_TEST(to_csv(lower(one_f_one_b(2, 3))) ==
             "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0F2,0SEND_F2,0RECV_B1,0B1,0RECV_B2,0B2\n"
             "1RECV_F0,1F0,1B0,1RECV_F1,1SEND_B0,1F1,1B1,1RECV_F2,1SEND_B1,1F2,1B2,1SEND_B2\n");
  // Where nothing forces an earlier receive, it comes just before its consumer.
  BOOST_TEST(to_csv(lower(gpipe(2, 2))) ==
             "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
             "1RECV_F0,1F0,1RECV_F1,1F1,1B0,1SEND_B0,1B1,1SEND_B1\n");
}

BOOST_AUTO_TEST_CASE(lower_refuses_a_schedule_that_already_communicates) {
  testing::check_throws<ValueError>([] { lower(lower(gpipe(2, 2))); }, "already sends and receives");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(pipeline_simulation)

BOOST_AUTO_TEST_CASE(messages_cost_latency_plus_bytes_over_bandwidth_per_hop) {
  // 0.25 s latency + 250 kB at 1 MB/s = 0.5 per message. GPipe's forward
  // and backward chains each cross p-1 boundaries: 3(m+p-1) + 2(p-1)0.5.
  PipelineCosts costs;
  costs.link = LinkParams{.hop_latency_s = 0.25, .bandwidth_Bps = 1e6};
  costs.message_bytes = 250'000;
  BOOST_TEST(costs.message_seconds() == 0.5);
  for (int p : {2, 4}) {
    SimulationResult r = simulate(gpipe(p, 2 * p), costs);
    BOOST_TEST(r.makespan == 3.0 * (3 * p - 1) + (p - 1), "p=" << p);
  }
}

BOOST_AUTO_TEST_CASE(per_stage_costs_scale_the_timeline) {
  PipelineCosts doubled;
  doubled.forward = doubled.input_backward = doubled.weight_backward = 2;
  BOOST_TEST(simulate(one_f_one_b(4, 8), doubled).makespan == 2 * 33.0);
  // A slow last stage (F = 2, B = 4) sets the pace: 1F1B's steady state runs at its rate.
  PipelineCosts slow_last;
  slow_last.per_stage = {{}, {}, {}, {.forward = 2, .input_backward = 2, .weight_backward = 2}};
  SimulationResult r = simulate(one_f_one_b(4, 8), slow_last);
  BOOST_TEST(r.busy[3] == 8 * 6.0);
  BOOST_TEST(r.makespan > 33.0);
}

// Ranks sharing cores (thread ranks on a small machine): on one core every
// schedule takes exactly its whole work, since a schedule that validates
// always has a ready action and the core never idles; with a core per rank
// it is the plain simulation; in between the makespan is at least the whole
// work over the cores and at least the plain one.
BOOST_AUTO_TEST_CASE(ranks_sharing_cores_take_turns_on_them) {
  for (int p : {2, 4})
    for (int m : {p, 2 * p})
      for (const std::string& name : schedule_names()) {
        if (name == "dualpipev" && m < 2 * p) continue;
        const int v = name == "interleaved" || name == "zbv" || name == "dualpipev" ? 2 : 1;
        const Schedule s = make_schedule(name, p, m, v);
        const double work = 3.0 * s.stages * m;  // F = 1 and B = I + W = 2 per stage and microbatch
        const std::string what = fmt::format("{} p={} m={}", name, p, m);
        const SimulationResult plain = simulate(s);
        PipelineCosts shared;
        shared.cores = 1;
        const SimulationResult one_core = simulate(s, shared);
        BOOST_TEST(std::abs(one_core.makespan - work) < 1e-9, what << ": " << one_core.makespan << " on one core");
        BOOST_TEST(one_core.timeline.size() == plain.timeline.size(), what);
        shared.cores = p;
        BOOST_TEST(simulate(s, shared).makespan == plain.makespan, what);
        if (p == 4) {
          shared.cores = 2;
          const double two = simulate(s, shared).makespan;
          BOOST_TEST((two >= work / 2 - 1e-9 && two >= plain.makespan - 1e-9),
                     what << ": " << two << " on two cores; plain " << plain.makespan << ", work " << work);
        }
      }
  PipelineCosts negative;
  negative.cores = -1;
  testing::check_throws<ValueError>([&] { simulate(one_f_one_b(2, 2), negative); }, "-1 cores");
}

BOOST_AUTO_TEST_CASE(the_timeline_text_shows_each_rank_s_actions_at_their_times) {
  Schedule s = one_f_one_b(2, 2);
  std::string text = timeline_text(s, simulate(s));
  BOOST_TEST(text ==
                 "rank 0   0F0 0F1 .   .   0B0 0B0 .   0B1 0B1\n"
                 "rank 1   .   1F0 1B0 1B0 1F1 1B1 1B1 .   .\n",
             text);
}

BOOST_AUTO_TEST_SUITE_END()
