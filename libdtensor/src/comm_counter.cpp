#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm_stats.h"
#include "dtensor/api/functional.h"
#include "dtensor/core/units.h"

namespace dtensor {

std::vector<GroupStats> detail::stats_since(std::vector<GroupStats> now, const std::vector<GroupStats>& start) {
  auto from = start.begin();
  for (auto& group : now) {
    while (from != start.end() && from->mesh_dims < group.mesh_dims) ++from;
    if (from != start.end() && from->mesh_dims == group.mesh_dims) group.stats = group.stats - from->stats;
  }
  return now;
}

std::vector<DimsCount> detail::dims_counts(const std::vector<GroupStats>& groups,
                                           const std::vector<std::string>& names) {
  std::vector<DimsCount> out;
  for (const auto& group : groups) {
    for (int k = 0; k < kNumCollectiveKinds; ++k) {
      if (group.stats.calls[k] == 0) continue;
      DimsCount c{group.mesh_dims,
                  {},
                  static_cast<CollectiveKind>(k),
                  group.stats.calls[k],
                  group.stats.bytes_by_kind[k]};
      if (!names.empty())
        for (int d : group.mesh_dims) c.dim_names.push_back(names[static_cast<std::size_t>(d)]);
      out.push_back(std::move(c));
    }
  }
  return out;
}

std::vector<GroupStats> CommCounterByDims::since_start() const {
  return detail::stats_since(mesh_.group_stats(), start_);
}

std::vector<DimsCount> CommCounterByDims::counts() const {
  return detail::dims_counts(since_start(), mesh_.dim_names());
}

std::uint64_t CommCounterByDims::count(std::span<const int> mesh_dims, CollectiveKind kind) const {
  std::vector<int> dims(mesh_dims.begin(), mesh_dims.end());
  std::sort(dims.begin(), dims.end());
  for (const auto& group : since_start())
    if (group.mesh_dims == dims) return group.stats.count(kind);
  return 0;
}

}  // namespace dtensor

fmt::format_context::iterator fmt::formatter<dtensor::DimsCount>::format(const dtensor::DimsCount& c,
                                                                         fmt::format_context& ctx) const {
  auto out = c.dim_names.empty() ? fmt::format_to(ctx.out(), "[{}]", fmt::join(c.mesh_dims, ","))
                                 : fmt::format_to(ctx.out(), "[{}]", fmt::join(c.dim_names, ","));
  return fmt::format_to(out, " {} x{} ({})", c.kind, c.count, dtensor::human_bytes(static_cast<std::int64_t>(c.bytes)));
}
