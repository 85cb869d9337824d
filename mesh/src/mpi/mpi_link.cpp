// One MPI communicator as the MPI backend's collectives use it
// (mpi_link.h): the arrival every collective makes first, the polling waits,
// and the broken state a timeout leaves.
//
// The arrival: each rank sends a signature of its call (kind, dtype, reduce
// op, root, count, a hash of the per-rank sizes, its sequence number on the
// communicator; call_signature.h) to every peer on a private duplicate
// communicator and polls for theirs against the deadline. Then
//  - every rank holds the same table of signatures, so either all proceed
//    or all throw the same CollectiveMismatch naming the two calls and ranks
//    (and the communicator stays usable: no MPI call was left half done);
//    unchecked, a mismatch hangs, corrupts data or is killed by MPI's error
//    handler;
//  - at the deadline a rank knows exactly whose signature did not come: the
//    CommTimeout names those ranks;
//  - past it, every rank is in the same call with the same sizes, so the
//    call itself can only stall if a rank dies mid-transfer (the launcher,
//    mpirun, then ends the job).
// The arrival replaces the nonblocking barrier large calls made before
// (n-1 eager messages of 72 bytes each way): bench/collectives under mpirun
// shows no cost from 1 MiB; a small call pays one more round trip (a 4-byte
// all_reduce on 2 ranks: about 2.4 us against 1.6 us).
// Polling yields the core only when the node runs more ranks than it has
// cores: otherwise each yield gives away a time slice in which the peer
// could have progressed too (4 MiB all_reduce on 2 ranks: 5.2 ms polled
// with yields against 1.1 ms without).
// A communicator whose call timed out keeps an incomplete request that MPI
// forbids us to free: it is marked broken and every later call on it throws
// at once; the process is expected to end (launch() aborts the job), which
// is the only recovery MPI offers.
#include "mpi_link.h"

#include <sched.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "mpi_runtime.h"

namespace dtensor::mpi_detail {

MpiLink::MpiLink(MPI_Comm comm, std::chrono::milliseconds timeout, bool oversubscribed)
    : comm_(comm), timeout_(timeout), oversubscribed_(oversubscribed) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  // Every rank of comm_ is here (it was just made), so the dup cannot hang.
  MPI_Comm_dup(comm_, &ctl_);
  MPI_Comm_set_errhandler(ctl_, MPI_ERRORS_RETURN);
  // Each member's MPI_COMM_WORLD rank: the source of its notices.
  MPI_Group group, world;
  MPI_Comm_group(comm_, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> local(static_cast<std::size_t>(size_));
  for (int p = 0; p < size_; ++p) local[static_cast<std::size_t>(p)] = p;
  world_ranks_.resize(local.size());
  MPI_Group_translate_ranks(group, size_, local.data(), world, world_ranks_.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
}

MpiLink::~MpiLink() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || broken_) return;  // a broken comm has requests MPI will not let us free
  // Unmatched buffered sends would be lost: give them the deadline, then
  // leave them to MPI_Finalize.
  try {
    drain_sends();
  } catch (...) {
  }
  MPI_Comm_free(&ctl_);
  MPI_Comm_free(&comm_);
}

void MpiLink::check_usable(CollectiveKind kind) const {
  if (broken_)
    throw CommTimeout(fmt::format("[mpi] {} on rank {} of {}: the communicator is unusable: {}", collective_name(kind),
                                  rank_, size_, broken_msg_));
}

bool MpiLink::arrive(Signature sig, std::span<const std::size_t> v0, std::span<const std::size_t> v1) {
  const auto kind = static_cast<CollectiveKind>(sig[kKind]);
  const auto n = static_cast<std::size_t>(size_);
  const auto r = static_cast<std::size_t>(rank_);
  sig[kSeq] = seq_++;
  mine_ = sig;
  signatures_.resize(n * kSignatureWords);
  std::copy(sig.begin(), sig.end(), signatures_.begin() + static_cast<std::ptrdiff_t>(r * kSignatureWords));
  requests_.assign(2 * (n - 1), MPI_REQUEST_NULL);
  // Receives first, at [0, n-1) in peer order, then the sends.
  for (std::size_t p = 0, i = 0; p < n; ++p) {
    if (p == r) continue;
    check(kind, MPI_Irecv(signatures_.data() + p * kSignatureWords, kSignatureWords, MPI_UINT64_T, static_cast<int>(p),
                          kSignatureTag, ctl_, &requests_[i]));
    check(kind, MPI_Isend(mine_.data(), kSignatureWords, MPI_UINT64_T, static_cast<int>(p), kSignatureTag, ctl_,
                          &requests_[n - 1 + i]));
    ++i;
  }
  const auto deadline = Clock::now() + timeout_;
  Clock::time_point noticed{};
  for (int spins = 0;; ++spins) {
    int done = 0;
    check(kind, MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE));
    if (done) break;
    if (!checkpoint(spins)) continue;
    const std::vector<int> missing = missing_peers();
    if (Clock::now() >= deadline) {
      abandon_receives();
      throw timed_out(kind, fmt::format("waiting for rank(s) {}", fmt::join(missing, ", ")));
    }
    for (int p : missing)
      if (finished(p, noticed)) {
        abandon_receives();
        throw peer_finished(kind, p, "waiting for it to arrive");
      }
  }
  if (!signatures_agree(signatures_, size_)) {
    // Every rank holds this same table, so every rank is here too.
    sizes_.assign(n * 2 * n, 0);
    std::copy(v0.begin(), v0.end(), sizes_.begin() + static_cast<std::ptrdiff_t>(r * 2 * n));
    std::copy(v1.begin(), v1.end(), sizes_.begin() + static_cast<std::ptrdiff_t>(r * 2 * n + n));
    static_assert(sizeof(std::size_t) == sizeof(std::uint64_t));
    MPI_Request req;
    check(kind, MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, sizes_.data(), static_cast<int>(2 * n), MPI_UINT64_T,
                               ctl_, &req));
    wait(kind, req);
    throw CollectiveMismatch(mismatch_message(signatures_, sizes_, size_, rank_));
  }
  for (std::size_t p = 0; p < n; ++p)
    if (signatures_[p * kSignatureWords + kRegular] == 0) return false;
  return true;
}

