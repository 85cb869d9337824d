#pragma once
// The trainer's loop for a pipelined run (a mesh dim with plan "pp"),
// called by train(); not installed.
#include <optional>
#include <string>
#include <vector>

#include "dtensor/train/trainer.h"

namespace dtensor::train::detail {

/// The index of the mesh dim whose plan is "pp"; none if no dim has it.
std::optional<int> pipeline_dim(const std::vector<std::string>& plans);

/// train() on a mesh with a pp dim: each rank holds its stages of the GPT
/// (on the other dims' submesh under their plans, or plain tensors when pp
/// is the only dim) and runs the schedule's actions for each step.
TrainResult train_pipelined(const TrainOptions& options, const TextData& data, Communicator& world,
                            const StepCallback& on_step);

}  // namespace dtensor::train::detail
