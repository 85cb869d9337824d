// The MPI backend: one rank per process, collectives mapped one to one onto
// MPI's (uneven all_gather -> Iallgatherv, all_to_all -> Ialltoallv, ...).
//
// Every collective starts with an arrival: each rank sends a signature of
// its call (kind, dtype, reduce op, root, count, a hash of the per-rank
// sizes, its sequence number on the communicator; call_signature.h) to every
// peer on a private duplicate communicator and polls for theirs against the
// deadline. Then
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
// The call itself:
//  - small calls (under 64 KiB in all) are the nonblocking form of the
//    collective, completed by a polling loop that checks the deadline;
//  - larger calls make the blocking call. Open MPI's blocking collectives use faster
//    algorithms than its nonblocking ones (libnbc): 1 MiB all_reduce on 2
//    ranks took 0.27 ms as Iallreduce and 0.23 ms blocking, the same as the
//    barrier plus the blocking call.
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
//
// Byte accounting follows the contract in communicator.h exactly, by the
// same formulas as the threads backend, so the planner's predictions and the
// tests' assertions hold on either backend.
// The C API only: MPI's deprecated C++ bindings warn under -Wextra.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <climits>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtensor/core/error.h"
#include "argument_checks.h"
#include "exact_average.h"
#include "stats_recorder.h"
#include "dtensor/core/shape.h"
#include "dtensor/core/tensor.h"
#include "dtensor/mesh/backends.h"
#include "call_signature.h"
#include "mpi_runtime.h"

namespace dtensor {
namespace {

using namespace mpi_detail;
using Clock = std::chrono::steady_clock;

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::Float32: return MPI_FLOAT;
    case DType::Float64: return MPI_DOUBLE;
    case DType::Int64: return MPI_INT64_T;
    // MPI has no 16-bit floats: their bits travel as 16-bit integers and the
    // reductions are our own operations (half_op below).
    case DType::BFloat16:
    case DType::Float16: return MPI_UINT16_T;
  }
  return MPI_DATATYPE_NULL;
}

void copy_bytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes != 0 && dst != src) std::memcpy(dst, src, bytes);
}

// A user-defined MPI reduction through reduce_into, the element rule the
// threads backend uses (core/include/dtensor/core/detail/combine.h): for bf16/f16 bits,
// each pairwise step in float, rounded once; for floating max/min, NaN
// propagates (MPI_MAX and MPI_MIN compare with < and drop it, so the result
// depended on which rank held the NaN). Never throws (MPI calls it from C).
template <DType D, ReduceOp Op>
void user_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_into(inout, in, static_cast<std::size_t>(*len), D, Op);
}

template <DType D>
MPI_Op user_op(ReduceOp op) {
  // Created once, after MPI_Init (the first reduction runs after it); MPI
  // frees them at MPI_Finalize.
  static const std::array<MPI_Op, 3> ops = [] {
    std::array<MPI_Op, 3> out{};
    MPI_Op_create(&user_reduce<D, ReduceOp::Sum>, 1, &out[0]);
    MPI_Op_create(&user_reduce<D, ReduceOp::Max>, 1, &out[1]);
    MPI_Op_create(&user_reduce<D, ReduceOp::Min>, 1, &out[2]);
    return out;
  }();
  return op == ReduceOp::Max ? ops[1] : op == ReduceOp::Min ? ops[2] : ops[0];
}

MPI_Op mpi_op(ReduceOp op, DType dtype) {
  if (dtype == DType::BFloat16) return user_op<DType::BFloat16>(op);
  if (dtype == DType::Float16) return user_op<DType::Float16>(op);
  if (op == ReduceOp::Max || op == ReduceOp::Min) {
    if (dtype == DType::Float32) return user_op<DType::Float32>(op);
    if (dtype == DType::Float64) return user_op<DType::Float64>(op);
  }
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return MPI_SUM;  // Avg divides afterwards
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_SUM;
}

// A buffered point-to-point send in flight: the data is ours until MPI
// completes the request, so send() returns at once as on the threads backend.
struct PendingSend {
  std::vector<std::byte> data;
  MPI_Request request = MPI_REQUEST_NULL;
};

