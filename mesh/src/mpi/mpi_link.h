#pragma once
// Internal to the MPI backend: one MPI communicator as its collectives
// (mpi_communicator.cpp) use it. It owns the handles (the communicator and a
// private duplicate for the arrivals), makes the arrival every collective
// starts with, and polls every request against the deadline; a call that
// times out, or whose peer returned from its program, leaves the link
// broken, and every later call throws at once (mpi_link.cpp).
// The C API only: MPI's deprecated C++ bindings warn under -Wextra.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "call_signature.h"
#include "dtensor/core/error.h"
#include "dtensor/mesh/communicator.h"

namespace dtensor::mpi_detail {

using Clock = std::chrono::steady_clock;

// Calls moving at least this many bytes on a rank take the blocking path.
inline constexpr std::size_t kBlockingBytes = 64 << 10;

class MpiLink {
 public:
  // Takes `comm` (freed with the link, as is its duplicate).
  MpiLink(MPI_Comm comm, std::chrono::milliseconds timeout, bool oversubscribed);
  ~MpiLink();
  MpiLink(const MpiLink&) = delete;
  MpiLink& operator=(const MpiLink&) = delete;

  MPI_Comm comm() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  bool oversubscribed() const { return oversubscribed_; }

  // Fails at once on a link that an earlier timeout left unusable.
  void check_usable(CollectiveKind kind) const;
  // The arrival every collective makes first (see mpi_link.cpp):
  // sends `sig` to every peer, waits for theirs until the deadline, and
  // throws CollectiveMismatch on every rank when they differ. `v0`/`v1` are
  // the per-rank lists the call passed, read only to describe a mismatch.
  // Returns whether every rank's kRegular word is set.
  bool arrive(Signature sig, std::span<const std::size_t> v0 = {}, std::span<const std::size_t> v1 = {});
  // Runs one collective of `bytes`, after the arrival: blocking when large,
  // else nonblocking and polled (see mpi_communicator.cpp). Both forms must
  // describe the same call, and `bytes` must be the same on every rank
  // (the arrival checked it), since MPI never matches a blocking collective
  // with a nonblocking one.
  template <class Blocking, class Nonblocking>
  void collective(CollectiveKind kind, std::size_t bytes, Blocking&& blocking, Nonblocking&& nonblocking) {
    if (bytes >= kBlockingBytes) {
      check(kind, blocking());
    } else {
      MPI_Request req;
      check(kind, nonblocking(&req));
      wait(kind, req);
    }
  }

  // Completes `req`, polling MPI (which drives its progress engine) until
  // the deadline.
  // Every rank has arrived by then (see arrive()): only a rank that died
  // mid-transfer can keep it from completing.
  void wait(CollectiveKind kind, MPI_Request& req);
  // Throws CommError naming the call when `rc` is an MPI error.
  void check(CollectiveKind kind, int rc) const;
  // `value` as MPI's int count; UnsupportedError naming `what` if it does not fit.
  int as_int(CollectiveKind kind, std::string_view what, std::size_t value) const;

  // A buffered send: returns at once, as on the threads backend.
  void send(const void* buf, std::size_t bytes, int dst, int tag);
  // Waits until a message from (src, tag) is there, until the deadline;
  // returns its size in bytes.
  int probe(int src, int tag);

 private:
  // A buffered point-to-point send in flight: the data is ours until MPI
  // completes the request.
  struct PendingSend {
    std::vector<std::byte> data;
    MPI_Request request = MPI_REQUEST_NULL;
  };

  // While an arrival waits: the peers whose signature has not come. (Each
  // receive is tested on its own: one that completes here is freed and left
  // as MPI_REQUEST_NULL, which later tests count as done.)
  std::vector<int> missing_peers();
  // An arrival given up: its receives still pending are cancelled, so that a
  // late signature can never land in memory this object may since have
  // freed. (The sends are eager copies: nothing reads mine_ any more.)
  void abandon_receives();
  // Whether `peer`'s end-of-program notice has stood for kNoticeGrace;
  // `noticed` keeps when one was first seen.
  bool finished(int peer, Clock::time_point& noticed) const;
  PeerFailed peer_finished(CollectiveKind kind, int peer, std::string_view what);
  // Between polls: give the core to a peer when ranks outnumber cores, and
  // say whether this poll is one that checks the deadline (every 64th).
  bool checkpoint(int spins) const;
  // Marks the link broken (a request is left incomplete).
  CommTimeout timed_out(CollectiveKind kind, std::string_view why);
  void reap_sends();
  void drain_sends();

  static constexpr int kSignatureTag = 1;

  MPI_Comm comm_;
  MPI_Comm ctl_ = MPI_COMM_NULL;  // arrivals only: user tags on comm_ never match them
  int rank_ = 0;
  int size_ = 1;
  std::chrono::milliseconds timeout_;
  bool oversubscribed_;
  bool broken_ = false;
  std::string broken_msg_;
  std::deque<PendingSend> pending_;
  // The arrival's state, reused from call to call.
  std::uint64_t seq_ = 0;
  Signature mine_{};
  std::vector<std::uint64_t> signatures_;
  std::vector<MPI_Request> requests_;
  std::vector<std::size_t> sizes_;
  std::vector<int> world_ranks_;  // member -> MPI_COMM_WORLD rank
};

}  // namespace dtensor::mpi_detail
