// Known answers for propagation: strategies chosen and collectives issued.
#include <boost/test/unit_test.hpp>