// Calls moving at least this many bytes on a rank take the blocking path.
constexpr std::size_t kBlockingBytes = 64 << 10;

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::shared_ptr<CommStats> stats, std::chrono::milliseconds timeout,
                  bool oversubscribed)
      : comm_(comm),
        rank_stats_(std::move(stats)),
        stats_(*rank_stats_),
        timeout_(timeout),
        oversubscribed_(oversubscribed) {
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

  ~MpiCommunicator() override {
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

  using Communicator::all_gather;  // keep the equal-size overload visible

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "mpi"; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  CommStats& stats() override { return stats_.rank_totals(); }
  const CommStats& own_stats() const override { return stats_.own(); }

  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) override {
    if (reduces_as_average_pairs(dtype, op, size()))
      return backend_detail::all_reduce_integer_average(*this, send, recv, count);
    constexpr auto kind = CollectiveKind::AllReduce;
    const MPI_Datatype type = check_dtype(kind, dtype);
    const std::size_t isz = itemsize(dtype);
    enter(kind);
    if (size_ > 1) {
      Signature sig = make_signature(kind, dtype, op);
      sig[kCount] = count;
      if (const auto* avg = backend_detail::carried_average()) {  // the pairs of an int64 Avg
        sig[kOp] = static_cast<std::uint64_t>(ReduceOp::Avg);
        sig[kCount] = avg->count;
      }
      arrive(sig);
    }
    if (size_ > 1 && count > 0) {
      const void* in = send == recv ? MPI_IN_PLACE : send;
      const int n = as_int(kind, "count", count);
      collective(
          kind, count * isz, [&] { return MPI_Allreduce(in, recv, n, type, mpi_op(op, dtype), comm_); },
          [&](MPI_Request* req) { return MPI_Iallreduce(in, recv, n, type, mpi_op(op, dtype), comm_, req); });
      if (op == ReduceOp::Avg) divide_by(recv, count, dtype, size_);
    } else if (send != recv) {
      copy_bytes(recv, send, count * isz);
    }
    stats_.record(kind, static_cast<std::uint64_t>(all_reduce_recv_bytes(count, size_, rank_, dtype, op)));
  }

  void all_gather(const void* send, void* recv, std::span<const std::size_t> recv_bytes) override {
    constexpr auto kind = CollectiveKind::AllGather;
    check_entries(kind, "recv_bytes", recv_bytes.size());
    enter(kind);
    auto& counts = ints_a_;
    auto& displs = ints_b_;
    const std::size_t total = to_counts(kind, recv_bytes, counts, displs);
    const auto r = static_cast<std::size_t>(rank_);
    if (size_ > 1) {
      Signature sig = make_signature(kind);
      sig[kCount] = total;
      sig[kSizes] = sizes_hash(recv_bytes);
      arrive(sig, recv_bytes);
    }
    if (size_ > 1 && total > 0) {
      // A send buffer that already sits in its place in recv must be passed
      // as MPI_IN_PLACE: MPI forbids aliased buffers otherwise.
      const bool in_place = send == static_cast<const std::byte*>(recv) + displs[r];
      const void* in = in_place ? MPI_IN_PLACE : send;
      // Equal blocks take MPI_Allgather, whose algorithms are tuned for them.
      const bool equal = std::all_of(counts.begin(), counts.end(), [&](int c) { return c == counts[0]; });
      collective(
          kind, total,
          [&] {
            return equal ? MPI_Allgather(in, counts[r], MPI_BYTE, recv, counts[0], MPI_BYTE, comm_)
                         : MPI_Allgatherv(in, counts[r], MPI_BYTE, recv, counts.data(), displs.data(), MPI_BYTE, comm_);
          },
          [&](MPI_Request* req) {
            return equal ? MPI_Iallgather(in, counts[r], MPI_BYTE, recv, counts[0], MPI_BYTE, comm_, req)
                         : MPI_Iallgatherv(in, counts[r], MPI_BYTE, recv, counts.data(), displs.data(), MPI_BYTE, comm_,
                                           req);
          });
    } else {
      copy_bytes(static_cast<std::byte*>(recv) + displs[r], send, recv_bytes[r]);
    }
    stats_.record(kind, total - recv_bytes[r]);
  }

  void reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts, DType dtype,
                      ReduceOp op) override {
    if (reduces_as_average_pairs(dtype, op, size()))
      return backend_detail::reduce_scatter_integer_average(*this, send, recv, counts);
    constexpr auto kind = CollectiveKind::ReduceScatter;
    const MPI_Datatype type = check_dtype(kind, dtype);
    const std::size_t isz = itemsize(dtype);
    check_entries(kind, "counts", counts.size());
    enter(kind);
    auto& elems = ints_a_;
    auto& offsets = ints_b_;
    const std::size_t total = to_counts(kind, counts, elems, offsets);
    const auto r = static_cast<std::size_t>(rank_);
    const std::size_t mine = counts[r];
    const auto* own = static_cast<const std::byte*>(send) + static_cast<std::size_t>(offsets[r]) * isz;
    if (size_ > 1) {
      Signature sig = make_signature(kind, dtype, op);
      sig[kCount] = total;
      sig[kSizes] = sizes_hash(counts);
      if (const auto* avg = backend_detail::carried_average()) {  // the pairs of an int64 Avg
        sig[kOp] = static_cast<std::uint64_t>(ReduceOp::Avg);
        sig[kCount] = total / 2;
        sig[kSizes] = sizes_hash(avg->counts);
        arrive(sig, avg->counts);
      } else {
        arrive(sig, counts);
      }
    }
    if (size_ > 1 && total > 0) {
      // MPI forbids recv overlapping send (the contract allows recv to be
      // this rank's own block), and MPICH checks even an empty recv whose
      // pointer lies inside send: reduce into scratch then.
      const auto* send_begin = static_cast<const std::byte*>(send);
      const auto* send_end = send_begin + total * isz;
      auto* out = static_cast<std::byte*>(recv);
      const bool overlaps =
          (out >= send_begin && out <= send_end) || (mine != 0 && out < send_end && out + mine * isz > send_begin);
      std::byte* target = out;
      if (overlaps) {
        scratch_.resize(std::max<std::size_t>(mine, 1) * isz);
        target = scratch_.data();
      }
      const bool equal = std::all_of(elems.begin(), elems.end(), [&](int c) { return c == elems[0]; });
      collective(
          kind, total * isz,
          [&] {
            return equal ? MPI_Reduce_scatter_block(send, target, elems[0], type, mpi_op(op, dtype), comm_)
                         : MPI_Reduce_scatter(send, target, elems.data(), type, mpi_op(op, dtype), comm_);
          },
          [&](MPI_Request* req) {
            return equal ? MPI_Ireduce_scatter_block(send, target, elems[0], type, mpi_op(op, dtype), comm_, req)
                         : MPI_Ireduce_scatter(send, target, elems.data(), type, mpi_op(op, dtype), comm_, req);
          });
      if (op == ReduceOp::Avg) divide_by(target, mine, dtype, size_);
      if (overlaps) copy_bytes(out, target, mine * isz);
    } else if (recv != own) {
      copy_bytes(recv, own, mine * isz);
    }
    stats_.record(kind, static_cast<std::uint64_t>(reduce_scatter_recv_bytes(mine, size_, dtype, op)));
  }

  void all_to_all(const void* send, std::span<const std::size_t> send_bytes, std::span<const std::size_t> send_offsets,
                  void* recv, std::span<const std::size_t> recv_bytes,
                  std::span<const std::size_t> recv_offsets) override {
    constexpr auto kind = CollectiveKind::AllToAll;
    checks().all_to_all(send_bytes, send_offsets, recv_bytes, recv_offsets);
    const auto r = static_cast<std::size_t>(rank_);
    enter(kind);
    std::size_t received = 0;
    for (int p = 0; p < size_; ++p)
      if (p != rank_) received += recv_bytes[static_cast<std::size_t>(p)];
    if (size_ > 1) {
      // Alltoallv's self block is copied here rather than by MPI: it may
      // overlap nothing else, and MPI's self copy is no faster.
      auto& sc = ints_a_;
      auto& sd = ints_b_;
      auto& rc = ints_c_;
      auto& rd = ints_d_;
      sc.resize(static_cast<std::size_t>(size_));
      sd.resize(sc.size());
      rc.resize(sc.size());
      rd.resize(sc.size());
      for (std::size_t p = 0; p < sc.size(); ++p) {
        const bool self = p == r;
        sc[p] = self ? 0 : as_int(kind, "send_bytes", send_bytes[p]);
        sd[p] = as_int(kind, "send_offsets", send_offsets[p]);
        rc[p] = self ? 0 : as_int(kind, "recv_bytes", recv_bytes[p]);
        rd[p] = as_int(kind, "recv_offsets", recv_offsets[p]);
      }
      // Equal blocks back to back in rank order (as exchanges between even
      // shards are) can take MPI_Alltoall, self block included. Whether a
      // call is regular is known per rank only, and every rank must make
      // the same MPI call, so the arrival combines the ranks' flags; the
      // exchange itself is then MPI's blocking call, its fastest.
      const std::size_t block = send_bytes[0];
      bool regular = send != recv && block <= static_cast<std::size_t>(INT_MAX);
      for (std::size_t p = 0; p < sc.size() && regular; ++p)
        regular = send_bytes[p] == block && recv_bytes[p] == block && send_offsets[p] == p * block &&
                  recv_offsets[p] == p * block;
      Signature sig = make_signature(kind);
      sig[kBalance] = all_to_all_balance(rank_, send_bytes, recv_bytes);
      sig[kRegular] = regular ? 1 : 0;
      if (arrive(sig, send_bytes, recv_bytes)) {
        const int b = static_cast<int>(block);
        check(kind, MPI_Alltoall(send, b, MPI_BYTE, recv, b, MPI_BYTE, comm_));
      } else {
        copy_bytes(static_cast<std::byte*>(recv) + recv_offsets[r],
                   static_cast<const std::byte*>(send) + send_offsets[r], recv_bytes[r]);
        check(kind, MPI_Alltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE, comm_));
      }
    } else {
      copy_bytes(static_cast<std::byte*>(recv) + recv_offsets[r], static_cast<const std::byte*>(send) + send_offsets[r],
                 recv_bytes[r]);
    }
    stats_.record(kind, received);
  }

  void broadcast(void* buf, std::size_t bytes, int root) override {
    constexpr auto kind = CollectiveKind::Broadcast;
    check_root(kind, root);
    enter(kind);
    if (size_ > 1) {
      Signature sig = make_signature(kind);
      sig[kCount] = bytes;
      sig[kRoot] = static_cast<std::uint64_t>(root);
      arrive(sig);
    }
    if (size_ > 1 && bytes > 0) {
      const int n = as_int(kind, "bytes", bytes);
      collective(
          kind, bytes, [&] { return MPI_Bcast(buf, n, MPI_BYTE, root, comm_); },
          [&](MPI_Request* req) { return MPI_Ibcast(buf, n, MPI_BYTE, root, comm_, req); });
    }
    stats_.record(kind, size_ > 1 && rank_ != root ? bytes : 0);
  }

  void scatter(const void* send, std::span<const std::size_t> bytes, void* recv, int root) override {
    constexpr auto kind = CollectiveKind::Scatter;
    check_entries(kind, "bytes", bytes.size());
    check_root(kind, root);
    enter(kind);
    auto& counts = ints_a_;
    auto& displs = ints_b_;
    const std::size_t total = to_counts(kind, bytes, counts, displs);
    const std::size_t mine = bytes[static_cast<std::size_t>(rank_)];
    if (size_ > 1) {
      Signature sig = make_signature(kind);
      sig[kCount] = total;
      sig[kSizes] = sizes_hash(bytes);
      sig[kRoot] = static_cast<std::uint64_t>(root);
      arrive(sig, bytes);
    }
    if (size_ > 1 && total > 0) {
      const int n = static_cast<int>(mine);
      collective(
          kind, total,
          [&] { return MPI_Scatterv(send, counts.data(), displs.data(), MPI_BYTE, recv, n, MPI_BYTE, root, comm_); },
          [&](MPI_Request* req) {
            return MPI_Iscatterv(send, counts.data(), displs.data(), MPI_BYTE, recv, n, MPI_BYTE, root, comm_, req);
          });
    } else if (size_ == 1) {
      copy_bytes(recv, send, mine);
    }
    stats_.record(kind, size_ > 1 && rank_ != root ? mine : 0);
  }

  void send(const void* buf, std::size_t bytes, int dst, int tag) override {
    constexpr auto kind = CollectiveKind::SendRecv;
    check_peer("send to", dst);
    enter(kind);
    reap_sends();
    auto& s = pending_.emplace_back();
    s.data.resize(bytes);
    copy_bytes(s.data.data(), buf, bytes);
    check(kind, MPI_Isend(s.data.data(), as_int(kind, "bytes", bytes), MPI_BYTE, dst, tag, comm_, &s.request));
    stats_.record_message(true, rank_, dst, tag, 0);
  }

  void recv(void* buf, std::size_t bytes, int src, int tag) override {
    constexpr auto kind = CollectiveKind::SendRecv;
    check_peer("recv from", src);
    enter(kind);
    // Probe first: the threads backend reports a size mismatch as CommError,
    // and a plain receive of the wrong size would truncate or under-fill.
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
    // A message of the wrong size is still taken off the queue (as on the
    // threads backend), so that the next receive sees the next message.
    const bool mismatch = static_cast<std::size_t>(got) != bytes;
    if (mismatch) scratch_.resize(static_cast<std::size_t>(got));
    MPI_Request req;
    check(kind, MPI_Irecv(mismatch ? scratch_.data() : buf, got, MPI_BYTE, src, tag, comm_, &req));
    wait(kind, req);
    if (mismatch) {
      stats_.drop_message(false, rank_, src, tag);
      throw CommError(
          fmt::format("[mpi] recv on rank {} of {} from rank {} (tag {}): expected {} bytes but the "
                      "matching send has {} bytes",
                      rank_, size_, src, tag, bytes, got));
    }
    stats_.record_message(false, rank_, src, tag, bytes);
  }

  void barrier() override {
    constexpr auto kind = CollectiveKind::Barrier;
    enter(kind);
    if (size_ > 1) arrive(make_signature(kind));  // a barrier in itself
    stats_.record(kind, 0);
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    constexpr auto kind = CollectiveKind::Split;
    enter(kind);
    // MPI_Comm_split blocks without a deadline; the arrival first makes
    // sure every rank is here, after which the split cannot hang.
    if (size_ > 1) arrive(make_signature(kind));
    MPI_Comm out = MPI_COMM_NULL;
    check(kind, MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &out));
    stats_.record(kind, 0);
    if (out == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiCommunicator>(out, rank_stats_, timeout_, oversubscribed_);
  }

 private:
  // Runs one collective of `bytes`, after the arrival: blocking when large,
  // else nonblocking and polled (see the top of the file). Both forms must
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

  // The arrival every collective makes first (see the top of the file):
  // sends `sig` to every peer, waits for theirs until the deadline, and
  // throws CollectiveMismatch on every rank when they differ. `v0`/`v1` are
  // the per-rank lists the call passed, read only to describe a mismatch.
  // Returns whether every rank's kRegular word is set.
  bool arrive(Signature sig, std::span<const std::size_t> v0 = {}, std::span<const std::size_t> v1 = {}) {
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
      check(kind, MPI_Irecv(signatures_.data() + p * kSignatureWords, kSignatureWords, MPI_UINT64_T,
                            static_cast<int>(p), kSignatureTag, ctl_, &requests_[i]));
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
      check(kind, MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, sizes_.data(), static_cast<int>(2 * n),
                                 MPI_UINT64_T, ctl_, &req));
      wait(kind, req);
      throw CollectiveMismatch(mismatch_message(signatures_, sizes_, size_, rank_));
    }
    for (std::size_t p = 0; p < n; ++p)
      if (signatures_[p * kSignatureWords + kRegular] == 0) return false;
    return true;
  }

  // While an arrival waits: the peers whose signature has not come. (Each
  // receive is tested on its own: one that completes here is freed and left
  // as MPI_REQUEST_NULL, which later tests count as done.)
  std::vector<int> missing_peers() {
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

  // An arrival given up: its receives still pending are cancelled, so that a
  // late signature can never land in memory this object may since have
  // freed. (The sends are eager copies: nothing reads mine_ any more.)
  void abandon_receives() {
    for (std::size_t i = 0; i + 1 < static_cast<std::size_t>(size_); ++i) {
      if (requests_[i] == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&requests_[i]);
      MPI_Request_free(&requests_[i]);
    }
  }

  // Whether `peer`'s end-of-program notice has stood for kNoticeGrace;
  // `noticed` keeps when one was first seen.
  bool finished(int peer, Clock::time_point& noticed) const {
    if (notices() == MPI_COMM_NULL) return false;
    int flag = 0;
    MPI_Iprobe(world_ranks_[static_cast<std::size_t>(peer)], kFinishTag, notices(), &flag, MPI_STATUS_IGNORE);
    if (!flag) return false;
    const auto now = Clock::now();
    if (noticed == Clock::time_point{}) noticed = now;
    return now - noticed >= kNoticeGrace;
  }

  PeerFailed peer_finished(CollectiveKind kind, int peer, std::string_view what) {
    broken_ = true;  // the request this call posted can never complete
    broken_msg_ = fmt::format("rank {} returned from its program during {}", peer, collective_name(kind));
    return PeerFailed(
        fmt::format("[mpi] {} on rank {} of {}: rank {} returned from its program (launch()'s body) "
                    "while this rank was {}",
                    collective_name(kind), rank_, size_, peer, what));
  }

  // Fails at once on a communicator that an earlier timeout left unusable.
  void enter(CollectiveKind kind) {
    if (broken_)
      throw CommTimeout(fmt::format("[mpi] {} on rank {} of {}: the communicator is unusable: {}",
                                    collective_name(kind), rank_, size_, broken_msg_));
    stats_.begin();
  }

  // Completes `req`, polling MPI (which drives its progress engine) until
  // the deadline.
  // Every rank has arrived by then (see arrive()): only a rank that died
  // mid-transfer can keep it from completing.
  void wait(CollectiveKind kind, MPI_Request& req) {
    const auto deadline = Clock::now() + timeout_;
    for (int spins = 0;; ++spins) {
      int flag = 0;
      check(kind, MPI_Test(&req, &flag, MPI_STATUS_IGNORE));
      if (flag) return;
      if (checkpoint(spins) && Clock::now() >= deadline)
        throw timed_out(kind, "inside the call, after every rank had arrived");
    }
  }

  // Between polls: give the core to a peer when ranks outnumber cores, and
  // say whether this poll is one that checks the deadline (every 64th).
  bool checkpoint(int spins) const {
    if (spins < 64) return false;
    if (oversubscribed_) sched_yield();
    return (spins & 63) == 0;
  }

  // Marks the communicator broken (a request is left incomplete).
  CommTimeout timed_out(CollectiveKind kind, std::string_view why) {
    broken_ = true;
    broken_msg_ = fmt::format("{} timed out after {} ms {}", collective_name(kind), timeout_.count(), why);
    return CommTimeout(fmt::format("[mpi] {} on rank {} of {} timed out after {} ms {}", collective_name(kind), rank_,
                                   size_, timeout_.count(), why));
  }

  void reap_sends() {
    while (!pending_.empty()) {
      int flag = 0;
      MPI_Test(&pending_.front().request, &flag, MPI_STATUS_IGNORE);
      if (!flag) return;
      pending_.pop_front();
    }
  }

  void drain_sends() {
    for (auto& s : pending_) wait(CollectiveKind::SendRecv, s.request);
    pending_.clear();
  }

  void check(CollectiveKind kind, int rc) const {
    if (rc != MPI_SUCCESS)
      throw CommError(
          fmt::format("[mpi] {} on rank {} of {}: {}", collective_name(kind), rank_, size_, mpi_error_text(rc)));
  }

  MPI_Datatype check_dtype(CollectiveKind kind, DType dtype) const {
    const MPI_Datatype type = mpi_type(dtype);
    if (type == MPI_DATATYPE_NULL)
      throw DTypeError(fmt::format("[mpi] {} on rank {}: unknown dtype code {}", collective_name(kind), rank_,
                                   static_cast<int>(dtype)));
    return type;
  }

  int as_int(CollectiveKind kind, std::string_view what, std::size_t value) const {
    if (value > static_cast<std::size_t>(INT_MAX))
      throw UnsupportedError(fmt::format("[mpi] {} on rank {}: {} = {} exceeds MPI's int counts (at most {})",
                                         collective_name(kind), rank_, what, value, INT_MAX));
    return static_cast<int>(value);
  }

  // counts -> int counts and their prefix sums; returns the total.
  std::size_t to_counts(CollectiveKind kind, std::span<const std::size_t> counts, std::vector<int>& out,
                        std::vector<int>& displs) const {
    out.resize(counts.size());
    displs.resize(counts.size());
    std::size_t total = 0;
    for (std::size_t p = 0; p < counts.size(); ++p) {
      displs[p] = as_int(kind, "offset", total);
      out[p] = as_int(kind, "count", counts[p]);
      total += counts[p];
    }
    as_int(kind, "total", total);
    return total;
  }

  backend_detail::ArgumentChecks checks() const { return {"mpi", rank_, size_}; }
  void check_entries(CollectiveKind kind, std::string_view what, std::size_t entries) const {
    checks().entries(kind, what, entries);
  }
  void check_root(CollectiveKind kind, int root) const { checks().root(kind, root); }
  void check_peer(std::string_view what, int peer) const { checks().peer(what, peer); }

  static constexpr int kSignatureTag = 1;

  MPI_Comm comm_;
  MPI_Comm ctl_ = MPI_COMM_NULL;  // arrivals only: user tags on comm_ never match them
  int rank_ = 0;
  int size_ = 1;
  std::shared_ptr<CommStats> rank_stats_;  // kept alive here, handed on to splits
  backend_detail::StatsRecorder stats_;
  std::chrono::milliseconds timeout_;
  bool oversubscribed_;
  bool broken_ = false;
  std::string broken_msg_;
  std::deque<PendingSend> pending_;
  // Reused argument arrays (MPI takes int counts): no allocation per call.
  std::vector<int> ints_a_, ints_b_, ints_c_, ints_d_;
  std::vector<std::byte> scratch_;
  // The arrival's state, reused from call to call.
  std::uint64_t seq_ = 0;
  Signature mine_{};
  std::vector<std::uint64_t> signatures_;
  std::vector<MPI_Request> requests_;
  std::vector<std::size_t> sizes_;
  std::vector<int> world_ranks_;  // member -> MPI_COMM_WORLD rank
};

}  // namespace

bool mpi_available() { return true; }

std::unique_ptr<Communicator> mpi_world(MpiOptions options) {
  ensure_initialized();
  MPI_Comm comm;
  // A private copy: user code's own MPI traffic never matches ours.
  const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  if (rc != MPI_SUCCESS) throw CommError(fmt::format("[mpi] MPI_Comm_dup failed: {}", mpi_error_text(rc)));
  // Ranks outnumber cores when the processes sharing this node do.
  MPI_Comm node;
  int node_ranks = 1;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
    MPI_Comm_size(node, &node_ranks);
    MPI_Comm_free(&node);
  }
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const bool oversubscribed = cores > 0 && node_ranks > cores;
  // Every communicator split from this world on this process shares one
  // CommStats, as the contract says.
  return std::make_unique<MpiCommunicator>(comm, std::make_shared<CommStats>(), options.timeout, oversubscribed);
}

}  // namespace dtensor
