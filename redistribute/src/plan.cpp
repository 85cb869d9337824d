#include "dtensor/redistribute/plan.h"

#include <algorithm>

#include <fmt/ranges.h>

#include "dtensor/core/detail/heap_bytes.h"

namespace dtensor {

std::string_view step_name(StepKind kind) {
  switch (kind) {
    case StepKind::AllGather: return "all_gather";
    case StepKind::AllReduce: return "all_reduce";
    case StepKind::ReduceScatter: return "reduce_scatter";
    case StepKind::AllToAll: return "all_to_all";
    case StepKind::Exchange: return "exchange";
    case StepKind::Slice: return "slice";
    case StepKind::ZeroFill: return "zero_fill";
    case StepKind::Relabel: return "relabel";
  }
  return "unknown";
}

bool is_local(StepKind kind) {
  return kind == StepKind::Slice || kind == StepKind::ZeroFill || kind == StepKind::Relabel;
}

namespace {
std::size_t heap_bytes(const Layout& l) { return buffer_bytes(l.placements()) + buffer_bytes(l.levels()); }
}  // namespace

std::size_t approx_bytes(const Layout& layout) { return sizeof(Layout) + heap_bytes(layout); }

std::size_t approx_bytes(const Plan& plan) {
  std::size_t n = sizeof(Plan) + buffer_bytes(plan.mesh_shape) + buffer_bytes(plan.global_shape) +
                  heap_bytes(plan.from) + heap_bytes(plan.to) + buffer_bytes(plan.steps) +
                  buffer_bytes(plan.recv_bytes) + (plan.runner_up ? buffer_bytes(plan.runner_up->kinds) : 0);
  for (const PlanStep& s : plan.steps) {
    n += buffer_bytes(s.mesh_dims) + heap_bytes(s.from) + heap_bytes(s.to) + buffer_bytes(s.recv_bytes) +
         buffer_bytes(s.reason) + buffer_bytes(s.blocks);
    for (const ExchangeBlock& b : s.blocks) n += buffer_bytes(b.box.offset) + buffer_bytes(b.box.size);
  }
  return n;
}

std::int64_t PlanStep::max_recv_bytes() const {
  return recv_bytes.empty() ? 0 : *std::max_element(recv_bytes.begin(), recv_bytes.end());
}

std::int64_t Plan::max_recv_bytes() const {
  return recv_bytes.empty() ? 0 : *std::max_element(recv_bytes.begin(), recv_bytes.end());
}

int Plan::num_collectives() const {
  int n = 0;
  for (const PlanStep& s : steps) {
    if (is_local(s.kind)) continue;
    // An exchange in which no rank needs another's data issues no collective.
    if (s.kind == StepKind::Exchange &&
        std::none_of(s.blocks.begin(), s.blocks.end(), [](const ExchangeBlock& b) { return b.src_rank != b.dst_rank; }))
      continue;
    ++n;
  }
  return n;
}

}  // namespace dtensor

fmt::format_context::iterator fmt::formatter<dtensor::PlanStep>::format(const dtensor::PlanStep& s,
                                                                        fmt::format_context& ctx) const {
  return fmt::format_to(ctx.out(), "{} on mesh dims [{}]: {} -> {}, {}, {}", s.kind, fmt::join(s.mesh_dims, ","),
                        s.from, s.to, dtensor::human_bytes(s.max_recv_bytes()), dtensor::human_seconds(s.est_seconds));
}

fmt::format_context::iterator fmt::formatter<dtensor::Plan>::format(const dtensor::Plan& p,
                                                                    fmt::format_context& ctx) const {
  auto out = fmt::format_to(ctx.out(), "plan {} -> {} on mesh {}, tensor {} {}: ", p.from, p.to,
                            fmt::join(p.mesh_shape, "x"), fmt::join(p.global_shape, "x"), p.dtype);
  if (p.steps.empty()) return fmt::format_to(out, "nothing to do");
  out = fmt::format_to(out, "{} step{} ({} collective{}), busiest rank receives {}, {}", p.steps.size(),
                       p.steps.size() == 1 ? "" : "s", p.num_collectives(), p.num_collectives() == 1 ? "" : "s",
                       dtensor::human_bytes(p.max_recv_bytes()), dtensor::human_seconds(p.est_seconds));
  for (std::size_t i = 0; i < p.steps.size(); ++i) {
    out = fmt::format_to(out, "\n  {}. {}", i + 1, p.steps[i]);
    if (!p.steps[i].reason.empty()) out = fmt::format_to(out, "\n     {}", p.steps[i].reason);
  }
  return out;
}
