// StepPlan strings, and validate(): every rule a strategy breaks.
#include "dtensor/nn/step_plan.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtensor/core/error.h"
#include "dtensor/nn/pipeline.h"
#include "dtensor/nn/pipeline_runtime.h"
#include "dtensor/nn/pipeline_stage.h"

namespace dtensor::nn {
namespace {

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t end = text.find(separator, start);
    out.push_back(text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) return out;
    start = end + 1;
  }
}

// A positive count, all of `digits`; none otherwise.
std::optional<std::int64_t> count_of(std::string_view digits) {
  std::int64_t v = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (digits.empty() || error != std::errc() || end != digits.data() + digits.size() || v < 1) return std::nullopt;
  return v;
}

bool is_schedule(std::string_view name) {
  const std::vector<std::string> names = pipeline::schedule_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

StepPlan StepPlan::parse(std::string_view text) {
  auto fail = [&](std::string_view item, std::string_view why) {
    return ParseError(
        fmt::format("[step plan] '{}': item '{}' {}; expected items such as dp2.zero1, tp4.sp, "
                    "pp2.1f1b, pp2.interleaved.v2 or mb4, separated by commas",
                    text, item, why));
  };
  StepPlan out;
  bool micro_batches_given = false, pipelined = false;
  for (std::string_view item : split(text, ',')) {
    if (item.size() > 2 && item.substr(0, 2) == "mb" && std::isdigit(static_cast<unsigned char>(item[2]))) {
      const auto m = count_of(item.substr(2));
      if (!m) throw fail(item, "has no positive count of micro-batches");
      if (micro_batches_given) throw fail(item, "gives the micro-batches a second time");
      out.micro_batches = *m;
      micro_batches_given = true;
      continue;
    }
    const std::vector<std::string_view> parts = split(item, '.');
    std::size_t digits = 0;
    while (digits < parts[0].size() && !std::isdigit(static_cast<unsigned char>(parts[0][digits]))) ++digits;
    const std::string_view name = parts[0].substr(0, digits);
    const auto name_char = [](char c) { return std::islower(static_cast<unsigned char>(c)) || c == '_'; };
    if (name.empty() || !std::all_of(name.begin(), name.end(), name_char))
      throw fail(item, "does not start with a mesh dim's name (lower-case letters and '_')");
    const auto size = count_of(parts[0].substr(digits));
    if (!size) throw fail(item, "has no positive size after the dim's name");
    if (parts.size() < 2 || parts[1].empty()) throw fail(item, "has no plan after the size");
    StepPlanDim dim{std::string(name), *size, std::string(parts[1])};
    if (dim.plan == "sp") dim.plan = "tp_sp";
    if (is_schedule(dim.plan)) {
      if (pipelined) throw fail(item, "is a second pipeline dim");
      pipelined = true;
      out.schedule = dim.plan;
      dim.plan = "pp";
      if (parts.size() == 3) {
        const auto v = parts[2].size() > 1 && parts[2][0] == 'v' ? count_of(parts[2].substr(1)) : std::nullopt;
        if (!v) throw fail(item, "ends in something other than vV, the stages per rank");
        out.virtual_stages = *v;
      } else if (parts.size() > 3) {
        throw fail(item, "has more than a schedule and vV after the size");
      }
    } else {
      try {
        (void)plan_named(dim.plan);
      } catch (const ValueError&) {
        throw fail(item, fmt::format("names no plan ('{}'; plans: ddp, zero1, fsdp, tp, sp, ep; schedules: {})",
                                     parts[1], fmt::join(pipeline::schedule_names(), ", ")));
      }
      if (dim.plan == "pp") throw fail(item, "names plan pp without its schedule (pp2.1f1b)");
      if (parts.size() > 2) throw fail(item, "has more than a plan after the size");
    }
    out.dims.push_back(std::move(dim));
  }
  if (out.dims.empty()) throw fail(text, "has no mesh dim");
  return out;
}

std::string StepPlan::str() const {
  std::vector<std::string> items;
  for (const StepPlanDim& d : dims) {
    std::string plan = d.plan == "tp_sp" ? "sp" : d.plan == "pp" ? schedule : d.plan;
    if (d.plan == "pp" && virtual_stages != 1) plan += fmt::format(".v{}", virtual_stages);
    items.push_back(fmt::format("{}{}.{}", d.name, d.size, plan));
  }
  if (micro_batches != 1) items.push_back(fmt::format("mb{}", micro_batches));
  return fmt::format("{}", fmt::join(items, ","));
}

Shape StepPlan::mesh() const {
  Shape out;
  for (const StepPlanDim& d : dims) out.push_back(d.size);
  return out;
}

std::vector<std::string> StepPlan::dim_names() const {
  std::vector<std::string> out;
  for (const StepPlanDim& d : dims) out.push_back(d.name);
  return out;
}

std::vector<std::string> StepPlan::plans() const {
  std::vector<std::string> out;
  for (const StepPlanDim& d : dims) out.push_back(d.plan);
  return out;
}

std::vector<Violation> validate(const StepPlan& s, const GPTConfig& config, std::int64_t batch, std::int64_t world) {
  std::vector<Violation> out;
  const Shape mesh = s.mesh();
  if (numel(mesh) != world)
    out.push_back({"WORLD", fmt::format("[step plan] a mesh of {} is {} ranks; the world has {}", fmt::join(mesh, "x"),
                                        numel(mesh), world)});
  std::set<std::string> seen;
  for (const StepPlanDim& d : s.dims)
    if (!seen.insert(d.name).second)
      out.push_back({"NAMES", fmt::format("[step plan] mesh dim '{}' named twice; expected distinct names", d.name)});
  std::vector<DimPlan> per_dim;
  for (const StepPlanDim& d : s.dims) per_dim.push_back(plan_named(d.plan));
  for (Violation& v : plan_violations(per_dim, mesh, config, batch)) out.push_back(std::move(v));
  // The schedule of the pipeline dim (the first, where plan_violations
  // has refused a second), as the trainer makes and checks it.
  const auto pp = std::find_if(s.dims.begin(), s.dims.end(), [](const StepPlanDim& d) { return d.plan == "pp"; });
  if (pp != s.dims.end()) try {
      pipeline::Schedule schedule =
          pipeline::make_schedule(s.schedule, static_cast<int>(pp->size), static_cast<int>(s.micro_batches),
                                  static_cast<int>(s.virtual_stages));
      pipeline::split_layers(config.layers, schedule.stages, {});
      if (pp->size > 1) schedule = pipeline::lower(schedule);
      pipeline::check_runnable(schedule);
    } catch (const UnsupportedError& e) {
      out.push_back({"PP", e.what(), true});
    } catch (const ValueError& e) {
      out.push_back({"PP", e.what()});
    }
  return out;
}

}  // namespace dtensor::nn