std::vector<int> MpiLink::missing_peers() {
  std::vector<int> missing;
  const auto r = static_cast<std::size_t>(rank_);
  for (std::size_t p = 0, i = 0; p < static_cast<std::size_t>(size_); ++p) {
    if (p == r) continue;
    int flag = 0;
    MPI_Test(&requests_[i++], &flag, MPI_STATUS_IGNORE);
    if (!flag) missing.push_back(static_cast<int>(p));
  }
  return missing;
}

void MpiLink::abandon_receives() {
  for (std::size_t i = 0; i + 1 < static_cast<std::size_t>(size_); ++i) {
    if (requests_[i] == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&requests_[i]);
    MPI_Request_free(&requests_[i]);
  }
}

bool MpiLink::finished(int peer, Clock::time_point& noticed) const {
  if (notices() == MPI_COMM_NULL) return false;
  int flag = 0;
  MPI_Iprobe(world_ranks_[static_cast<std::size_t>(peer)], kFinishTag, notices(), &flag, MPI_STATUS_IGNORE);
  if (!flag) return false;
  const auto now = Clock::now();
  if (noticed == Clock::time_point{}) noticed = now;
  return now - noticed >= kNoticeGrace;
}

PeerFailed MpiLink::peer_finished(CollectiveKind kind, int peer, std::string_view what) {
  broken_ = true;  // the request this call posted can never complete
  broken_msg_ = fmt::format("rank {} returned from its program during {}", peer, collective_name(kind));
  return PeerFailed(
      fmt::format("[mpi] {} on rank {} of {}: rank {} returned from its program (launch()'s body) "
                  "while this rank was {}",
                  collective_name(kind), rank_, size_, peer, what));
}

void MpiLink::wait(CollectiveKind kind, MPI_Request& req) {
  const auto deadline = Clock::now() + timeout_;
  for (int spins = 0;; ++spins) {
    int flag = 0;
    check(kind, MPI_Test(&req, &flag, MPI_STATUS_IGNORE));
    if (flag) return;
    if (checkpoint(spins) && Clock::now() >= deadline)
      throw timed_out(kind, "inside the call, after every rank had arrived");
  }
}

bool MpiLink::checkpoint(int spins) const {
  if (spins < 64) return false;
  if (oversubscribed_) sched_yield();
  return (spins & 63) == 0;
}

CommTimeout MpiLink::timed_out(CollectiveKind kind, std::string_view why) {
  broken_ = true;
  broken_msg_ = fmt::format("{} timed out after {} ms {}", collective_name(kind), timeout_.count(), why);
  return CommTimeout(fmt::format("[mpi] {} on rank {} of {} timed out after {} ms {}", collective_name(kind), rank_,
                                 size_, timeout_.count(), why));
}

void MpiLink::check(CollectiveKind kind, int rc) const {
  if (rc != MPI_SUCCESS)
    throw CommError(
        fmt::format("[mpi] {} on rank {} of {}: {}", collective_name(kind), rank_, size_, mpi_error_text(rc)));
}

void MpiLink::send(const void* buf, std::size_t bytes, int dst, int tag) {
  constexpr auto kind = CollectiveKind::Send;
  reap_sends();
  auto& s = pending_.emplace_back();
  s.data.resize(bytes);
  if (bytes != 0) std::memcpy(s.data.data(), buf, bytes);
  check(kind, MPI_Isend(s.data.data(), as_int(kind, "bytes", bytes), MPI_BYTE, dst, tag, comm_, &s.request));
}

void MpiLink::reap_sends() {
  while (!pending_.empty()) {
    int flag = 0;
    MPI_Test(&pending_.front().request, &flag, MPI_STATUS_IGNORE);
    if (!flag) return;
    pending_.pop_front();
  }
}

void MpiLink::drain_sends() {
  for (auto& s : pending_) wait(CollectiveKind::Send, s.request);
  pending_.clear();
}

int MpiLink::probe(int src, int tag) {
  constexpr auto kind = CollectiveKind::Recv;
  int flag = 0;
  MPI_Status status;
  const auto deadline = Clock::now() + timeout_;
  Clock::time_point noticed{};
  for (int spins = 0;; ++spins) {
    check(kind, MPI_Iprobe(src, tag, comm_, &flag, &status));
    if (flag) break;
    reap_sends();
    if (!checkpoint(spins)) continue;
    const auto what = fmt::format("waiting for a message from rank {} (tag {})", src, tag);
    if (Clock::now() >= deadline) throw timed_out(kind, what);
    if (finished(src, noticed)) throw peer_finished(kind, src, what);
  }
  int got = 0;
  MPI_Get_count(&status, MPI_BYTE, &got);
  return got;
}

int MpiLink::as_int(CollectiveKind kind, std::string_view what, std::size_t value) const {
  if (value > static_cast<std::size_t>(INT_MAX))
    throw UnsupportedError(fmt::format("[mpi] {} on rank {}: {} = {} exceeds MPI's int counts (at most {})",
                                       collective_name(kind), rank_, what, value, INT_MAX));
  return static_cast<int>(value);
}

}  // namespace dtensor::mpi_detail
