// Domino's tensor-parallel overlap (Wang et al., "Domino: Eliminating
// Communication in LLM Training via Generic Tensor Slicing and
// Overlapping", 2024): the batch rows split into chunks (two by default)
// that run the blocks in turn, each chunk's collectives started at the
// plan's points and waited for when that chunk next needs them, so they
// move under the other chunks' computation. start_redistribute mirrors the
// overlap in the backward.
//
// A block is six stages per chunk; four end at one of the plan's block
// points, where a collective may start:
//   0  the residual add of the block before (its MLP output, waited for),
//      then ln1                                        -> AttentionInput
//   1  q, k, v and the attention
//   2  the output projection's GEMM                    -> AttentionOutput
//   3  + its bias + the residual, then ln2             -> MlpInput
//   4  the MLP's first GEMM and GELU
//   5  the output projection's GEMM                    -> MlpOutput
// The chunks run as a wavefront, each one stage behind the one before: in
// time slot s, chunk c runs its stage s - c. So a collective that chunk 0
// starts after its stage k moves under chunk 1's stage k - 1, and chunk
// 1's under chunk 0's stage k + 1: a collective after a layer norm (tp_sp's
// all_gathers) lies under a GEMM of the other chunk, not under its layer
// norm, as it would if they ran in step. The order is fixed, so every rank
// starts the same calls in the same order. The expressions are the unsplit
// Block's: a chunk computes what the unsplit block computes on its rows.
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

// A stage's output on its way to the next stage: started towards a point's
// layout where the plan asks for another there, else as it is (with no
// node, as at_point: under tp the residual stream's gradient then stays
// Partial through a block input, and its one all_reduce per point is the
// output point's, as unsplit).
class AtPoint {
 public:
  AtPoint(const DTensor& x, const ActivationLayouts& layouts, Point p, bool started) {
    if (const auto& want = layouts[p]; want && x.placements() != *want)
      moving_.emplace(start_redistribute(x, *want, started));
    else
      ready_.emplace(x);
  }
  /// Between two stages with no point between them.
  explicit AtPoint(const DTensor& x) : ready_(x) {}
  DTensor wait() { return moving_ ? moving_->wait() : *ready_; }

 private:
  std::optional<StartedRedistribute> moving_;
  std::optional<DTensor> ready_;
};

DTensor plus_bias(const DTensor& y, const Linear<DTensor>& linear) { return linear.bias ? add(y, *linear.bias) : y; }

struct Chunk {
  DTensor residual;                // the block's input, then its attention residual
  std::optional<AtPoint> pending;  // the last stage's output
};

constexpr std::size_t kStages = 6;  // per block

void run_stage(const Block<DTensor>& block, const Block<DTensor>* before, std::size_t stage, Chunk& chunk,
               const ActivationLayouts& layouts, bool started) {
  switch (stage) {
    case 0:
      if (before) chunk.residual = add(chunk.residual, plus_bias(chunk.pending->wait(), before->mlp->proj));
      chunk.pending.emplace(block.ln1(chunk.residual), layouts, Point::AttentionInput, started);
      return;
    case 1: chunk.pending.emplace(block.attn.attend(chunk.pending->wait())); return;
    case 2:
      chunk.pending.emplace(linear(chunk.pending->wait(), block.attn.proj.weight), layouts, Point::AttentionOutput,
                            started);
      return;
    case 3:
      chunk.residual = add(chunk.residual, plus_bias(chunk.pending->wait(), block.attn.proj));
      chunk.pending.emplace(block.ln2(chunk.residual), layouts, Point::MlpInput, started);
      return;
    case 4: chunk.pending.emplace(block.mlp->hidden(chunk.pending->wait())); return;
    default:
      chunk.pending.emplace(linear(chunk.pending->wait(), block.mlp->proj.weight), layouts, Point::MlpOutput, started);
  }
}

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
    throw ValueError(
        fmt::format("[GPT] domino splits each rank's batch rows into {} chunks: a batch of {} over {} "
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

}  // namespace

DTensor domino_logits(const GPT<DTensor>& model, const DTensor& tokens) {
  if (!model.units.empty() || !model.gathered_layouts.empty())
    throw ValueError("[GPT] domino with a fully sharded model; expected tensor (and data) parallelism only");
  for (std::size_t l = 0; l < model.blocks.size(); ++l)
    if (!model.blocks[l].mlp)
      throw ValueError(fmt::format("[GPT] domino with block {}'s mixture of experts; expected dense blocks", l));
  if (model.domino_chunks < 2)
    throw ValueError(fmt::format("[GPT] domino_chunks = {}; expected at least 2", model.domino_chunks));
  const DTensor x = embed_tokens(model.wte, model.wpe, tokens, 0, model.layouts);
  std::vector<Chunk> chunks;
  for (DTensor& rows : split_rows(x, model.domino_chunks)) chunks.push_back(Chunk{std::move(rows), {}});
  // The wavefront: slot s runs stage s - c of each chunk c that has one.
  const std::size_t stages = kStages * model.blocks.size(), n = chunks.size();
  for (std::size_t slot = 0; slot + 1 < stages + n; ++slot)
    for (std::size_t c = 0; c < n; ++c)
      if (slot >= c && slot - c < stages) {
        const std::size_t stage = slot - c, l = stage / kStages;
        run_stage(model.blocks[l], l > 0 ? &model.blocks[l - 1] : nullptr, stage % kStages, chunks[c], model.layouts,
                  model.domino_started);
      }
  std::vector<DTensor> out;
  for (Chunk& chunk : chunks)
    out.push_back(model.blocks.empty()
                      ? chunk.residual
                      : add(chunk.residual, plus_bias(chunk.pending->wait(), model.blocks.back().mlp->proj)));
  return head_logits(model.ln_f, model.head(model.wte, model.lm_head), join_rows(out), model.layouts);
}

}  // namespace dtensor::nn::detail
