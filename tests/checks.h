#pragma once
// Assertions shared by the suites.
#include <boost/test/unit_test.hpp>

#include <string>

namespace dtensor::testing {

/// Checks that fn() throws E and that the message contains `needle` (the
/// bad value it must name).
template <class E, class Fn>
void check_throws(Fn&& fn, const std::string& needle) {
  try {
    fn();
    BOOST_ERROR("expected an exception mentioning '" << needle << "'");
  } catch (const E& e) {
    BOOST_TEST(std::string(e.what()).find(needle) != std::string::npos,
               "message '" << e.what() << "' lacks '" << needle << "'");
  }
}

}  // namespace dtensor::testing
