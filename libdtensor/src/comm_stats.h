#pragma once
// The arithmetic CommCounterByDims and CommTree share: what the groups of a
// mesh counted between two snapshots, as DimsCount lines.
#include <string>
#include <vector>

#include "dtensor/api/functional.h"

namespace dtensor::detail {

/// `now` less `start`, group by group (both sorted by dims, as
/// DeviceMesh::group_stats gives them; a group made after `start` counts
/// from zero).
std::vector<GroupStats> stats_since(std::vector<GroupStats> now, const std::vector<GroupStats>& start);

/// One DimsCount per group and kind with calls, ordered by dims, then kind;
/// `names` are the mesh's dim names (may be empty).
std::vector<DimsCount> dims_counts(const std::vector<GroupStats>& groups, const std::vector<std::string>& names);

}  // namespace dtensor::detail
