// The collective suite (tests/collective_cases.cpp) on device buffers, run
// twice: over an NCCL local group of all visible GPUs (one thread per
// device; one GPU gives a group of one), and over four simulated GPU ranks
// (the threads backend sharing one GPU). Also NCCL's own: its bootstraps'
// checks and a timeout that breaks the communicator (two GPUs or more).
// Cases that need a GPU are skipped, and counted as skipped, in a build
// without CUDA/NCCL or on a machine without a device; what the build says
// about NCCL is checked everywhere.
#include <boost/test/unit_test.hpp>

#include <exception>
#include <functional>
#include <numeric>
#include <thread>
#include <vector>

#include "collective_cases.h"
#include "comm_checks.h"
#include "dtensor/core/cuda.h"
#include "dtensor/mesh/backends.h"
#include "dtensor/mesh/threads.h"
#include "support.h"

using namespace dtensor;
using namespace comm_test;
namespace utf = boost::unit_test;

namespace nccl_test {

boost::test_tools::assertion_result has_nccl_device(utf::test_unit_id) {
  boost::test_tools::assertion_result ok(nccl_available() && cuda::device_count() > 0);
  if (!nccl_available())
    ok.message() << "this build has no NCCL";
  else if (cuda::device_count() == 0)
    ok.message() << "no CUDA device";
  return ok;
}

boost::test_tools::assertion_result has_two_devices(utf::test_unit_id id) {
  auto ok = has_nccl_device(id);
  if (ok && cuda::device_count() < 2) {
    ok = false;
    ok.message() << "needs two CUDA devices, found " << cuda::device_count();
  }
  return ok;
}

std::vector<int> all_devices() {
  std::vector<int> devices(static_cast<std::size_t>(cuda::device_count()));
  std::iota(devices.begin(), devices.end(), 0);
  return devices;
}

// Runs fn(comm) on one thread per communicator of `comms`, each on its own
// device, and ends each communicator on its thread (the ranks finalize
// together); an exception on a rank becomes a failure of that rank.
void run_on(std::vector<std::unique_ptr<Communicator>>& comms, const std::vector<int>& devices, Failures& failures,
            const std::function<void(Communicator&)>& fn) {
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < comms.size(); ++i)
    threads.emplace_back([&, i] {
      try {
        cuda::set_device(devices[i]);
        fn(*comms[i]);
        comms[i].reset();
      } catch (const std::exception& e) {
        failures.add(static_cast<int>(i), fmt::format("threw: {}", e.what()));
      }
    });
  for (auto& t : threads) t.join();
}

// fn over a fresh local group of every device.
void run_group(Failures& failures, const std::function<void(Communicator&)>& fn,
               std::chrono::milliseconds timeout = std::chrono::milliseconds(60'000)) {
  const auto devices = all_devices();
  auto comms = nccl_local_group(devices, NcclOptions{timeout});
  run_on(comms, devices, failures, fn);
}

// Where the device-buffer collective suite (tests/collective_cases.cpp)
// runs: an NCCL local group of every GPU, or four simulated GPU ranks
// (threads sharing device 0).
Engine nccl_engine() {
  return {"nccl", cuda::device_count(), Buffers::Device, true,
          [](Failures& failures, const std::function<void(Communicator&)>& fn) { run_group(failures, fn); }};
}

Engine simulated_engine() {
  return {"threads", 4, Buffers::Device, false, [](Failures& failures, const std::function<void(Communicator&)>& fn) {
            ThreadsOptions options;
            options.device = Device::CUDA;
            try {
              run_threads(
                  4,
                  [&](Communicator& comm) {
                    try {
                      fn(comm);
                    } catch (const std::exception& e) {
                      failures.add(comm.rank(), fmt::format("threw: {}", e.what()));
                      throw;
                    }
                  },
                  options);
            } catch (const RankFailed&) {
              // recorded on the rank above
            }
          }};
}

}  // namespace nccl_test

using namespace nccl_test;

// Each suite below defines suite_engine() and instantiates the cases on it.
#define DEVICE_COLLECTIVE_CASE(name) \
  BOOST_AUTO_TEST_CASE(name) { comm_test::name(suite_engine()); }

BOOST_AUTO_TEST_SUITE(nccl)

