// The collective suite (tests/collective_cases.cpp) on host buffers, on the
// backend under test: thread ranks, or the processes of an MPI job
// (tests/meson.build runs this binary both ways), over world sizes 1-8;
// then the same suite through the non-blocking forms (start_* and wait).
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <vector>

#include "collective_cases.h"
#include "started_form.h"
#include "support.h"

using namespace dtensor;
namespace bdata = boost::unit_test::data;

namespace host_collectives {

// Under MPI only the job's own size runs.
std::vector<int> runnable_sizes() {
  std::vector<int> out;
  for (int n : comm_test::kWorldSizes)
    if (testing::can_run(n)) out.push_back(n);
  return out;
}

comm_test::Engine host_engine(int n) {
  return {std::string(testing::test_backend()), n, comm_test::Buffers::Host, false,
          [n](comm_test::Failures&, const std::function<void(Communicator&)>& fn) { testing::run_ranks(n, fn); }};
}

// Every call through start_* and an immediate wait.
comm_test::Engine started_engine(int n) {
  return {std::string(testing::test_backend()), n, comm_test::Buffers::Host, false,
          [n](comm_test::Failures&, const std::function<void(Communicator&)>& fn) {
            testing::run_ranks(n, [&](Communicator& comm) {
              comm_test::StartedForm started(comm);
              fn(started);
            });
          }};
}

}  // namespace host_collectives

BOOST_AUTO_TEST_SUITE(collectives)

#define HOST_COLLECTIVE_CASE(name)                                                 \
  BOOST_DATA_TEST_CASE(name, bdata::make(host_collectives::runnable_sizes()), n) { \
    comm_test::name(host_collectives::host_engine(n));                             \
  }
COLLECTIVE_CASES(HOST_COLLECTIVE_CASE)

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(started_collectives)

#define STARTED_COLLECTIVE_CASE(name)                                              \
  BOOST_DATA_TEST_CASE(name, bdata::make(host_collectives::runnable_sizes()), n) { \
    comm_test::name(host_collectives::started_engine(n));                          \
  }
COLLECTIVE_CASES(STARTED_COLLECTIVE_CASE)

BOOST_AUTO_TEST_SUITE_END()
