#pragma once
// Training the byte-level GPT on a text, on plain tensors (one rank) or on
// DTensors under a parallel plan: the loop that examples/train_gpt.cpp runs
// and the tests compare across meshes and plans.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <dtensor/dtensor.h>
#include <dtensor/nn/modules.h>
#include <dtensor/nn/optim.h>
#include <dtensor/nn/pipeline.h>

#include "dtensor/train/text_data.h"

namespace dtensor::train {

struct TrainOptions {
  dtensor::nn::GPTConfig model;
  dtensor::Shape mesh;             // empty: plain tensors on one rank
  std::vector<std::string> dims;   // mesh dim names
  std::vector<std::string> plans;  // one plan per mesh dim
  std::int64_t batch = 8;          // sequences per micro-batch (all ranks together)
  std::int64_t micro_batches = 1;  // gradients accumulated, one optimizer step
  std::int64_t steps = 20;
  std::int64_t warmup = 0;          // steps of linear warmup before the cosine
  std::int64_t schedule_steps = 0;  // the learning-rate schedule's length (0: steps)
  /// Saves the model and optimizer here after the last step (a checkpoint
  /// any mesh and plan can resume from).
  std::string save_dir;
  /// Resumes from this checkpoint: its parameters, moments and step count;
  /// the run continues from the saved step up to `steps`.
  std::string resume_dir;
  double lr = 1e-3;
  double weight_decay = 0.0;
  double clip = 0.0;  // max gradient norm; 0: no clipping
  std::uint64_t seed = 1;
  std::int64_t val_batches = 2;
  std::int64_t eval_every = 0;  // validation loss every this many steps (0: at the end only)
  std::int64_t generate = 0;    // bytes to sample greedily after training
  bool explain = false;         // print rank 0's dispatch decisions during the last step
  /// The gradients' reduction (DDP's all_reduce, ZeRO-1's reduce_scatter)
  /// started bucket by bucket during the backward
  /// (nn::OverlappedGradientReduction); on meshes whose plans are ddp,
  /// zero1, tp or tp_sp only.
  bool overlap_grad_reduce = false;
  /// zero1: the all_gather of the updated parameters overlapped with the
  /// next forward, each bucket waited for by the first op that reads one of
  /// its parameters (ShardingOptions::overlap_parameter_gather; Megatron's
  /// --overlap-param-gather). Its calls then count in the next forward.
  bool overlap_param_gather = false;
  /// fsdp: the next block's unit gathered while this block computes, in
  /// the forward and the backward (nn::GPT::prefetch_units).
  bool prefetch_units = true;
  /// fsdp: each block's reduce_scatter run under the block before's
  /// backward (nn::GPT::overlap_unit_reduce).
  bool overlap_unit_reduce = true;
  /// fsdp: each block's unit freed after its forward and gathered again
  /// for its recomputed backward (nn::GPT::reshard_after_forward); off,
  /// kept gathered from the forward to the backward.
  bool reshard_after_forward = true;
  /// tp, tp_sp: Domino's overlap, each rank's batch rows in chunks (two
  /// by default) whose tensor-parallel collectives run under each other's
  /// computation (nn::GPT::domino, nn::GPT::domino_chunks).
  bool domino = false;
  std::int64_t domino_chunks = 2;
  /// With domino, off: the same chunks and calls, each waited for at once
  /// (nn::GPT::domino_started; the reference an overlapped run equals).
  bool domino_started = true;
  /// The most bytes any rank may hold at once (MemoryAccount's: tensors
  /// charged to the rank); an allocation past it is an OutOfBudget naming
  /// the rank. 0: DTENSOR_MEMORY_BUDGET's, else none.
  std::size_t memory_budget = 0;
  /// The buckets the gradients are reduced in, overlapped or not (DDP's
  /// bucket_cap_mb and first bucket, nn::gradient_buckets()).
  CoalesceOptions gradient_buckets = nn::gradient_buckets();
  /// Records the last step as a Chrome trace in this file (every rank's ops
  /// and collectives; runs on a mesh only).
  std::string trace;
  /// The text: an explicit path, else the fetched cache, else the slice.
  std::string text;
  /// Pipeline parallelism, where a mesh dim's plan is "pp": the schedule's
  /// name (nn::pipeline::make_schedule: gpipe, 1f1b, interleaved, zb-h1,
  /// zbv, dualpipev), the stages per pp rank (interleaved; zbv's and
  /// dualpipev's is 2), and the blocks per stage (empty: an even split).
  std::string schedule = "1f1b";
  std::int64_t virtual_stages = 1;
  std::vector<std::int64_t> layer_split;
};

/// The collectives of one phase of a step, as this rank counted them.
struct PhaseComm {
  std::string phase;  // "forward", "backward", "optimizer"
  std::string kind;   // collective_name()
  std::vector<std::string> mesh_dims;
  std::uint64_t count = 0, bytes = 0;
};

struct TrainResult {
  std::int64_t first_step = 0;  // the step losses[0] belongs to (after a resume: the saved step)
  std::vector<double> losses;   // one per step run (the mean over its micro-batches)
  double val_loss = 0;
  std::vector<std::pair<std::int64_t, double>> val_points;  // (step, validation loss), the last at the end
  std::vector<PhaseComm> comm;                              // the last step's
  double tokens_per_second = 0;                             // over the steps after the first (which fills the caches)
  /// Bytes of this rank's parameters, gradients and optimizer states; the
  /// largest over the ranks.
  std::uint64_t parameter_bytes = 0, gradient_bytes = 0, optimizer_state_bytes = 0;
  /// The most tensor bytes this rank held at once during the last step:
  /// the above, activations kept for the backward, temporaries and buffers
  /// of collectives (MemoryAccount); the largest over the ranks.
  std::uint64_t peak_bytes = 0;
  std::string generated;
  /// A pipelined run's (plan "pp"): the lowered schedule every rank ran, and
  /// the bubble of its last step as measured (each rank's time outside its
  /// F, B, I and W over the step's, averaged over every rank of the mesh).
  std::optional<nn::pipeline::Schedule> schedule;
  double bubble_fraction = 0;
  /// With mixture-of-experts blocks, the last step's: the assignments routed
  /// to each expert (one row per MoE block, summed over the micro-batches),
  /// those dropped over capacity, and the balancing losses (the last
  /// micro-batch's, summed over the MoE blocks).
  std::vector<std::vector<std::int64_t>> expert_load;
  std::int64_t dropped = 0;
  double aux_loss = 0, z_loss = 0;
};

/// The lowered schedule every rank of a pipelined run (a mesh dim with plan
/// "pp") executes on a mesh of `mesh_shape`, checked before any rank sends
/// anything: a ValueError naming the value that cannot be scheduled or
/// split (1f1b with fewer micro-batches than pp ranks, fewer blocks than
/// stages, ...), an UnsupportedError naming what pipelined training does not
/// do yet (mixture of experts). None
/// when no dim has plan "pp".
std::optional<nn::pipeline::Schedule> pipeline_schedule(const TrainOptions& options, const Shape& mesh_shape);

/// Called on rank 0 after each step.
using StepCallback = std::function<void(std::int64_t step, double loss, double seconds)>;

/// Trains on plain tensors (`world` null, or options.mesh empty) or on
/// DTensors on a mesh of `world`. Every rank calls it and gets the same
/// losses. ValueError naming the value for a plan that does not fit.
TrainResult train(const TrainOptions& options, const TextData& data, dtensor::Communicator* world,
                  const StepCallback& on_step = {});

}  // namespace dtensor::train
