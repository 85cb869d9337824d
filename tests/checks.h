#pragma once
// Assertions shared by the suites.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace dtensor::testing {

// Numbers: every comparison of a computed number in the tests goes through
// these, which treat NaN as a failure. The two forms that let NaN through,
// `if (err > tol) fail` (NaN > tol is false) and `worst = std::max(worst,
// err)` (which keeps `worst` when err is NaN), are not used.

/// error <= tol; false when error is NaN.
inline bool within(double error, double tol) { return error <= tol; }
/// |got - want| <= tol; false when either is NaN.
inline bool close(double got, double want, double tol) { return within(std::abs(got - want), tol); }
/// The worse of two errors, NaN being worse than every number, so a fold over
/// errors ends NaN if any was.
inline double worse(double worst, double error) {
  if (std::isnan(worst) || std::isnan(error)) return std::numeric_limits<double>::quiet_NaN();
  return error > worst ? error : worst;
}

/// True in a build under a sanitizer (ASan, TSan). Such a build runs the
/// code several times slower on a loaded machine, so the tests' wall-clock
/// bounds (a deadline noticed in time) are not asserted there; every other
/// check of those cases still runs, and a hang still fails by the suite's
/// timeout.
constexpr bool sanitized() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return true;
#else
  return false;
#endif
}
/// `seconds` is below `bound`, or the build is sanitized (see sanitized()).
inline bool in_time(double seconds, double bound) { return sanitized() || seconds < bound; }

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
