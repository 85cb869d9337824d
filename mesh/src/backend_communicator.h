#pragma once
// Internal to the backends: the skeleton every collective of every backend
// follows, written once. Each public call of BackendCommunicator
//   1. checks this rank's arguments (argument_checks.h: one wording for all),
//   2. runs an int64 Avg over two or more ranks as the exact average
//      (exact_average.h), which comes back here as a Sum of pairs,
//   3. enters: the backend's enter() (a failed or broken communicator throws
//      here), then the start of the call's trace event,
//   4. calls the backend's do_* hook, which moves the data,
//   5. counts the call and its received bytes by the contract in
//      communicator.h (StatsRecorder: the counters and the trace),
// and leaves (leave()) however the call ends. A backend writes steps 3 and 4
// only. Stats count a call that returned; one that threw counts nothing.
//
// The Avg division stays in the hooks (divide_average): where it runs is the
// backend's algorithm (the threads backend divides the segment it reduced,
// once, before the ranks gather the segments; NCCL enqueues it before its
// one wait). Hooks see Avg and reduce it as a Sum, then divide.
//
// The public interface stays virtual, so that decorators of a Communicator
// (bench/timed_communicator.h) forward calls without counting them twice.
//
// Started calls (start_*, dtensor/mesh/work.h) run the same public call on
// the rank's worker (rank_worker.h); every blocking call first drains that
// worker, so a rank's calls keep one order whichever form they take. A
// modelled link (model_link) holds each call until its alpha-beta time for
// the bytes it counts has passed, on whichever thread runs the call.
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>

#include "dtensor/core/dtype.h"
#include "dtensor/core/reduce_op.h"
#include "dtensor/mesh/communicator.h"
#include "rank_worker.h"
#include "stats_recorder.h"

namespace dtensor::backend_detail {

/// A native library's reduce op for `op` (MPI_Op, ncclRedOp_t): Avg is its
/// Sum, which the backend then divides.
template <class NativeOp>
NativeOp native_op(ReduceOp op, NativeOp sum, NativeOp max, NativeOp min) {
  switch (op) {
    case ReduceOp::Max: return max;
    case ReduceOp::Min: return min;
    case ReduceOp::Sum:
    case ReduceOp::Avg: break;
  }
  return sum;
}

class BackendCommunicator : public Communicator {
 public:
  using Communicator::all_gather;        // the equal-size overload
  using Communicator::start_all_gather;  // the same
  using Communicator::all_reduce;  // the typed overloads

  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) final;
  void all_gather(const void* send, void* recv, std::span<const std::size_t> recv_bytes) final;
  void reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts, DType dtype,
                      ReduceOp op) final;
  void all_to_all(const void* send, std::span<const std::size_t> send_bytes, std::span<const std::size_t> send_offsets,
                  void* recv, std::span<const std::size_t> recv_bytes, std::span<const std::size_t> recv_offsets) final;
  void broadcast(void* buf, std::size_t bytes, int root) final;
  void scatter(const void* send, std::span<const std::size_t> bytes, void* recv, int root) final;
  void send(const void* buf, std::size_t bytes, int dst, int tag) final;
  void recv(void* buf, std::size_t bytes, int src, int tag) final;
  void barrier() final;
  std::unique_ptr<Communicator> split(int color, int key) final;

  Work start_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) final;
  Work start_all_gather(const void* send, void* recv, std::span<const std::size_t> recv_bytes) final;
  Work start_reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts, DType dtype,
                            ReduceOp op) final;
  Work start_all_to_all(const void* send, std::span<const std::size_t> send_bytes,
                        std::span<const std::size_t> send_offsets, void* recv, std::span<const std::size_t> recv_bytes,
                        std::span<const std::size_t> recv_offsets) final;
  Work start_broadcast(void* buf, std::size_t bytes, int root) final;
  Work start_scatter(const void* send, std::span<const std::size_t> bytes, void* recv, int root) final;
  Work start_send(const void* buf, std::size_t bytes, int dst, int tag) final;
  Work start_recv(void* buf, std::size_t bytes, int src, int tag) final;

  void model_link(std::optional<LinkModel> link) final;
  std::optional<LinkModel> link_model() const final { return link_; }

  CommStats& stats() final { return stats_.rank_totals(); }
  const CommStats& own_stats() const final { return stats_.own(); }

 protected:
  /// `rank_totals`: this process rank's counters, shared by every
  /// communicator of the rank; it must outlive this one.
  explicit BackendCommunicator(CommStats& rank_totals) : stats_(rank_totals) {}

  /// Each backend's destructor calls this first: a started call still queued
  /// or running uses the backend's state, which must outlive it.
  void finish_started_calls() noexcept;

  /// Step 3: throws if the communicator cannot take a call (a failed peer, an
  /// earlier timeout), else readies the call (its deadline, its device).
  virtual void enter(CollectiveKind kind) = 0;
  /// After every call that entered, however it ended. Must not throw.
  virtual void leave() noexcept {}

  // Step 4, with the arguments already checked. The hooks get the caller's
  // arguments unchanged (op may be Avg: reduce as Sum, then divide_average).
  virtual void do_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) = 0;
  virtual void do_all_gather(const void* send, void* recv, std::span<const std::size_t> recv_bytes) = 0;
  virtual void do_reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts, DType dtype,
                                 ReduceOp op) = 0;
  virtual void do_all_to_all(const void* send, std::span<const std::size_t> send_bytes,
                             std::span<const std::size_t> send_offsets, void* recv,
                             std::span<const std::size_t> recv_bytes, std::span<const std::size_t> recv_offsets) = 0;
  virtual void do_broadcast(void* buf, std::size_t bytes, int root) = 0;
  virtual void do_scatter(const void* send, std::span<const std::size_t> bytes, void* recv, int root) = 0;
  /// Returns once `buf` may be reused (buffered or delivered).
  virtual void do_send(const void* buf, std::size_t bytes, int dst, int tag) = 0;
  /// Takes the next message from (src, tag) off its queue and returns its
  /// size; writes it to `buf` only when that size is `bytes` (otherwise the
  /// skeleton throws CommError naming both sizes).
  virtual std::size_t do_recv(void* buf, std::size_t bytes, int src, int tag) = 0;
  virtual void do_barrier() = 0;
  virtual std::unique_ptr<Communicator> do_split(int color, int key) = 0;

  /// Avg: divides `count` elements at `data` (on device()) by size(), the
  /// last step of an Avg reduced as a Sum. Other ops: nothing.
  void divide_average(void* data, std::size_t count, DType dtype, ReduceOp op);

 private:
  class Entered;
  // Runs `call` (a public call on this communicator) on the rank's worker.
  Work start(CollectiveKind kind, std::function<void()> call);
  StatsRecorder stats_;
  std::optional<LinkModel> link_;
  std::shared_ptr<mesh_detail::RankWorker> worker_;  // on the first started call
  // Held by started calls' handles, which count into stats_ only while this
  // communicator lives.
  std::shared_ptr<char> alive_ = std::make_shared<char>();
};

}  // namespace dtensor::backend_detail
