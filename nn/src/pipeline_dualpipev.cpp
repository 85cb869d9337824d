// DualPipeV (DeepSeek's DualPipe cut in half, Sea AI Lab's "cut-in-half"):
// two stages per rank in a V (rank r holds the stage going down, r, and the
// one coming back up, 2p-1-r), each rank's order written out phase by
// phase. The phase lengths follow deepseek-ai/DualPipe's dualpipev.py; the
// code here is our own.
//
// Upstream runs each "F&B" pair of its main phase as one overlapped call
// (the forward of one microbatch's compute hiding the other's all-to-all);
// without an overlap hook it runs the forward, then the backward. Our
// runtime does not overlap them, so a pair is two actions: F, then B.
#include <deque>
#include <utility>

#include <fmt/format.h>

#include "dtensor/core/error.h"
#include "dtensor/nn/pipeline.h"

namespace dtensor::nn::pipeline {

namespace {

// One rank's list, built in order: each stage's forwards and backwards take
// the microbatches in turn, and every W is owed in the order its I ran (a
// first-in, first-out queue, as upstream's WeightGradStore).
class RankOrder {
 public:
  explicit RankOrder(int down) : down_(down) {}

  void forward(int stage) { actions_.push_back({stage, ActionKind::Forward, next_forward(stage)++}); }
  // The whole backward, input and weight gradients together.
  void backward(int stage) { actions_.push_back({stage, ActionKind::Backward, next_backward(stage)++}); }
  // The input gradient only; the weight gradient is owed.
  void input_backward(int stage) {
    const int mb = next_backward(stage)++;
    actions_.push_back({stage, ActionKind::BackwardInput, mb});
    owed_.push_back({stage, mb});
  }
  // The oldest weight gradient owed.
  void weight_backward() {
    if (owed_.empty())
      throw Error(
          fmt::format("[pipeline] dualpipev: stage {}'s rank runs a W with none owed (an internal error)", down_));
    auto [stage, mb] = owed_.front();
    owed_.pop_front();
    actions_.push_back({stage, ActionKind::BackwardWeight, mb});
  }
  std::vector<Action> take() && { return std::move(actions_); }

 private:
  int& next_forward(int stage) { return stage == down_ ? forwards_[0] : forwards_[1]; }
  int& next_backward(int stage) { return stage == down_ ? backwards_[0] : backwards_[1]; }

  int down_;
  int forwards_[2] = {0, 0}, backwards_[2] = {0, 0};
  std::deque<std::pair<int, int>> owed_;  // (stage, microbatch) whose W waits
  std::vector<Action> actions_;
};

// Rank r's actions; `down` = r runs first, `up` = 2p-1-r second.
std::vector<Action> rank_order(int ranks, int microbatches, int rank) {
  const int down = rank, up = 2 * ranks - 1 - rank;
  const int below = ranks - 1 - rank;  // ranks further down the V than this one
  RankOrder o(down);
  // 1. Warm-up going down: 2(p-1-r) forwards of the down stage, what the
  //    rank can run while microbatch 0 goes down the p-1-r ranks below it
  //    and comes back up to it.
  for (int i = 0; i < 2 * below; ++i) o.forward(down);
  // 2. r+1 pairs of a down forward and an up forward: the first microbatches
  //    reach this rank on their way back up.
  for (int i = 0; i < rank + 1; ++i) {
    o.forward(down);
    o.forward(up);
  }
  // 3. p-1-r times: the up stage's input gradient (sent down at once), its
  //    weight gradient, and the next up forward.
  for (int i = 0; i < below; ++i) {
    o.input_backward(up);
    o.weight_backward();
    o.forward(up);
  }
  // 4. The main phase, m - 2p + r + 1 times two F&B pairs: a down forward
  //    with an up backward, then an up forward with a down backward.
  for (int i = 0; i < microbatches - 2 * ranks + rank + 1; ++i) {
    o.forward(down);
    o.backward(up);
    o.forward(up);
    o.backward(down);
  }
  // 5. p-1-r times: an up backward, then the last up forwards each with a
  //    down backward.
  for (int i = 0; i < below; ++i) {
    o.backward(up);
    o.forward(up);
    o.backward(down);
  }
  // 6. r+1 pairs of an up and a down backward; from the middle pair on (its
  //    down half on even ranks, both halves on odd ones) only the input
  //    gradient, the weight gradients owed to fill the cool-down.
  bool split = false;
  for (int i = 0; i < rank + 1; ++i) {
    if (i == (rank + 1) / 2 && rank % 2 == 1) split = true;
    split ? o.input_backward(up) : o.backward(up);
    if (i == (rank + 1) / 2 && rank % 2 == 0) split = true;
    split ? o.input_backward(down) : o.backward(down);
  }
  // 7. p-1-r times: a weight gradient owed, then the next down input gradient.
  for (int i = 0; i < below; ++i) {
    o.weight_backward();
    o.input_backward(down);
  }
  // 8. The r+1 weight gradients still owed.
  for (int i = 0; i < rank + 1; ++i) o.weight_backward();
  return std::move(o).take();
}

}  // namespace

Schedule dualpipev(int ranks, int microbatches) {
  if (ranks < 2)
    throw ValueError(
        fmt::format("[pipeline] dualpipev: {} ranks; dualpipev needs p >= 2 (on one rank the V folds "
                    "onto itself)",
                    ranks));
  if (microbatches < 2 * ranks)
    throw ValueError(
        fmt::format("[pipeline] dualpipev: {} microbatches on {} ranks; dualpipev needs m >= 2p (here {}): rank r's "
                    "warm-up runs 2(p-1-r) + r + 1 down-stage forwards, 2p-1 on rank 0, and then a main phase of "
                    "m - 2p + r + 1 F&B steps, at least one on every rank (DeepSeek's and PyTorch's DualPipeV ask "
                    "the same)",
                    microbatches, ranks, 2 * ranks));
  Schedule schedule;
  schedule.name = "dualpipev";
  schedule.stages = 2 * ranks;
  schedule.microbatches = microbatches;
  schedule.stages_of_rank = v_placement(ranks);
  schedule.actions.resize(ranks);
  for (int rank = 0; rank < ranks; ++rank) schedule.actions[rank] = rank_order(ranks, microbatches, rank);
  return schedule;
}

}  // namespace dtensor::nn::pipeline
