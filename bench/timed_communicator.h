#pragma once
// A communicator that forwards every call to another one and adds up the
// time spent inside the calls: steady-clock (wall) seconds and this thread's
// CPU seconds. Communicators split from it share its clock, so a DeviceMesh
// built on it times the collectives of every mesh dim. The wall time
// includes waiting for peers that are still computing (on an oversubscribed
// machine that is most of it); the CPU time is the work done inside the
// call (copies, reductions, and MPI's polling, which spins).
#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <utility>

#include <dtensor/mesh/communicator.h>

#include "thread_timing.h"

namespace dtensor::bench {

/// Time inside collectives on one rank.
struct CommClock {
  double wall = 0;  // seconds
  double cpu = 0;   // seconds of the calling thread's CPU time
};

class TimedCommunicator final : public Communicator {
 public:
  /// Times calls on `inner` into `clock`; both must outlive this.
  TimedCommunicator(Communicator& inner, CommClock& clock) : inner_(&inner), clock_(&clock) {}
  /// The same, owning `inner` (a split's result).
  TimedCommunicator(std::unique_ptr<Communicator> inner, CommClock& clock)
      : owned_(std::move(inner)), inner_(owned_.get()), clock_(&clock) {}

  using Communicator::all_gather;
  using Communicator::all_reduce;
  using Communicator::start_all_gather;

  // Started calls go to `inner`'s worker; only their start is timed here
  // (their wait happens later, inside whatever waits for them).
  Work start_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) override {
    return timed_start([&] { return inner_->start_all_reduce(send, recv, count, dtype, op); });
  }
  Work start_all_gather(const void* send, void* recv, std::span<const std::size_t> recv_bytes) override {
    return timed_start([&] { return inner_->start_all_gather(send, recv, recv_bytes); });
  }
  Work start_reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts, DType dtype,
                            ReduceOp op) override {
    return timed_start([&] { return inner_->start_reduce_scatter(send, recv, counts, dtype, op); });
  }
  void model_link(std::optional<LinkModel> link) override { inner_->model_link(link); }
  std::optional<LinkModel> link_model() const override { return inner_->link_model(); }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string_view backend() const override { return inner_->backend(); }
  Device device() const override { return inner_->device(); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  CommStats& stats() override { return inner_->stats(); }
  const CommStats& own_stats() const override { return inner_->own_stats(); }

  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) override {
    timed([&] { inner_->all_reduce(send, recv, count, dtype, op); });
  }
  void all_gather(const void* send, void* recv, std::span<const std::size_t> recv_bytes) override {
    timed([&] { inner_->all_gather(send, recv, recv_bytes); });
  }
  void reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts, DType dtype,
                      ReduceOp op) override {
    timed([&] { inner_->reduce_scatter(send, recv, counts, dtype, op); });
  }
  void all_to_all(const void* send, std::span<const std::size_t> send_bytes, std::span<const std::size_t> send_offsets,
                  void* recv, std::span<const std::size_t> recv_bytes,
                  std::span<const std::size_t> recv_offsets) override {
    timed([&] { inner_->all_to_all(send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets); });
  }
  void broadcast(void* buf, std::size_t bytes, int root) override {
    timed([&] { inner_->broadcast(buf, bytes, root); });
  }
  void scatter(const void* send, std::span<const std::size_t> bytes, void* recv, int root) override {
    timed([&] { inner_->scatter(send, bytes, recv, root); });
  }
  void send(const void* buf, std::size_t bytes, int dst, int tag) override {
    timed([&] { inner_->send(buf, bytes, dst, tag); });
  }
  void recv(void* buf, std::size_t bytes, int src, int tag) override {
    timed([&] { inner_->recv(buf, bytes, src, tag); });
  }
  void barrier() override {
    timed([&] { inner_->barrier(); });
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    std::unique_ptr<Communicator> child = inner_->split(color, key);
    if (!child) return nullptr;
    return std::make_unique<TimedCommunicator>(std::move(child), *clock_);
  }

 private:
  template <class Fn>
  void timed(Fn&& fn) {
    const auto wall0 = std::chrono::steady_clock::now();
    const double cpu0 = thread_seconds();
    fn();
    clock_->cpu += thread_seconds() - cpu0;
    clock_->wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  }
  template <class Fn>
  Work timed_start(Fn&& fn) {
    Work w;
    timed([&] { w = fn(); });
    return w;
  }

  std::unique_ptr<Communicator> owned_;  // null when the caller owns inner_
  Communicator* inner_;
  CommClock* clock_;
};

}  // namespace dtensor::bench
