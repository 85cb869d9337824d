// Domino's tensor-parallel overlap (Wang et al., "Domino: Eliminating
// Communication in LLM Training via Generic Tensor Slicing and
// Overlapping", 2024): the batch rows split into two halves that run the
// blocks in turn, each half's collectives started at the plan's points and
// waited for when that half next needs them, so they move under the other
// half's computation. start_redistribute mirrors the overlap in the
// backward.
//
// A block is four stages per half, each ending at one of the plan's block
// points:
//   0  the residual add of the block before (its MLP output, waited for),
//      then ln1                                        -> AttentionInput
//   1  attention, then the output projection's GEMM    -> AttentionOutput
//   2  + its bias + the residual, then ln2             -> MlpInput
//   3  the MLP up to its output projection's GEMM      -> MlpOutput
// A half runs its stages until one of them starts a collective; then the
// other half runs until it starts one, and so on: half 0's next stage
// waits for its collective, which moved while half 1 computed. The
// expressions are the unsplit Block's, so a half computes what the unsplit
// block computes on its rows.
#include <fmt/format.h>

#include "dtensor/api/coalesced.h"
#include "dtensor/api/linalg.h"
#include "dtensor/api/pointwise.h"
#include "dtensor/api/shape_ops.h"
#include "dtensor/core/error.h"
#include "dtensor/nn/gpt_pieces.h"
#include "dtensor/nn/modules.h"

namespace dtensor::nn::detail {
namespace {

// A value on its way to a point's layout: started where the plan asks for
// another, else already there (with no node, as at_point: under tp the
// residual stream's gradient then stays Partial through a block input, and
// its one all_reduce per point is the output point's, as unsplit).
class AtPoint {
 public:
  AtPoint(const DTensor& x, const ActivationLayouts& layouts, Point p, bool started) {
    if (const auto& want = layouts[p]; want && x.placements() != *want)
      moving_.emplace(start_redistribute(x, *want, started));
    else
      ready_.emplace(x);
  }
  DTensor wait() { return moving_ ? moving_->wait() : *ready_; }
  /// Whether a collective was started (else the value is where it belongs).
  bool moving() const { return moving_.has_value(); }

 private:
  std::optional<StartedRedistribute> moving_;
  std::optional<DTensor> ready_;
};

DTensor plus_bias(const DTensor& y, const Linear<DTensor>& linear) { return linear.bias ? add(y, *linear.bias) : y; }

struct Half {
  DTensor residual;                // the block's input, then its attention residual
  std::optional<AtPoint> pending;  // the last stage's output, moving to its point
  std::size_t next_stage = 0;      // over all blocks: block next_stage / 4, its stage next_stage % 4
};

// Each rank's rows of x [B, T, D] in two halves, as [B/2, T, D] tensors of
// x's layout: rows 2i and 2i + 1 of the batch go to halves 0 and 1, so that
// where the batch is split over ranks each rank's halves are its own rows
// (a rank holds whole pairs) and nothing moves.
std::array<DTensor, 2> split_rows(const DTensor& x) {
  const Shape& shape = x.shape();
  std::int64_t shards = 1;
  for (int m = 0; m < x.mesh().ndim(); ++m)
    if (is_shard(x.placements()[m], 0)) shards *= x.mesh().size(m);
  if (shape[0] % (2 * shards) != 0)
    throw ValueError(fmt::format("[GPT] domino splits each rank's batch rows into two halves: a batch of {} over {} "
                                 "shard(s) is not {} even parts; expected a batch divisible by {}",
                                 shape[0], shards, shards, 2 * shards));
  const DTensor pairs = reshape(x, {shape[0] / 2, 2, shape[1], shape[2]});
  return {reshape(narrow(pairs, 1, 0, 1), {shape[0] / 2, shape[1], shape[2]}),
          reshape(narrow(pairs, 1, 1, 1), {shape[0] / 2, shape[1], shape[2]})};
}

DTensor join_rows(const std::array<DTensor, 2>& halves) {
  const Shape& shape = halves[0].shape();
  return reshape(stack({halves[0], halves[1]}, 1), {2 * shape[0], shape[1], shape[2]});
}

void run_stage(const Block<DTensor>& block, const Block<DTensor>* before, int stage, Half& half,
               const ActivationLayouts& layouts, bool started) {
  switch (stage) {
    case 0: {
      if (before) half.residual = add(half.residual, plus_bias(half.pending->wait(), before->mlp->proj));
      half.pending.emplace(block.ln1(half.residual), layouts, Point::AttentionInput, started);
      return;
    }
    case 1: {
      const DTensor y = linear(block.attn.attend(half.pending->wait()), block.attn.proj.weight);
      half.pending.emplace(y, layouts, Point::AttentionOutput, started);
      return;
    }
    case 2: {
      half.residual = add(half.residual, plus_bias(half.pending->wait(), block.attn.proj));
      half.pending.emplace(block.ln2(half.residual), layouts, Point::MlpInput, started);
      return;
    }
    default: {
      const DTensor z = linear(block.mlp->hidden(half.pending->wait()), block.mlp->proj.weight);
      half.pending.emplace(z, layouts, Point::MlpOutput, started);
    }
  }
}

}  // namespace

DTensor domino_logits(const GPT<DTensor>& model, const DTensor& tokens) {
  if (!model.units.empty() || !model.gathered_layouts.empty())
    throw ValueError("[GPT] domino with a fully sharded model; expected tensor (and data) parallelism only");
  for (std::size_t l = 0; l < model.blocks.size(); ++l)
    if (!model.blocks[l].mlp)
      throw ValueError(fmt::format("[GPT] domino with block {}'s mixture of experts; expected dense blocks", l));
  const DTensor x = embed_tokens(model.wte, model.wpe, tokens, 0, model.layouts);
  const std::array<DTensor, 2> rows = split_rows(x);
  std::array<Half, 2> halves{Half{rows[0], {}}, Half{rows[1], {}}};
  // A half runs stages until one starts a collective, then the other half
  // runs: each started collective moves under the other half's stages up
  // to its own next one. Under tp the block inputs move nothing, so each
  // all_reduce lies under the other half's attention or MLP.
  const std::size_t stages = 4 * model.blocks.size();
  auto advance = [&](Half& half) {
    while (half.next_stage < stages) {
      const std::size_t l = half.next_stage / 4;
      run_stage(model.blocks[l], l > 0 ? &model.blocks[l - 1] : nullptr, static_cast<int>(half.next_stage % 4), half,
                model.layouts, model.domino_started);
      ++half.next_stage;
      if (half.pending->moving()) return;
    }
  };
  while (halves[0].next_stage < stages || halves[1].next_stage < stages)
    for (Half& half : halves) advance(half);
  std::array<DTensor, 2> out = rows;
  for (std::size_t h = 0; h < 2; ++h)
    out[h] = model.blocks.empty()
                 ? halves[h].residual
                 : add(halves[h].residual, plus_bias(halves[h].pending->wait(), model.blocks.back().mlp->proj));
  return head_logits(model.ln_f, model.head(model.wte, model.lm_head), join_rows(out), model.layouts);
}

}  // namespace dtensor::nn::detail
