#pragma once
// Shared by the planner's and the executor's tests (test_planner.cpp,
// test_executor.cpp).
#include <boost/test/unit_test.hpp>

#include <ostream>
#include <string>
#include <vector>

#include <fmt/ranges.h>

#include "dtensor/core/placement.h"
#include "dtensor/redistribute/planner.h"

// Boost.Test prints failing values with operator<<; ours speak fmt.
namespace dtensor {
inline std::ostream& boost_test_print_type(std::ostream& os, const Layout& l) { return os << fmt::format("{}", l); }
inline std::ostream& boost_test_print_type(std::ostream& os, StepKind k) { return os << step_name(k); }
inline std::ostream& boost_test_print_type(std::ostream& os, const Box& b) { return os << fmt::format("{}", b); }
}  // namespace dtensor
namespace std {
inline std::ostream& boost_test_print_type(std::ostream& os, const std::vector<std::int64_t>& v) {
  return os << fmt::format("[{}]", fmt::join(v, ","));
}
}  // namespace std

namespace planner_test {

using namespace dtensor;

inline Plan make_plan(const Shape& mesh, const Shape& shape, const std::string& from, const std::string& to,
                      DType dtype = DType::Float32, CostModel cost = {}) {
  return plan_redistribute(PlanRequest{mesh, shape, dtype, Layout::parse(from), Layout::parse(to), cost});
}

}  // namespace planner_test
