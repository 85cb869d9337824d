#pragma once
// Internal: collective steps that fail together. A step that throws on one
// rank would leave the others waiting in the next collective until its
// deadline; instead every step ends in one exchange of outcomes, and every
// rank throws: the failing rank its own error, the others a CheckpointError
// naming that rank and its message.
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/mesh/communicator.h"

namespace dtensor::dcp {

/// Runs `step` on this rank, then agrees with the others (null comm: alone).
void agree(Communicator* comm, std::string_view what, const std::function<void()>& step);

/// Every rank's `text`, in rank order (null comm: just this one).
std::vector<std::string> gather_texts(Communicator* comm, const std::string& text);

}  // namespace dtensor::dcp