BOOST_AUTO_TEST_CASE(availability_matches_the_build) {
  if (!nccl_available()) {
    BOOST_TEST(nccl_version() == 0);
    BOOST_CHECK_EXCEPTION(nccl_world(), UnsupportedError,
                          [](const UnsupportedError& e) { return contains(e.what(), "[nccl] nccl_world"); });
    const std::vector<int> devices{0};
    BOOST_CHECK_EXCEPTION(nccl_local_group(devices), UnsupportedError,
                          [](const UnsupportedError& e) { return contains(e.what(), "[nccl] nccl_local_group"); });
    return;
  }
  BOOST_TEST(cuda::built());
  BOOST_TEST(nccl_version() > 0);
  if (cuda::device_count() == 0) {
    const std::vector<int> devices{0};
    BOOST_CHECK_THROW(nccl_local_group(devices), Error);
  }
}

BOOST_AUTO_TEST_CASE(local_group_argument_checks, *utf::precondition(has_nccl_device)) {
  const int count = cuda::device_count();
  BOOST_CHECK_EXCEPTION(nccl_local_group(std::vector<int>{}), ValueError,
                        [](const ValueError& e) { return contains(e.what(), "no devices"); });
  BOOST_CHECK_EXCEPTION(nccl_local_group(std::vector<int>{count}), ValueError, [&](const ValueError& e) {
    return contains(e.what(), fmt::format("device {} is not one of the {}", count, count));
  });
  BOOST_CHECK_EXCEPTION(nccl_local_group(std::vector<int>{0, 0}), ValueError,
                        [](const ValueError& e) { return contains(e.what(), "listed twice"); });
}

BOOST_AUTO_TEST_CASE(timeout_breaks_the_communicator, *utf::precondition(has_two_devices)) {
  const int n = cuda::device_count();
  Failures failures(n);
  const auto devices = all_devices();
  auto comms = nccl_local_group(devices, NcclOptions{std::chrono::milliseconds(2000)});
  run_on(comms, devices, failures, [&](Communicator& comm) {
    const int rank = comm.rank();
    if (rank != 0) return;  // rank 0 waits for peers that never come
    try {
      comm.barrier();
      failures.add(rank, "a barrier without peers did not time out");
    } catch (const CommTimeout& e) {
      EXPECT_R(contains(e.what(), "[nccl] barrier on rank 0") && contains(e.what(), "2000 ms"), "message: {}",
               e.what());
    }
    try {
      comm.barrier();
      failures.add(rank, "a broken communicator accepted a call");
    } catch (const CommError& e) {
      EXPECT_R(contains(e.what(), "unusable"), "message: {}", e.what());
    }
  });
  failures.report();
}

BOOST_AUTO_TEST_SUITE(local_group, *utf::precondition(has_nccl_device))
Engine suite_engine() { return nccl_engine(); }
COLLECTIVE_CASES(DEVICE_COLLECTIVE_CASE)
BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE_END()

// The same checks on four simulated GPU ranks (the threads backend on device
// buffers): the reference semantics, on the GPU.
BOOST_AUTO_TEST_SUITE(simulated_gpu_ranks, *utf::precondition(testing::needs_gpu))
Engine suite_engine() { return simulated_engine(); }
COLLECTIVE_CASES(DEVICE_COLLECTIVE_CASE)

// Ten ranks: the GPU's fused fold takes the nine peers in two launches (7,
// then 2) where the CPU's folds one peer at a time; the bits must agree, in
// f32 and in bf16 (rounded after every step), for every reducing op.
BOOST_AUTO_TEST_CASE(fused_fold_over_ten_ranks_has_the_cpu_bits) {
  constexpr int n = 10;
  constexpr std::int64_t count = 1003;  // not a multiple of the ranks: uneven segments
  for (DType dtype : {DType::Float32, DType::BFloat16})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
      auto run = [&](Device device) {
        std::vector<std::vector<std::byte>> out(n);
        ThreadsOptions options;
        options.device = device;
        run_threads(
            n,
            [&](Communicator& comm) {
              Tensor x = Tensor::rand({count}, dtype, 40 + static_cast<std::uint64_t>(comm.rank()), device);
              Tensor y = Tensor::empty({count}, dtype, device);
              comm.all_reduce(x.data(), y.data(), static_cast<std::size_t>(count), dtype, op);
              Tensor host = y.to(Device::CPU);
              const auto* b = static_cast<const std::byte*>(host.data());
              out[static_cast<std::size_t>(comm.rank())].assign(b, b + host.nbytes());
            },
            options);
        return out;
      };
      const auto cpu = run(Device::CPU), gpu = run(Device::CUDA);
      for (int r = 0; r < n; ++r)
        BOOST_TEST_CONTEXT(fmt::format("{} {} rank {}", dtype_name(dtype), reduce_op_name(op), r)) {
          BOOST_TEST((gpu[static_cast<std::size_t>(r)] == cpu[static_cast<std::size_t>(r)]));
        }
    }
}
BOOST_AUTO_TEST_SUITE_END()
