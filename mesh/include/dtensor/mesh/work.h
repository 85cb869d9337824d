#pragma once
// Work: a collective or message started by one of a Communicator's start_*
// calls and not yet waited for (PyTorch's c10d::Work under another roof).
//
//   Work w = comm.start_all_reduce(grads, grads, n, DType::F32, ReduceOp::Sum);
//   compute_something_else();   // the reduction runs meanwhile
//   w.wait();                   // grads hold the sum; errors surface here
//
// The buffers a started call reads and writes belong to it until wait() (or
// a test() that returns true): the caller keeps them alive and leaves them
// alone. Calls on one communicator, started or blocking, run in the order
// they were issued on every rank, so a rank that issues a different
// sequence still gets CollectiveMismatch, now from wait().
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace dtensor {

namespace mesh_detail {
class WorkState;
}

class Work {
 public:
  /// A handle with nothing to wait for (done, no error).
  Work() = default;
  explicit Work(std::shared_ptr<mesh_detail::WorkState> state);
  Work(Work&&) noexcept = default;
  /// Waits for the call this handle held, as the destructor does.
  Work& operator=(Work&& other) noexcept;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  /// A handle dropped without wait() waits for its call here, so that the
  /// call never outlives its buffers; an error it met is then dropped (the
  /// communicator keeps it: a failed or timed-out group refuses later calls).
  ~Work();

  /// Blocks until the call completes, then counts it in the communicator's
  /// stats (and trace) on this thread and rethrows the error it met, if any
  /// (again on every later wait). Never hangs: a call that has not completed
  /// a communicator timeout after it began (or after this wait began, if it
  /// is still queued behind others) is CommTimeout; the backend's own
  /// deadline inside the call usually fires first.
  void wait();
  /// Whether the call has completed; on true, what wait() does (counting,
  /// rethrowing). Never blocks.
  bool test();

 private:
  void settle() noexcept;
  std::shared_ptr<mesh_detail::WorkState> state_;
};

/// A link modelled by the alpha-beta formula: a call that receives `bytes`
/// takes at least latency + bytes / bandwidth. A communicator with a link
/// model (Communicator::model_link) waits out what its real call did not
/// take, by sleeping, not by spinning a core: on a machine of few cores that
/// is how a slower network is measured honestly, and how overlap with
/// computation shows.
struct LinkModel {
  std::chrono::nanoseconds latency{0};
  double bytes_per_second = 0;  // > 0

  /// The time a call receiving `bytes` takes on this link.
  std::chrono::nanoseconds time_for(std::uint64_t bytes) const;
  /// "10us,5GB/s": a latency (ns, us, ms, s) and a bandwidth (B/s, KB/s,
  /// MB/s, GB/s, decimal; KiB/s, MiB/s, GiB/s, binary). ParseError naming the
  /// text and the expected form otherwise.
  static LinkModel parse(std::string_view text);
  /// The same form back ("10us,5GB/s").
  std::string str() const;
};

}  // namespace dtensor
