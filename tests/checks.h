#pragma once
// Assertions shared by the suites.
#include <boost/test/unit_test.hpp>

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

namespace dtensor::testing {

/// Runs fn() and says what is wrong, if anything: that it threw no E, or
/// that the message lacks one of `needles` (the bad value it must name).
/// Usable on thread ranks, where Boost's assertions are not.
template <class E, class Fn>
std::optional<std::string> throw_problem(Fn&& fn, std::initializer_list<std::string_view> needles) {
  try {
    fn();
  } catch (const E& e) {
    const std::string_view what = e.what();
    for (std::string_view needle : needles)
      if (what.find(needle) == std::string_view::npos)
        return "message '" + std::string(what) + "' lacks '" + std::string(needle) + "'";
    return std::nullopt;
  }
  std::string all;
  for (std::string_view needle : needles) all += (all.empty() ? "" : "', '") + std::string(needle);
  return "expected an exception mentioning '" + all + "'";
}

/// Checks that fn() throws E and that the message contains `needle`.
template <class E, class Fn>
void check_throws(Fn&& fn, const std::string& needle) {
  const std::optional<std::string> problem = throw_problem<E>(fn, {needle});
  BOOST_TEST(!problem.has_value(), problem.value_or(""));
}

}  // namespace dtensor::testing
