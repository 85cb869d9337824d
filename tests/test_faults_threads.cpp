// Faults on thread ranks that no collective can catch by itself: a rank that
// stalls in user code (sleeps, loops) while its peers time out, more ranks
// than threads can be started, and deadlines out of range. The cases whose
// process must end (a rank that never wakes, a system that refuses threads)
// run in a child: this binary started again on one case of the
// thread_faults_child suite, which runs only when asked for by name.
//
// Boost.Test assertions are not thread-safe, so ranks collect what they saw
// and the test thread checks it after run_threads returns. No case draws
// random numbers: each prints its case name on failure.
#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "checks.h"
#include "dtensor/core/error.h"
#include "dtensor/mesh/launch.h"
#include "dtensor/mesh/threads.h"

extern char** environ;

using namespace dtensor;
using Clock = std::chrono::steady_clock;

namespace {

bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

constexpr std::chrono::milliseconds kDeadline{200};

struct ChildResult {
  int exit_code = -1;  // -1: killed at the limit (a hang)
  std::string output;  // stdout and stderr together
  double seconds = 0;
};

// Runs this test binary on one case of thread_faults_child, with `env` added
// to the environment; kills it after `limit_s` (exit_code -1).
ChildResult run_child(const std::string& test_case, std::vector<std::string> env, double limit_s) {
  int fds[2];
  BOOST_REQUIRE(pipe(fds) == 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  std::string exe = "/proc/self/exe";
  std::string run_test = "--run_test=thread_faults_child/" + test_case;
  std::string log = "--log_level=nothing", report = "--report_level=no";
  std::vector<char*> argv{exe.data(), run_test.data(), log.data(), report.data(), nullptr};
  env.push_back("DTENSOR_FAULT_CHILD=1");
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e)
    if (!std::string_view(*e).starts_with("DTENSOR_")) env_strings.emplace_back(*e);
  env_strings.insert(env_strings.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  ChildResult result;
  const auto t0 = Clock::now();
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  BOOST_REQUIRE_MESSAGE(spawned == 0, "posix_spawn: " << std::strerror(spawned));
  char buf[4096];
  for (;;) {
    const double left = limit_s - seconds_since(t0);
    if (left <= 0) {
      kill(pid, SIGKILL);
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left * 1000) + 1) <= 0) continue;
    const ssize_t n = read(fds[0], buf, sizeof buf);
    if (n <= 0) break;  // the child closed its end: it has ended
    result.output.append(buf, static_cast<std::size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  result.seconds = seconds_since(t0);
  if (WIFEXITED(status) && seconds_since(t0) < limit_s) result.exit_code = WEXITSTATUS(status);
  return result;
}

// A child case only runs when run_child started it.
bool in_child() { return std::getenv("DTENSOR_FAULT_CHILD") != nullptr; }

// What the ranks of one stall case saw; shared by pointer with the ranks, as
// the stalled one outlives run_threads.
struct StallSeen {
  std::vector<std::string> messages = std::vector<std::string>(4);
  std::atomic<bool> stalled_rank_stopped{false};
};

}  // namespace

BOOST_AUTO_TEST_SUITE(stalled_ranks)

// The peers time out on rank 1; run_threads then gives rank 1 one more
// deadline to return and reports it instead of waiting the 3 s it sleeps.
BOOST_AUTO_TEST_CASE(a_rank_that_sleeps_past_the_deadline_is_reported_at_the_deadline) {
  struct Case {
    const char* name;
    bool collective_first;  // rank 1 calls a barrier before it sleeps
    const char* doing;
  };
  for (const Case& c : {Case{"after a barrier", true,
                             "rank 1 was running user code since its barrier (collective 1) "
                             "returned"},
                        Case{"from the start", false,
                             "rank 1 was running user code since it started (no collective "
                             "yet)"}}) {
    BOOST_TEST_CONTEXT("rank 1 sleeps " << c.name) {
      auto seen = std::make_shared<StallSeen>();
      const auto t0 = Clock::now();
      std::string what;
      std::vector<int> stalled;
      int rank = -1;
      try {
        run_threads(
            4,
            [seen, c](Communicator& comm) {
              const int r = comm.rank();
              if (c.collective_first && r != 1) comm.barrier();
              if (r == 1) {
                if (c.collective_first) comm.barrier();
                std::this_thread::sleep_for(std::chrono::milliseconds(2500));
                try {
                  comm.barrier();  // the world has failed by now
                } catch (const PeerFailed&) {
                  seen->stalled_rank_stopped = true;
                  throw;
                }
                return;
              }
              try {
                double x = 1, y = 0;
                comm.all_reduce(&x, &y, 1, DType::Float64, ReduceOp::Sum);
              } catch (const CommError& e) {
                seen->messages[static_cast<std::size_t>(r)] = e.what();
                throw;
              }
            },
            ThreadsOptions{kDeadline});
        BOOST_ERROR("run_threads returned normally");
      } catch (const RankStalled& e) {
        what = e.what();
        stalled = e.stalled();
        rank = e.rank();
      } catch (const std::exception& e) {
        BOOST_ERROR("expected RankStalled, got: " << e.what());
      }
      const double took = seconds_since(t0);
      // Two deadlines (0.4 s): the peers' and then rank 1's; well before it wakes.
      BOOST_TEST(testing::in_time(took, 2.0), "run_threads took " << took << " s");
      BOOST_TEST(rank == 1);
      BOOST_TEST((stalled == std::vector<int>{1}));
      BOOST_TEST_INFO("message: " << what);
      BOOST_TEST(contains(what, "[run_threads] rank 1 of 4 stalled: still running 200 ms after rank "));
      BOOST_TEST(contains(what, "timed out after 200 ms waiting for rank(s) 1"));
      BOOST_TEST(contains(what, c.doing));
      BOOST_TEST(contains(what, "its thread was detached"));
      // Every peer saw the same story: it timed out on rank 1, or was told a
      // peer had timed out on rank 1.
      for (int r : {0, 2, 3}) {
        const std::string& m = seen->messages[static_cast<std::size_t>(r)];
        BOOST_TEST(contains(m, "timed out after 200 ms waiting for rank(s) 1"), "rank " << r << ": '" << m << "'");
      }
      // The detached rank wakes, finds the world failed at its next
      // collective and ends on its own; wait for that, so that nothing of
      // this case still runs when the next starts.
      const auto wait_start = Clock::now();
      while (!seen->stalled_rank_stopped && seconds_since(wait_start) < 10)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      BOOST_TEST(seen->stalled_rank_stopped.load());
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let its thread finish unwinding
    }
  }
}

// How long a stalled rank had: a rank that a collective timed out waiting
// for has been away a whole deadline already and gets at most 1 s more; a
// rank that was only busy when a peer threw gets a whole deadline.
BOOST_AUTO_TEST_CASE(a_late_rank_gets_at_most_a_second_a_busy_one_a_deadline) {
  struct Case {
    const char* name;
    std::chrono::milliseconds timeout;
    bool peer_throws;  // else the peers time out waiting for rank 1
    const char* waited;
    const char* cause;
  };
  for (const Case& c : {Case{"late", std::chrono::milliseconds(1200), false, "still running 1000 ms after rank ",
                             "timed out after 1200 ms waiting for rank(s) 1"},
                        Case{"busy", std::chrono::milliseconds(300), true, "still running 300 ms after rank 0 failed",
                             "rank 0 failed: rank 0 gives up"}}) {
    BOOST_TEST_CONTEXT("rank 1 " << c.name) {
      auto seen = std::make_shared<StallSeen>();
      std::string what;
      try {
        run_threads(
            3,
            [seen, c](Communicator& comm) {
              if (comm.rank() == 1) {
                std::this_thread::sleep_for(std::chrono::milliseconds(3500));
                seen->stalled_rank_stopped = true;
                return;
              }
              if (c.peer_throws && comm.rank() == 0) throw ValueError("rank 0 gives up");
              comm.barrier();
            },
            ThreadsOptions{c.timeout});
        BOOST_ERROR("run_threads returned normally");
      } catch (const RankStalled& e) {
        what = e.what();
      } catch (const std::exception& e) {
        BOOST_ERROR("expected RankStalled, got: " << e.what());
      }
      BOOST_TEST_INFO("message: " << what);
      BOOST_TEST(contains(what, "[run_threads] rank 1 of 3 stalled: "));
      BOOST_TEST(contains(what, c.waited));
      BOOST_TEST(contains(what, c.cause));
      const auto wait_start = Clock::now();
      while (!seen->stalled_rank_stopped && seconds_since(wait_start) < 10)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
}

// Without a failure a rank may compute as long as it needs: only collectives
// have deadlines, and run_threads waits for it.
BOOST_AUTO_TEST_CASE(a_slow_rank_without_a_failure_is_waited_for) {
  const auto t0 = Clock::now();
  BOOST_CHECK_NO_THROW(run_threads(
      3,
      [](Communicator& comm) {
        if (comm.rank() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(600));
      },
      ThreadsOptions{kDeadline}));
  BOOST_TEST(seconds_since(t0) >= 0.6);
}

// A rank that is busy when a peer fails, but reaches a collective within the
// deadline, is joined and the report names the rank that failed.
BOOST_AUTO_TEST_CASE(a_rank_that_returns_within_the_deadline_is_joined) {
  try {
    run_threads(
        2,
        [](Communicator& comm) {
          if (comm.rank() == 0) throw ValueError("rank 0 gives up");
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          comm.barrier();
        },
        ThreadsOptions{std::chrono::milliseconds(2000)});
    BOOST_ERROR("run_threads returned normally");
  } catch (const RankStalled& e) {
    BOOST_ERROR("rank 1 was not stalled: " << e.what());
  } catch (const RankFailed& e) {
    BOOST_TEST(e.rank() == 0);
    BOOST_TEST(std::string(e.what()) == "[run_threads] rank 0 failed: rank 0 gives up");
  }
}

// A rank that never wakes: launch() reports it at the deadline and ends the
// process with exit code 1, without waiting for it (and without hanging on a
// joinable thread at exit).
BOOST_AUTO_TEST_CASE(a_rank_that_never_wakes_ends_the_program) {
  for (const char* mode : {"sleep_forever", "spin_forever"}) {
    BOOST_TEST_CONTEXT("rank 1 " << mode) {
      const ChildResult r = run_child(mode, {"DTENSOR_TIMEOUT_MS=200"}, 20);
      BOOST_TEST_INFO("output:\n" << r.output);
      BOOST_TEST(r.exit_code == 1);
      BOOST_TEST(r.seconds < 10.0);
      BOOST_TEST(contains(r.output, "dtensor: [run_threads] rank 1 of 4 stalled: still running 200 ms after rank "));
      BOOST_TEST(contains(r.output, "timed out after 200 ms waiting for rank(s) 1"));
      BOOST_TEST(contains(r.output, "rank 1 was running user code since its barrier (collective 1) returned"));
      BOOST_TEST(contains(r.output, "ending the process"));
      BOOST_TEST(contains(r.output, "printed before the stall"));  // flushed before _Exit
      BOOST_TEST(!contains(r.output, "launch returned"));
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(rank_counts)

BOOST_AUTO_TEST_CASE(more_ranks_than_the_limit_are_refused_up_front) {
  for (int n : {100000, kMaxThreadRanks + 1, 0, -1}) {
    BOOST_TEST_CONTEXT("run_threads(" << n << ")") {
      std::atomic<int> started{0};
      try {
        run_threads(n, [&](Communicator&) { ++started; });
        BOOST_ERROR("run_threads accepted it");
      } catch (const ValueError& e) {
        BOOST_TEST(contains(e.what(), fmt::format("world_size {}", n)), e.what());
        BOOST_TEST(contains(e.what(), "expected 1 to 4096 thread ranks"), e.what());
      } catch (const std::exception& e) {
        BOOST_ERROR("expected ValueError, got: " << e.what());
      }
      BOOST_TEST(started.load() == 0);
    }
  }
}

// Threads the system refuses (here: an address-space limit too small for
// their stacks) end the run with a CommError naming how many started; the
// started ranks, waiting in a barrier for the rest, are stopped and joined.
// Skipped (counted and named) under a sanitizer, whose own mappings do not
// survive an address-space limit.
BOOST_AUTO_TEST_CASE(a_thread_the_system_refuses_is_a_typed_error,
                     *boost::unit_test::precondition([](boost::unit_test::test_unit_id) {
                       boost::test_tools::assertion_result plain(!dtensor::testing::sanitized());
                       plain.message() << "the sanitizers' own mappings do not survive an address-space limit";
                       return plain;
                     })) {
  const ChildResult r = run_child("start_failure", {}, 20);
  BOOST_TEST_INFO("output:\n" << r.output);
  BOOST_TEST(r.exit_code == 0);
  BOOST_TEST(contains(r.output, "could start only "));
  BOOST_TEST(contains(r.output, " of 512 rank threads"));
  BOOST_TEST(dtensor::testing::in_time(r.seconds, 10.0), r.seconds << " s");
}

// launch() names where a bad rank count came from.
BOOST_AUTO_TEST_CASE(launch_names_the_source_of_a_bad_rank_count) {
  for (int n : {0, 5000}) {
    BOOST_TEST_CONTEXT("default_ranks " << n) {
      const ChildResult r = run_child("default_ranks", {fmt::format("DTENSOR_TEST_DEFAULT_RANKS={}", n)}, 20);
      BOOST_TEST_INFO("output:\n" << r.output);
      BOOST_TEST(r.exit_code == 2);
      BOOST_TEST(contains(r.output, fmt::format("dtensor: LaunchOptions::default_ranks {}: expected a whole number of "
                                                "thread ranks from 1 to 4096",
                                                n)));
      BOOST_TEST(!contains(r.output, "--ranks"));
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(timeouts)

BOOST_AUTO_TEST_CASE(threads_options_timeouts_out_of_range_are_refused) {
  using std::chrono::milliseconds;
  for (milliseconds t :
       {milliseconds(0), milliseconds(-5), kMaxTimeout + milliseconds(1), milliseconds(10'000'000'000'000)}) {
    BOOST_TEST_CONTEXT("timeout " << t.count() << " ms") {
      std::atomic<int> started{0};
      try {
        run_threads(
            2, [&](Communicator&) { ++started; }, ThreadsOptions{t});
        BOOST_ERROR("run_threads accepted it");
      } catch (const ValueError& e) {
        BOOST_TEST(contains(e.what(), fmt::format("ThreadsOptions::timeout {} ms", t.count())), e.what());
        BOOST_TEST(contains(e.what(), "expected a timeout from 1 to 2592000000 ms"), e.what());
      } catch (const std::exception& e) {
        BOOST_ERROR("expected ValueError, got: " << e.what());
      }
      BOOST_TEST(started.load() == 0);
    }
  }
  // The ends of the range are accepted. The shortest runs no collective: a
  // barrier within 1 ms is a race a loaded machine (or TSan) can lose.
  BOOST_CHECK_NO_THROW(run_threads(
      2, [](Communicator&) {}, ThreadsOptions{kMinTimeout}));
  BOOST_CHECK_NO_THROW(run_threads(
      2, [](Communicator& comm) { comm.barrier(); }, ThreadsOptions{kMaxTimeout}));
}

// DTENSOR_TIMEOUT_MS=10^13 used to overflow the deadline into the past, so
// that every collective timed out at once; now launch refuses it (exit 2).
BOOST_AUTO_TEST_CASE(launch_refuses_a_timeout_out_of_range) {
  for (const char* value : {"10000000000000", "0", "-5", "99999999999999999999"}) {
    BOOST_TEST_CONTEXT("DTENSOR_TIMEOUT_MS=" << value) {
      const ChildResult r = run_child("timeout_env", {fmt::format("DTENSOR_TIMEOUT_MS={}", value)}, 20);
      BOOST_TEST_INFO("output:\n" << r.output);
      BOOST_TEST(r.exit_code == 2);
      BOOST_TEST(contains(r.output, "DTENSOR_TIMEOUT_MS"));
      BOOST_TEST(contains(r.output, value));
      BOOST_TEST(contains(r.output, "from 1 to 2592000000"));
      BOOST_TEST(!contains(r.output, "all_reduce ran"));
    }
  }
  // In range, the same program runs and its collectives wait as they should.
  const ChildResult ok = run_child("timeout_env", {"DTENSOR_TIMEOUT_MS=2592000000"}, 20);
  BOOST_TEST_INFO("output:\n" << ok.output);
  BOOST_TEST(ok.exit_code == 0);
  BOOST_TEST(contains(ok.output, "all_reduce ran"));
}

BOOST_AUTO_TEST_SUITE_END()

// The programs the cases above run in a child process. Disabled: they run
// only when named by --run_test, and only under run_child.
BOOST_AUTO_TEST_SUITE(thread_faults_child, *boost::unit_test::disabled())

namespace {

// launch() on `ranks` thread ranks; exits with its code.
[[noreturn]] void exit_with_launch(int ranks, const std::function<void(Communicator&)>& fn,
                                   LaunchOptions options = {}) {
  std::string prog = "child", flag = "--ranks", value = std::to_string(ranks);
  std::vector<char*> argv{prog.data(), flag.data(), value.data(), nullptr};
  int argc = ranks > 0 ? 3 : 1;
  const int rc = launch(argc, argv.data(), fn, options);
  fmt::print("launch returned {}\n", rc);
  std::fflush(stdout);
  std::_Exit(rc);
}

void stall_forever(bool spin) {
  if (!in_child()) return;
  exit_with_launch(4, [spin](Communicator& comm) {
    comm.barrier();
    if (comm.rank() == 1) {
      fmt::print("printed before the stall\n");  // stays in stdout's buffer (a pipe) until the exit flushes it
      if (spin) {
        std::atomic<std::uint64_t> spins{0};
        for (;;) spins.fetch_add(1, std::memory_order_relaxed);
      }
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    }
    double x = 1, y = 0;
    comm.all_reduce(&x, &y, 1, DType::Float64, ReduceOp::Sum);
  });
}

}  // namespace

BOOST_AUTO_TEST_CASE(sleep_forever) { stall_forever(false); }
BOOST_AUTO_TEST_CASE(spin_forever) { stall_forever(true); }

BOOST_AUTO_TEST_CASE(timeout_env) {
  if (!in_child()) return;
  exit_with_launch(2, [](Communicator& comm) {
    double x = 1, y = 0;
    comm.all_reduce(&x, &y, 1, DType::Float64, ReduceOp::Sum);
    if (comm.rank() == 0) fmt::print("all_reduce ran: {}\n", y);
  });
}

BOOST_AUTO_TEST_CASE(default_ranks) {
  if (!in_child()) return;
  LaunchOptions options;
  options.default_ranks = std::atoi(std::getenv("DTENSOR_TEST_DEFAULT_RANKS"));
  exit_with_launch(
      0, [](Communicator&) { fmt::print("the program ran\n"); }, options);
}

// Room for a few thread stacks only: run_threads must stop the ranks it
// started and say how many that was.
BOOST_AUTO_TEST_CASE(start_failure) {
  if (!in_child()) return;
  std::size_t vm_kib = 0;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.starts_with("VmSize:")) vm_kib = std::stoull(line.substr(7));
  const rlim_t limit = static_cast<rlim_t>(vm_kib + 64 * 1024) * 1024;
  rlimit rl{limit, limit};
  if (vm_kib == 0 || setrlimit(RLIMIT_AS, &rl) != 0) {
    fmt::print("cannot set an address-space limit\n");
    std::_Exit(3);
  }
  int code = 1;
  try {
    run_threads(
        512, [](Communicator& comm) { comm.barrier(); }, ThreadsOptions{std::chrono::milliseconds(5000)});
    fmt::print("run_threads started all 512 ranks\n");
  } catch (const RankFailed& e) {
    fmt::print("RankFailed: {}\n", e.what());
  } catch (const CommError& e) {
    fmt::print("CommError: {}\n", e.what());
    code = 0;
  } catch (const std::exception& e) {
    fmt::print("untyped: {}\n", e.what());
  }
  std::fflush(stdout);
  std::_Exit(code);
}

BOOST_AUTO_TEST_SUITE_END()
