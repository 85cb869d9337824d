// Domino's tensor-parallel overlap (Wang et al., "Domino: Eliminating
// Communication in LLM Training via Generic Tensor Slicing and
// Overlapping", 2024): the batch rows split into chunks (two by default)
// that run the blocks in turn, each chunk's collectives started at the
// plan's points and waited for when that chunk next needs them, so they
// move under the other chunks' computation. start_redistribute mirrors the overlap in the
// backward.
//
// A block is four stages per chunk, each ending at one of the plan's block
// points:
//   0  the residual add of the block before (its MLP output, waited for),
//      then ln1                                        -> AttentionInput
//   1  attention, then the output projection's GEMM    -> AttentionOutput
//   2  + its bias + the residual, then ln2             -> MlpInput
//   3  the MLP up to its output projection's GEMM      -> MlpOutput
// A chunk runs its stages until one of them starts a collective; then the
// next chunk runs until it starts one, and so on: chunk 0's next stage
// waits for its collective, which moved while the others computed. The
// expressions are the unsplit Block's, so a chunk computes what the
// unsplit block computes on its rows.
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

struct Chunk {
  DTensor residual;                // the block's input, then its attention residual
  std::optional<AtPoint> pending;  // the last stage's output, moving to its point
  std::size_t next_stage = 0;      // over all blocks: block next_stage / 4, its stage next_stage % 4
};

// Each rank's rows of x [B, T, D] in n chunks, as [B/n, T, D] tensors of
// x's layout: row n i + c of the batch goes to chunk c, so that where the
// batch is split over ranks each rank's chunks are its own rows (a rank
// holds whole groups of n) and nothing moves.
std::vector<DTensor> split_rows(const DTensor& x, std::int64_t n) {
  const Shape& shape = x.shape();
  std::int64_t shards = 1;
  for (int m = 0; m < x.mesh().ndim(); ++m)
    if (is_shard(x.placements()[m], 0)) shards *= x.mesh().size(m);
  if (shape[0] % (n * shards) != 0)
    throw ValueError(fmt::format("[GPT] domino splits each rank's batch rows into {} chunks: a batch of {} over {} "
                                 "shard(s) does not split so; expected a batch divisible by {}",
                                 n, shape[0], shards, n * shards));
  const DTensor groups = reshape(x, {shape[0] / n, n, shape[1], shape[2]});
  std::vector<DTensor> out;
  for (std::int64_t c = 0; c < n; ++c)
    out.push_back(reshape(narrow(groups, 1, c, 1), {shape[0] / n, shape[1], shape[2]}));
  return out;
}

DTensor join_rows(const std::vector<DTensor>& chunks) {
  const Shape& shape = chunks[0].shape();
  const auto n = static_cast<std::int64_t>(chunks.size());
  return reshape(stack(std::span<const DTensor>(chunks), 1), {n * shape[0], shape[1], shape[2]});
}

void run_stage(const Block<DTensor>& block, const Block<DTensor>* before, int stage, Chunk& chunk,
               const ActivationLayouts& layouts, bool started) {
  switch (stage) {
    case 0: {
      if (before) chunk.residual = add(chunk.residual, plus_bias(chunk.pending->wait(), before->mlp->proj));
      chunk.pending.emplace(block.ln1(chunk.residual), layouts, Point::AttentionInput, started);
      return;
    }
    case 1: {
      const DTensor y = linear(block.attn.attend(chunk.pending->wait()), block.attn.proj.weight);
      chunk.pending.emplace(y, layouts, Point::AttentionOutput, started);
      return;
    }
    case 2: {
      chunk.residual = add(chunk.residual, plus_bias(chunk.pending->wait(), block.attn.proj));
      chunk.pending.emplace(block.ln2(chunk.residual), layouts, Point::MlpInput, started);
      return;
    }
    default: {
      const DTensor z = linear(block.mlp->hidden(chunk.pending->wait()), block.mlp->proj.weight);
      chunk.pending.emplace(z, layouts, Point::MlpOutput, started);
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
  if (model.domino_chunks < 2)
    throw ValueError(fmt::format("[GPT] domino_chunks = {}; expected at least 2", model.domino_chunks));
  std::vector<Chunk> chunks;
  for (DTensor& rows : split_rows(x, model.domino_chunks)) chunks.push_back(Chunk{std::move(rows), {}});
  // A chunk runs stages until one starts a collective, then the next chunk
  // runs: each started collective moves under the other chunks' stages up
  // to its own next one. Under tp the block inputs move nothing, so each
  // all_reduce lies under the other chunks' attention or MLP.
  const std::size_t stages = 4 * model.blocks.size();
  auto advance = [&](Chunk& chunk) {
    while (chunk.next_stage < stages) {
      const std::size_t l = chunk.next_stage / 4;
      run_stage(model.blocks[l], l > 0 ? &model.blocks[l - 1] : nullptr, static_cast<int>(chunk.next_stage % 4),
                chunk, model.layouts, model.domino_started);
      ++chunk.next_stage;
      if (chunk.pending->moving()) return;
    }
  };
  while (chunks.back().next_stage < stages)
    for (Chunk& chunk : chunks) advance(chunk);
  std::vector<DTensor> out;
  for (Chunk& chunk : chunks)
    out.push_back(model.blocks.empty()
                      ? chunk.residual
                      : add(chunk.residual, plus_bias(chunk.pending->wait(), model.blocks.back().mlp->proj)));
  return head_logits(model.ln_f, model.head(model.wte, model.lm_head), join_rows(out), model.layouts);
}

}  // namespace dtensor::nn::detail
