#pragma once
// What the trainer's two loops (trainer.cpp, pipeline_trainer.cpp) share, not
// installed: a step's collectives by phase as TrainResult::comm lists them,
// a scalar's value, the plan's optimizer-state layouts, a checkpoint's names.
#include <map>
#include <string>
#include <vector>

#include <dtensor/dtensor.h>
#include <dtensor/nn/parallel_plan.h>

#include "dtensor/train/trainer.h"

namespace dtensor::train::detail {

// The optimizer states where `plan` keeps them (zero1: S(0) over dp); none
// where every state is in its parameter's layout.
inline std::vector<Layout> plan_state_layouts(const nn::ParallelPlan& plan, const nn::NamedParameters<DTensor>& named) {
  std::vector<Layout> out;
  bool moved = false;
  for (const auto& [name, p] : named) {
    out.push_back(plan.state_layout(name));
    moved = moved || out.back() != plan.parameter_layout(name);
  }
  return moved ? out : std::vector<Layout>{};
}

// A checkpoint's count of the steps it was saved after.
inline constexpr const char* kStepsDone = "train.steps_done";

// A scalar's value (a loss, a sampled token), whole.
inline double first_value(const Tensor& t) { return t.to(DType::Float64).data_as<double>()[0]; }
inline double first_value(const DTensor& t) { return first_value(t.full_tensor()); }

// A rank's collective counters by the mesh dims they ran over.
using DimsStats = std::map<std::vector<int>, CommStats>;

inline DimsStats operator-(const DimsStats& after, const DimsStats& before) {
  DimsStats out;
  for (const auto& [dims, stats] : after) {
    const auto it = before.find(dims);
    out[dims] = it == before.end() ? stats : stats - it->second;
  }
  return out;
}
inline DimsStats operator+(const DimsStats& a, const DimsStats& b) {
  DimsStats out = a;
  for (const auto& [dims, stats] : b) out[dims] = out.count(dims) ? out[dims] + stats : stats;
  return out;
}

inline DimsStats mesh_stats(const DeviceMesh& mesh) {
  DimsStats out;
  for (auto& group : mesh.group_stats()) out[group.mesh_dims] = group.stats;
  return out;
}

// Appends `used`'s data-moving collectives to `out` under `phase`, each
// with the names of the mesh dims it ran over.
inline void add_phase(std::vector<PhaseComm>& out, const char* phase, const DimsStats& used,
                      const std::vector<std::string>& names) {
  for (const auto& [dims, stats] : used) {
    std::vector<std::string> dim_names;
    for (int d : dims) dim_names.push_back(names.at(static_cast<std::size_t>(d)));
    for (int k = 0; k < kNumCollectiveKinds; ++k) {
      const auto kind = static_cast<CollectiveKind>(k);
      if (kind == CollectiveKind::Barrier || kind == CollectiveKind::Split || stats.count(kind) == 0) continue;
      out.push_back({phase, std::string(collective_name(kind)), dim_names, stats.count(kind),
                     stats.bytes_by_kind[static_cast<std::size_t>(k)]});
    }
  }
}

}  // namespace dtensor::train::detail
