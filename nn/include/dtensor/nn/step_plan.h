#pragma once
// The plan of a whole training step written as one string (the mesh, one
// plan per dim, micro-batches, the pipeline schedule), and the rules it
// must satisfy to run, each named and reported all at once.
//
//   nn::StepPlan s = nn::StepPlan::parse("dp2.zero1,tp2.sp,mb4");
//   s.str();                                   // "dp2.zero1,tp2.sp,mb4"
//   for (const nn::Violation& v : nn::validate(s, config, batch, world))
//     fmt::print("{}: {}\n", v.rule, v.message);   // e.g. "HEADS: [plan] heads = 6 is not divisible ..."
//
// The grammar, items separated by commas:
//   NAME SIZE . PLAN      a mesh dim: its name (letters and '_'), its size,
//                         and its plan: ddp, zero1, fsdp, tp, sp (tp with
//                         sequence parallelism, also written tp_sp) or ep
//   NAME SIZE . SCHEDULE [. vV]
//                         a pipeline dim: the schedule (gpipe, 1f1b,
//                         interleaved, zb-h1, zbv, dualpipev) and V stages
//                         per rank where more than 1
//   mbM                   M micro-batches per step (1 where absent)
// The mesh is the dims in the order written. str() writes the parsed form
// back: sp for tp_sp, a pipeline dim's schedule always, v and mb only where
// they are not 1, so that parse(s.str()) == s.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/core/shape.h"
#include "dtensor/nn/modules.h"
#include "dtensor/nn/parallel_plan.h"

namespace dtensor::nn {

struct StepPlanDim {
  std::string name;       // "dp", "tp", ...
  std::int64_t size = 1;  // ranks along it
  std::string plan;       // plan_named()'s name: ddp, zero1, fsdp, tp, tp_sp, ep, pp
  bool operator==(const StepPlanDim&) const = default;
};

struct StepPlan {
  std::vector<StepPlanDim> dims;
  std::int64_t micro_batches = 1;
  std::string schedule = "1f1b";    // where a dim's plan is pp
  std::int64_t virtual_stages = 1;  // pipeline stages per pp rank

  /// ParseError naming the text and the item that does not parse.
  static StepPlan parse(std::string_view text);
  std::string str() const;
  Shape mesh() const;
  std::vector<std::string> dim_names() const;
  std::vector<std::string> plans() const;
  bool operator==(const StepPlan&) const = default;
};

/// Every rule `plan` breaks for a GPT of `config` trained on `batch`
/// sequences per micro-batch on `world` ranks (WORLD, NAMES, then
/// plan_violations', then the pipeline schedule's, PP); empty: it runs. It runs the checks the
/// trainer runs before a step (plan_violations, the pipeline schedule's
/// own), all of them, and builds nothing.
std::vector<Violation> validate(const StepPlan& plan, const GPTConfig& config, std::int64_t batch, std::int64_t world);

}  // namespace dtensor::nn
