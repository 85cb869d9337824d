#include "rank_worker.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <system_error>

#include <fmt/format.h>

#include "dtensor/core/error.h"

namespace dtensor {
namespace mesh_detail {
namespace {

using Clock = trace::Clock;

// Past a started call's own deadline (which the backend enforces inside the
// call) a wait allows this much more before it gives up on the worker.
constexpr auto kWaitGrace = std::chrono::seconds(1);

thread_local bool worker_thread = false;
// The worker this (rank's) thread last submitted to.
thread_local std::weak_ptr<RankWorker> submitted_to;

}  // namespace

thread_local std::vector<DeferredRecord>* deferred_records = nullptr;

// ---- WorkState ---------------------------------------------------------------

void WorkState::mark_started() {
  {
    const std::lock_guard lock(mu_);
    started_ = true;
    started_at_ = Clock::now();
  }
  cv_.notify_all();
}

void WorkState::mark_finished(std::exception_ptr error) {
  {
    const std::lock_guard lock(mu_);
    finished_ = true;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

bool WorkState::wait_finished() noexcept {
  std::unique_lock lock(mu_);
  const auto waited_from = Clock::now();
  while (!finished_) {
    if (!started_) {
      // Queued: its turn comes when the calls before it end, each within
      // its own deadline; mark_started() wakes this wait.
      cv_.wait(lock);
      continue;
    }
    const auto deadline = std::max(started_at_, waited_from) + timeout_ + kWaitGrace;
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !finished_) return false;
  }
  return true;
}

void WorkState::complete() {
  bool first = false;
  std::exception_ptr error;
  {
    const std::lock_guard lock(mu_);
    first = !applied_;
    applied_ = true;
    error = error_;
  }
  // Counted once, and only when the call returned (as a blocking call is).
  if (first && !error && apply) apply(records);
  if (error) std::rethrow_exception(error);
}

void WorkState::wait() {
  if (!wait_finished())
    throw CommTimeout(fmt::format("{}: started but not finished {} ms after it began (the communicator's timeout)",
                                  what_, timeout_.count()));
  complete();
}

bool WorkState::test() {
  {
    const std::lock_guard lock(mu_);
    if (!finished_) return false;
  }
  complete();
  return true;
}

// ---- RankWorker ----------------------------------------------------------------

std::shared_ptr<RankWorker> RankWorker::of(const CommStats* rank_key) {
  static std::mutex mu;
  static std::map<const CommStats*, std::weak_ptr<RankWorker>> workers;
  const std::lock_guard lock(mu);
  auto& slot = workers[rank_key];
  if (auto alive = slot.lock()) return alive;
  std::shared_ptr<RankWorker> made(new RankWorker());
  slot = made;
  // Forget the rank's dead workers' entries as new ones start.
  std::erase_if(workers, [](const auto& entry) { return entry.second.expired(); });
  return made;
}

bool RankWorker::on_worker_thread() { return worker_thread; }

RankWorker::RankWorker() {
  try {
    thread_ = std::thread([this] { run(); });
  } catch (const std::system_error& e) {
    throw CommError(fmt::format("could not start a rank's communication worker thread: {}", e.what()));
  }
}

RankWorker::~RankWorker() {
  {
    const std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();  // after every queued call has run
}

void RankWorker::submit(std::shared_ptr<WorkState> state, std::function<void()> job) {
  submitted_to = weak_from_this();
  {
    const std::lock_guard lock(mu_);
    last_ = state;
    queue_.push_back(Job{std::move(state), std::move(job)});
    in_flight_.fetch_add(1, std::memory_order_relaxed);
  }
  cv_.notify_all();
}

void RankWorker::drain() noexcept {
  // Acquire: pairs with the release after a call finished, so what it wrote
  // is seen here even when no lock is taken.
  if (worker_thread || in_flight_.load(std::memory_order_acquire) == 0) return;
  std::shared_ptr<WorkState> last;
  {
    const std::lock_guard lock(mu_);
    last = last_;
  }
  // Calls run in order: when the latest has finished, all have.
  if (last) last->wait_finished();
}

void RankWorker::drain_this_threads() noexcept {
  if (submitted_to.expired()) return;
  if (auto worker = submitted_to.lock()) worker->drain();
}

void RankWorker::run() {
  worker_thread = true;
  for (;;) {
    Job job;
    {
      // An idle worker waits for work without a deadline: it holds nothing
      // that anyone waits for.
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job.state->mark_started();
    std::exception_ptr error;
    deferred_records = &job.state->records;
    try {
      job.body();
    } catch (...) {
      error = std::current_exception();
    }
    deferred_records = nullptr;
    job.state->mark_finished(std::move(error));
    in_flight_.fetch_sub(1, std::memory_order_release);
  }
}

}  // namespace mesh_detail

// ---- Work ----------------------------------------------------------------------

Work::Work(std::shared_ptr<mesh_detail::WorkState> state) : state_(std::move(state)) {}

Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    settle();
    state_ = std::move(other.state_);
  }
  return *this;
}

Work::~Work() { settle(); }

void Work::settle() noexcept {
  if (!state_) return;
  try {
    state_->wait();
  } catch (...) {
    // Dropped with the handle: the communicator keeps its own failure state.
  }
  state_.reset();
}

void Work::wait() {
  if (state_) state_->wait();
}

bool Work::test() { return !state_ || state_->test(); }

}  // namespace dtensor
