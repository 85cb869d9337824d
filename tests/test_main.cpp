// The one translation unit that defines the Boost.Test module; every suite
// links it so that each file holds only test cases.
#define BOOST_TEST_MODULE dtensor
#include <boost/test/unit_test.hpp>
