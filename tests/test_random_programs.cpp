// Random programs: seeded chains of 10 to 30 ops on DTensors of random
// layouts (redistributed at random points too) agree with the same chain on
// full tensors. The chain stays on square n x n float64 matrices so that
// every op applies at every step; values stay bounded (tanh, sigmoid,
// scaled matmuls) so a 1e-9 tolerance is meaningful.
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <mutex>

#include "random_programs.h"
#include "support.h"

using namespace dtensor;
using namespace random_programs;

BOOST_AUTO_TEST_SUITE(programs)

// Under MPI, the meshes of the job's size (see backend_meshes).
const std::vector<Shape> kProgramMeshes = testing::backend_meshes({{4}, {2, 2}, {2, 3}});

BOOST_DATA_TEST_CASE(random_chains_match_the_unsharded_chain, boost::unit_test::data::xrange(kProgramMeshes.size()),
                     mesh_index) {
  const Shape mesh_shape = kProgramMeshes[mesh_index];
  const int programs = 12;
  for (int k = 0; k < programs; ++k) {
    Program p = make_program(0xC0FFEEull + mesh_index * 1000 + k, mesh_shape);
    Tensor x0 = testing::uniform({p.n, p.n}, DType::Float64, p.seed);
    // The chain on full tensors.
    Tensor want = x0;
    for (const Step& s : p.steps) {
      if (s.op == "redistribute") continue;
      want = s.operand >= 0 ? call_op(s.op, {want, p.operands[s.operand]}, s.attrs) : call_op(s.op, {want}, s.attrs);
    }
    Tensor got;
    std::string error;
    std::mutex mu;
    try {
      testing::run_ranks(static_cast<int>(numel(mesh_shape)), [&](Communicator& comm) {
        DeviceMesh mesh(comm, mesh_shape);
        DTensor x = DTensor::from_local(slice_box(x0, local_box(mesh_shape, x0.shape(), p.start, mesh.coordinate())),
                                        mesh, p.start, x0.shape());
        for (const Step& s : p.steps) {
          if (s.op == "redistribute") {
            x = x.redistribute(s.reshard);
          } else if (s.operand >= 0) {
            const Tensor& b = p.operands[s.operand];
            const Layout& bl = p.operand_layouts[s.operand];
            DTensor y = DTensor::from_local(testing::source_shard(b, mesh_shape, bl, mesh.coordinate(), p.seed + 7),
                                            mesh, bl, b.shape());
            x = call_op(s.op, {x, y}, s.attrs);
          } else {
            x = call_op(s.op, {x}, s.attrs);
          }
        }
        Tensor full = x.full_tensor();
        if (testing::reports_results(comm)) {
          std::lock_guard lock(mu);
          got = full;
        }
      });
    } catch (const std::exception& e) {
      error = e.what();
    }
    BOOST_TEST_CONTEXT(describe(p)) {
      BOOST_TEST(error.empty(), error);
      if (error.empty()) BOOST_TEST(allclose(got, want, 1e-9, 1e-9), "max |diff| " << max_abs_diff(got, want));
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
