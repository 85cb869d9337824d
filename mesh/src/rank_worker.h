#pragma once
// Internal to the backends: how started calls (dtensor/mesh/work.h) run.
//
// Each process rank has at most one RankWorker, a thread that runs the
// rank's started calls one at a time in the order they were started, for
// every communicator of the rank: its communication stream. One thread per
// rank, not per communicator, keeps a rank's calls in one order (what the
// mismatch checks and MPI_THREAD_SERIALIZED both need) and lets a blocking
// call wait for the started ones by draining one queue.
//
// What a call records (counters, trace event) it records into its
// WorkState while on the worker; the rank's own thread applies that record
// when it waits, so the counters and the trace stay touched by one thread.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dtensor/mesh/communicator.h"
#include "dtensor/mesh/detail/trace_recorder.h"

namespace dtensor::mesh_detail {

/// What one call recorded on the worker, for the waiting thread to apply:
/// a collective (kind, bytes) or one end of a message, with its times.
struct DeferredRecord {
  CollectiveKind kind = CollectiveKind::AllReduce;
  std::uint64_t bytes = 0;
  bool message = false;
  trace::MessageEnd end{};
  trace::Clock::time_point start{}, finish{};
};

class WorkState {
 public:
  WorkState(std::string what, std::chrono::milliseconds timeout) : what_(std::move(what)), timeout_(timeout) {}

  // On the worker.
  void mark_started();
  void mark_finished(std::exception_ptr error);
  /// While the call runs on the worker: the records it makes (an int64
  /// average makes more than one call).
  std::vector<DeferredRecord> records;
  /// Applies `records` on the waiting thread (the communicator's counters).
  std::function<void(const std::vector<DeferredRecord>&)> apply;

  // On the rank's thread.
  void wait();
  bool test();
  /// Blocks until finished (with wait()'s deadline) without applying or
  /// rethrowing; false if that deadline passed.
  bool wait_finished() noexcept;

 private:
  void complete();  // apply once, honour not_before, rethrow
  std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false, finished_ = false, applied_ = false;
  trace::Clock::time_point started_at_{};
  std::exception_ptr error_;
  std::string what_;
  std::chrono::milliseconds timeout_;
};

class RankWorker : public std::enable_shared_from_this<RankWorker> {
 public:
  /// The worker of the process rank whose totals are `rank_key`, started on
  /// first use; it lives while some communicator holds it.
  static std::shared_ptr<RankWorker> of(const CommStats* rank_key);
  /// Whether this thread is some rank's worker (a call made there runs
  /// inline: it is already in order).
  static bool on_worker_thread();

  ~RankWorker();
  /// Queues `job` to run on the worker after every call queued before it.
  void submit(std::shared_ptr<WorkState> state, std::function<void()> job);
  /// Blocks until every queued call has finished (their errors stay with
  /// their handles). Does nothing on the worker itself.
  void drain() noexcept;
  /// drain() on the worker this thread last submitted to, if it lives: what
  /// every blocking call does first, whichever communicator of the rank it
  /// is on (a rank's calls are issued from one thread).
  static void drain_this_threads() noexcept;

 private:
  RankWorker();
  void run();
  std::mutex mu_;
  std::condition_variable cv_;
  struct Job {
    std::shared_ptr<WorkState> state;
    std::function<void()> body;
  };
  std::deque<Job> queue_;
  std::shared_ptr<WorkState> last_;  // the latest call queued
  // Calls queued or running: drain() on an idle worker (every blocking
  // call's first step) reads this and takes no lock.
  std::atomic<std::size_t> in_flight_{0};
  bool stopping_ = false;
  std::thread thread_;
};

/// While a worker runs a call: where the call's StatsRecorder puts its
/// records instead of counting them (null on every other thread).
extern thread_local std::vector<DeferredRecord>* deferred_records;

}  // namespace dtensor::mesh_detail
