#pragma once
// Shared between the pipeline sources, not installed.
#include <string>

#include "dtensor/nn/pipeline.h"

namespace dtensor::nn::pipeline::detail {

/// Runs the schedule with blocking sends (a send completes when its peer
/// reaches the matching receive; a compute action when its inputs exist)
/// and throws a ValueError naming every stuck rank if it cannot finish.
void check_progress(const Schedule& schedule);

/// The ValueError of validate(): "[pipeline] invalid schedule 'NAME': rank R,
/// position P (ACTION): WHAT" and the grid with that cell marked.
[[noreturn]] void fail_at(const Schedule& schedule, int rank, int position, const std::string& what);

}  // namespace dtensor::nn::pipeline::detail
