// The MPI backend: one rank per process, collectives mapped one to one onto
// MPI's (uneven all_gather -> Iallgatherv, all_to_all -> Ialltoallv, ...).
//
// Every collective starts with an arrival (mpi_link.cpp): the ranks
// exchange signatures of their calls, so that past it every rank is in the
// same call with the same sizes, and a mismatch or a missing rank throws on
// every rank alike. The call itself:
//  - small calls (under 64 KiB in all) are the nonblocking form of the
//    collective, completed by a polling loop that checks the deadline;
//  - larger calls make the blocking call. Open MPI's blocking collectives use faster
//    algorithms than its nonblocking ones (libnbc): 1 MiB all_reduce on 2
//    ranks took 0.27 ms as Iallreduce and 0.23 ms blocking, the same as the
//    barrier plus the blocking call.
//
// Byte accounting follows the contract in communicator.h exactly, by the
// same formulas as the threads backend, so the planner's predictions and the
// tests' assertions hold on either backend.
#include "mpi_link.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backend_communicator.h"
#include "call_signature.h"
#include "dtensor/core/error.h"
#include "dtensor/core/tensor.h"
#include "dtensor/mesh/backends.h"
#include "exact_average.h"
#include "mpi_runtime.h"

namespace dtensor {
namespace mpi_detail {
namespace {

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::Float32: return MPI_FLOAT;
    case DType::Float64: return MPI_DOUBLE;
    case DType::Int64: return MPI_INT64_T;
    // MPI has no 16-bit floats: their bits travel as 16-bit integers and the
    // reductions are our own operations (user_op below).
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
  return backend_detail::native_op(op, ops[0], ops[1], ops[2]);
}

MPI_Op mpi_op(ReduceOp op, DType dtype) {
  if (dtype == DType::BFloat16) return user_op<DType::BFloat16>(op);
  if (dtype == DType::Float16) return user_op<DType::Float16>(op);
  if (op == ReduceOp::Max || op == ReduceOp::Min) {
    if (dtype == DType::Float32) return user_op<DType::Float32>(op);
    if (dtype == DType::Float64) return user_op<DType::Float64>(op);
  }
  return backend_detail::native_op(op, MPI_SUM, MPI_MAX, MPI_MIN);
}

class MpiCommunicator final : public backend_detail::BackendCommunicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::shared_ptr<CommStats> stats, std::chrono::milliseconds timeout,
                  bool oversubscribed)
      : BackendCommunicator(*stats), link_(comm, timeout, oversubscribed), rank_stats_(std::move(stats)) {}
  ~MpiCommunicator() override { finish_started_calls(); }

  int rank() const override { return link_.rank(); }
  int size() const override { return link_.size(); }
  std::string_view backend() const override { return "mpi"; }
  std::chrono::milliseconds timeout() const override { return link_.timeout(); }

 protected:
  // Fails at once on a communicator that an earlier timeout left unusable.
  void enter(CollectiveKind kind) override { link_.check_usable(kind); }

  void do_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) override {
    constexpr auto kind = CollectiveKind::AllReduce;
    if (size() > 1) {
      const auto made = backend_detail::all_reduce_as_made(op, count);
      Signature sig = make_signature(kind, dtype, made.op);
      sig[kCount] = made.count;
      link_.arrive(sig);
    }
    if (size() == 1 || count == 0) return copy_bytes(recv, send, count * itemsize(dtype));
    const void* in = send == recv ? MPI_IN_PLACE : send;
    const int n = link_.as_int(kind, "count", count);
    const MPI_Datatype type = mpi_type(dtype);
    const MPI_Op reduce = mpi_op(op, dtype);
    link_.collective(
        kind, count * itemsize(dtype), [&] { return MPI_Allreduce(in, recv, n, type, reduce, link_.comm()); },
        [&](MPI_Request* req) { return MPI_Iallreduce(in, recv, n, type, reduce, link_.comm(), req); });
    divide_average(recv, count, dtype, op);
  }

  void do_all_gather(const void* send, void* recv, std::span<const std::size_t> recv_bytes) override {
    constexpr auto kind = CollectiveKind::AllGather;
    const std::size_t total = to_counts(kind, recv_bytes);
    const auto r = static_cast<std::size_t>(rank());
    if (size() > 1) {
      Signature sig = make_signature(kind);
      sig[kCount] = total;
      sig[kSizes] = sizes_hash(recv_bytes);
      link_.arrive(sig, recv_bytes);
    }
    if (size() == 1 || total == 0) return copy_bytes(static_cast<std::byte*>(recv) + displs_[r], send, recv_bytes[r]);
    // A send buffer that already sits in its place in recv must be passed
    // as MPI_IN_PLACE: MPI forbids aliased buffers otherwise.
    const bool in_place = send == static_cast<const std::byte*>(recv) + displs_[r];
    const void* in = in_place ? MPI_IN_PLACE : send;
    // Equal blocks take MPI_Allgather, whose algorithms are tuned for them.
    const bool equal = std::all_of(counts_.begin(), counts_.end(), [&](int c) { return c == counts_[0]; });
    const int* counts = counts_.data();
    const int* displs = displs_.data();
    link_.collective(
        kind, total,
        [&] {
          return equal ? MPI_Allgather(in, counts[r], MPI_BYTE, recv, counts[0], MPI_BYTE, link_.comm())
                       : MPI_Allgatherv(in, counts[r], MPI_BYTE, recv, counts, displs, MPI_BYTE, link_.comm());
        },
        [&](MPI_Request* req) {
          return equal ? MPI_Iallgather(in, counts[r], MPI_BYTE, recv, counts[0], MPI_BYTE, link_.comm(), req)
                       : MPI_Iallgatherv(in, counts[r], MPI_BYTE, recv, counts, displs, MPI_BYTE, link_.comm(), req);
        });
  }

  void do_reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts, DType dtype,
                         ReduceOp op) override {
    constexpr auto kind = CollectiveKind::ReduceScatter;
    const std::size_t isz = itemsize(dtype);
    const std::size_t total = to_counts(kind, counts);
    const auto r = static_cast<std::size_t>(rank());
    const std::size_t mine = counts[r];
    const auto* own = static_cast<const std::byte*>(send) + static_cast<std::size_t>(displs_[r]) * isz;
    if (size() > 1) {
      const auto made = backend_detail::reduce_scatter_as_made(op, counts);
      Signature sig = make_signature(kind, dtype, made.op);
      sig[kCount] = made.count;
      sig[kSizes] = sizes_hash(made.counts);
      link_.arrive(sig, made.counts);
    }
    if (size() == 1 || total == 0) return copy_bytes(recv, own, mine * isz);
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
    const bool equal = std::all_of(counts_.begin(), counts_.end(), [&](int c) { return c == counts_[0]; });
    const MPI_Datatype type = mpi_type(dtype);
    const MPI_Op reduce = mpi_op(op, dtype);
    const int* elems = counts_.data();
    link_.collective(
        kind, total * isz,
        [&] {
          return equal ? MPI_Reduce_scatter_block(send, target, elems[0], type, reduce, link_.comm())
                       : MPI_Reduce_scatter(send, target, elems, type, reduce, link_.comm());
        },
        [&](MPI_Request* req) {
          return equal ? MPI_Ireduce_scatter_block(send, target, elems[0], type, reduce, link_.comm(), req)
                       : MPI_Ireduce_scatter(send, target, elems, type, reduce, link_.comm(), req);
        });
    divide_average(target, mine, dtype, op);
    if (overlaps) copy_bytes(out, target, mine * isz);
  }

  void do_all_to_all(const void* send, std::span<const std::size_t> send_bytes,
                     std::span<const std::size_t> send_offsets, void* recv, std::span<const std::size_t> recv_bytes,
                     std::span<const std::size_t> recv_offsets) override {
    constexpr auto kind = CollectiveKind::AllToAll;
    const auto r = static_cast<std::size_t>(rank());
    const auto copy_self = [&] {
      copy_bytes(static_cast<std::byte*>(recv) + recv_offsets[r], static_cast<const std::byte*>(send) + send_offsets[r],
                 recv_bytes[r]);
    };
    if (size() == 1) return copy_self();
    // Alltoallv's self block is copied here rather than by MPI: it may
    // overlap nothing else, and MPI's self copy is no faster.
    const auto n = static_cast<std::size_t>(size());
    counts_.resize(n);
    displs_.resize(n);
    recv_counts_.resize(n);
    recv_displs_.resize(n);
    for (std::size_t p = 0; p < n; ++p) {
      const bool self = p == r;
      counts_[p] = self ? 0 : link_.as_int(kind, "send_bytes", send_bytes[p]);
      displs_[p] = link_.as_int(kind, "send_offsets", send_offsets[p]);
      recv_counts_[p] = self ? 0 : link_.as_int(kind, "recv_bytes", recv_bytes[p]);
      recv_displs_[p] = link_.as_int(kind, "recv_offsets", recv_offsets[p]);
    }
    // Equal blocks back to back in rank order (as exchanges between even
    // shards are) can take MPI_Alltoall, self block included. Whether a
    // call is regular is known per rank only, and every rank must make
    // the same MPI call, so the arrival combines the ranks' flags; the
    // exchange itself is then MPI's blocking call, its fastest.
    const std::size_t block = send_bytes[0];
    bool regular = send != recv && block <= static_cast<std::size_t>(INT_MAX);
    for (std::size_t p = 0; p < n && regular; ++p)
      regular = send_bytes[p] == block && recv_bytes[p] == block && send_offsets[p] == p * block &&
                recv_offsets[p] == p * block;
    Signature sig = make_signature(kind);
    sig[kBalance] = all_to_all_balance(rank(), send_bytes, recv_bytes);
    sig[kRegular] = regular ? 1 : 0;
    if (link_.arrive(sig, send_bytes, recv_bytes)) {
      const int b = static_cast<int>(block);
      link_.check(kind, MPI_Alltoall(send, b, MPI_BYTE, recv, b, MPI_BYTE, link_.comm()));
      return;
    }
    copy_self();
    link_.check(kind, MPI_Alltoallv(send, counts_.data(), displs_.data(), MPI_BYTE, recv, recv_counts_.data(),
                                    recv_displs_.data(), MPI_BYTE, link_.comm()));
  }

  void do_broadcast(void* buf, std::size_t bytes, int root) override {
    constexpr auto kind = CollectiveKind::Broadcast;
    if (size() == 1) return;
    Signature sig = make_signature(kind);
    sig[kCount] = bytes;
    sig[kRoot] = static_cast<std::uint64_t>(root);
    link_.arrive(sig);
    if (bytes == 0) return;
    const int n = link_.as_int(kind, "bytes", bytes);
    link_.collective(
        kind, bytes, [&] { return MPI_Bcast(buf, n, MPI_BYTE, root, link_.comm()); },
        [&](MPI_Request* req) { return MPI_Ibcast(buf, n, MPI_BYTE, root, link_.comm(), req); });
  }

  void do_scatter(const void* send, std::span<const std::size_t> bytes, void* recv, int root) override {
    constexpr auto kind = CollectiveKind::Scatter;
    const std::size_t total = to_counts(kind, bytes);
    const int mine = counts_[static_cast<std::size_t>(rank())];
    if (size() == 1) return copy_bytes(recv, send, static_cast<std::size_t>(mine));
    Signature sig = make_signature(kind);
    sig[kCount] = total;
    sig[kSizes] = sizes_hash(bytes);
    sig[kRoot] = static_cast<std::uint64_t>(root);
    link_.arrive(sig, bytes);
    if (total == 0) return;
    const int* counts = counts_.data();
    const int* displs = displs_.data();
    link_.collective(
        kind, total,
        [&] { return MPI_Scatterv(send, counts, displs, MPI_BYTE, recv, mine, MPI_BYTE, root, link_.comm()); },
        [&](MPI_Request* req) {
          return MPI_Iscatterv(send, counts, displs, MPI_BYTE, recv, mine, MPI_BYTE, root, link_.comm(), req);
        });
  }

  void do_send(const void* buf, std::size_t bytes, int dst, int tag) override { link_.send(buf, bytes, dst, tag); }

  std::size_t do_recv(void* buf, std::size_t bytes, int src, int tag) override {
    constexpr auto kind = CollectiveKind::Recv;
    // Probe first: a plain receive of the wrong size would truncate or
    // under-fill, where the skeleton reports the mismatch as CommError.
    const int got = link_.probe(src, tag);
    // A message of the wrong size is still taken off the queue (as on the
    // threads backend), so that the next receive sees the next message.
    const bool mismatch = static_cast<std::size_t>(got) != bytes;
    if (mismatch) scratch_.resize(static_cast<std::size_t>(got));
    MPI_Request req;
    link_.check(kind, MPI_Irecv(mismatch ? scratch_.data() : buf, got, MPI_BYTE, src, tag, link_.comm(), &req));
    link_.wait(kind, req);
    return static_cast<std::size_t>(got);
  }

  void do_barrier() override {
    if (size() > 1) link_.arrive(make_signature(CollectiveKind::Barrier));  // a barrier in itself
  }

  std::unique_ptr<Communicator> do_split(int color, int key) override {
    constexpr auto kind = CollectiveKind::Split;
    // MPI_Comm_split blocks without a deadline; the arrival first makes
    // sure every rank is here, after which the split cannot hang.
    if (size() > 1) link_.arrive(make_signature(kind));
    MPI_Comm out = MPI_COMM_NULL;
    link_.check(kind, MPI_Comm_split(link_.comm(), color < 0 ? MPI_UNDEFINED : color, key, &out));
    if (out == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiCommunicator>(out, rank_stats_, link_.timeout(), link_.oversubscribed());
  }

 private:
  // counts -> int counts_ and their prefix sums displs_; returns the total.
  std::size_t to_counts(CollectiveKind kind, std::span<const std::size_t> counts) {
    counts_.resize(counts.size());
    displs_.resize(counts.size());
    std::size_t total = 0;
    for (std::size_t p = 0; p < counts.size(); ++p) {
      displs_[p] = link_.as_int(kind, "offset", total);
      counts_[p] = link_.as_int(kind, "count", counts[p]);
      total += counts[p];
    }
    link_.as_int(kind, "total", total);
    return total;
  }

  MpiLink link_;
  std::shared_ptr<CommStats> rank_stats_;  // kept alive here, handed on to splits
  // Reused argument arrays (MPI takes int counts): no allocation per call.
  // counts_ and displs_ are the sizes a call sends (all_to_all) or all of
  // them (the others).
  std::vector<int> counts_, displs_, recv_counts_, recv_displs_;
  std::vector<std::byte> scratch_;
};

}  // namespace
}  // namespace mpi_detail

bool mpi_available() { return true; }

std::unique_ptr<Communicator> mpi_world(MpiOptions options) {
  mpi_detail::ensure_initialized();
  MPI_Comm comm;
  // A private copy: user code's own MPI traffic never matches ours.
  const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  if (rc != MPI_SUCCESS) throw CommError(fmt::format("[mpi] MPI_Comm_dup failed: {}", mpi_detail::mpi_error_text(rc)));
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
  return std::make_unique<mpi_detail::MpiCommunicator>(comm, std::make_shared<CommStats>(), options.timeout,
                                                       oversubscribed);
}

}  // namespace dtensor
