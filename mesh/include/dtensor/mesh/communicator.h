#pragma once
// The communicator interface: what every backend (threads, MPI, NCCL)
// implements. It knows bytes, element types and reduce ops, never placements.
//
// Byte accounting. Every call adds to the per-rank CommStats the bytes this
// rank *receives* from other ranks under the bandwidth-optimal algorithm, so
// that the planner can predict the count exactly and every backend reports
// the same number for the same call:
//   all_gather      sum of the other ranks' contributions
//   all_reduce      all_reduce_recv_count(count, n, r) elements (core/shape.h:
//                   (n-1)*seg(r) + (count - seg(r)), seg(r) =
//                   even_split(count, n, r).size; reduce-scatter then
//                   all-gather; 2(n-1)/n of the data when n divides count)
//   reduce_scatter  reduce_scatter_recv_count(counts[r], n) = (n-1)*counts[r] elements
//   all_to_all      sum of recv_bytes over the other ranks
//   broadcast       `bytes` on every rank but the root
//   scatter         bytes[r] on every rank but the root
//   recv            the bytes received
// A group of one rank receives nothing. stats() is per process rank: all
// communicators split from one world on a rank add to one CommStats. Each
// communicator also counts its own calls (own_stats()), which is how
// DeviceMesh::group_stats tells the mesh dims a collective ran over.
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "dtensor/core/dtype.h"
#include "dtensor/core/reduce_op.h"
#include "dtensor/mesh/work.h"

namespace dtensor {

enum class CollectiveKind : std::uint8_t {
  AllReduce,
  AllGather,
  ReduceScatter,
  AllToAll,
  Broadcast,
  Scatter,
  Send,  // one end of a point-to-point message
  Recv,  // the other
  Barrier,
  Split,
};
inline constexpr int kNumCollectiveKinds = 10;
std::string_view collective_name(CollectiveKind kind);

/// The deadline every backend accepts, in milliseconds: at least 1 (a zero or
/// negative wait would fail every collective at once) and at most 30 days, far
/// enough below steady_clock's range (about 292 years of nanoseconds) that
/// now() + timeout never overflows into a deadline in the past.
inline constexpr std::chrono::milliseconds kMinTimeout{1};
inline constexpr std::chrono::milliseconds kMaxTimeout{30LL * 24 * 3600 * 1000};

/// Returns `timeout` when it lies in [kMinTimeout, kMaxTimeout]; else a
/// ValueError naming `what` (e.g. "ThreadsOptions::timeout"), the value and
/// the range. Every backend and launch() check their timeouts here.
std::chrono::milliseconds checked_timeout(std::string_view what, std::chrono::milliseconds timeout);

/// Counters of one rank: calls and received bytes per kind of collective.
struct CommStats {
  std::array<std::uint64_t, kNumCollectiveKinds> calls{};
  /// Per kind, the bytes its calls received; a Send's, the bytes it sent
  /// (which no rank receives twice: they are the matching Recv's).
  std::array<std::uint64_t, kNumCollectiveKinds> bytes_by_kind{};
  std::uint64_t recv_bytes = 0;  // every kind's received bytes (a Send's are not)

  void record(CollectiveKind kind, std::uint64_t bytes) {
    calls[static_cast<int>(kind)] += 1;
    bytes_by_kind[static_cast<int>(kind)] += bytes;
    if (kind != CollectiveKind::Send) recv_bytes += bytes;
  }
  std::uint64_t count(CollectiveKind kind) const { return calls[static_cast<int>(kind)]; }
  /// Calls of the data-moving collectives (all but Barrier and Split).
  std::uint64_t data_collectives() const;
  void reset() { *this = CommStats{}; }
};
/// Counter difference, for "what happened in this scope".
CommStats operator-(const CommStats& after, const CommStats& before);
/// Counter sum, for what several scopes did together.
CommStats operator+(const CommStats& a, const CommStats& b);

/// The interface every user and decorator sees. The backends implement it
/// through one skeleton (mesh/src/backend_communicator.h) that checks the
/// arguments, runs int64 averages exactly, and keeps the counters and the
/// trace, so that each backend writes only its data movement.
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend() const = 0;

  /// Elementwise reduction of `count` elements of `dtype` over all ranks;
  /// every rank gets the result. send == recv (in place) is allowed. Avg is
  /// the sum divided by size() (int64: the exact sum / size() rounded toward
  /// zero, even where the sum itself would overflow). Max and Min propagate
  /// NaN, as the local max and min do.
  virtual void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) = 0;

  /// The same in place on typed elements, the dtype deduced from T (float,
  /// double, std::int64_t, bfloat16, float16):
  /// `comm.all_reduce(std::span(&failures, 1), ReduceOp::Sum)`.
  template <class T>
  void all_reduce(std::span<T> data, ReduceOp op) {
    constexpr DType dtype = dtype_of<T>();
    all_reduce(data.data(), data.data(), data.size(), dtype, op);
  }

  /// Rank i contributes recv_bytes[i] bytes (its own entry says how much
  /// `send` holds); `recv` gets the concatenation in rank order. Sizes may
  /// differ and be zero. recv_bytes.size() == size().
  virtual void all_gather(const void* send, void* recv, std::span<const std::size_t> recv_bytes) = 0;

  /// `send` holds size() blocks, block i of counts[i] elements; rank r gets
  /// the reduction of block r over all ranks in `recv`.
  virtual void reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts, DType dtype,
                              ReduceOp op) = 0;

  /// Rank r sends send_bytes[p] bytes from send + send_offsets[p] to rank p,
  /// and receives recv_bytes[p] bytes from rank p at recv + recv_offsets[p].
  /// The self entry is copied locally. All spans have size() entries.
  virtual void all_to_all(const void* send, std::span<const std::size_t> send_bytes,
                          std::span<const std::size_t> send_offsets, void* recv,
                          std::span<const std::size_t> recv_bytes, std::span<const std::size_t> recv_offsets) = 0;

  /// `bytes` from root's buf to every rank's buf.
  virtual void broadcast(void* buf, std::size_t bytes, int root) = 0;

  /// Root holds size() blocks back to back, block i of bytes[i]; rank i gets
  /// block i in `recv`. `send` is read on the root only.
  virtual void scatter(const void* send, std::span<const std::size_t> bytes, void* recv, int root) = 0;

  /// Point to point; a send is matched by the recv with the same (src, tag).
  virtual void send(const void* buf, std::size_t bytes, int dst, int tag = 0) = 0;
  virtual void recv(void* buf, std::size_t bytes, int src, int tag = 0) = 0;

  virtual void barrier() = 0;

  /// Collective over this communicator: ranks with the same color form a new
  /// communicator, ordered by key (ties by rank). color < 0: no group, nullptr.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  /// Where the buffers this communicator moves live: host memory (threads,
  /// MPI) or GPU memory (NCCL, simulated GPU ranks).
  virtual Device device() const { return Device::CPU; }

  /// How long any wait may last before CommTimeout.
  virtual std::chrono::milliseconds timeout() const = 0;

  /// This process rank's counters (shared by every communicator split from
  /// the same world on this rank).
  virtual CommStats& stats() = 0;
  const CommStats& stats() const { return const_cast<Communicator*>(this)->stats(); }
  /// The calls made on this communicator alone, counted as stats() counts
  /// them; stats() is their sum over every communicator of the rank.
  virtual const CommStats& own_stats() const = 0;

  // ---- Non-blocking forms (dtensor/mesh/work.h) ------------------------------
  /// Each starts the call of the same name and returns a handle at once; the
  /// arguments mean what they mean there, and the spans are copied. On the
  /// CPU backends a rank's started calls run in issue order on a worker of
  /// the rank (its communication stream), so the rank's own thread computes
  /// meanwhile; a blocking call first lets the rank's started ones finish.
  /// Where a backend cannot run a call apart (GPU communicators for now, and
  /// decorators that do not forward these), it runs the blocking call and
  /// returns a handle that is already done.
  virtual Work start_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op);
  virtual Work start_all_gather(const void* send, void* recv, std::span<const std::size_t> recv_bytes);
  virtual Work start_reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts, DType dtype,
                                    ReduceOp op);
  virtual Work start_all_to_all(const void* send, std::span<const std::size_t> send_bytes,
                                std::span<const std::size_t> send_offsets, void* recv,
                                std::span<const std::size_t> recv_bytes, std::span<const std::size_t> recv_offsets);
  virtual Work start_broadcast(void* buf, std::size_t bytes, int root);
  virtual Work start_scatter(const void* send, std::span<const std::size_t> bytes, void* recv, int root);
  virtual Work start_send(const void* buf, std::size_t bytes, int dst, int tag = 0);
  virtual Work start_recv(void* buf, std::size_t bytes, int src, int tag = 0);

  /// Every later call on this communicator, and on those split from it
  /// afterwards, takes at least `link`'s time for the bytes it receives
  /// (std::nullopt: the machine's own speed again). UnsupportedError where a
  /// communicator cannot model a link.
  virtual void model_link(std::optional<LinkModel> link);
  virtual std::optional<LinkModel> link_model() const { return std::nullopt; }

  /// Equal-size all_gather: every rank contributes `bytes`.
  void all_gather(const void* send, void* recv, std::size_t bytes);
  Work start_all_gather(const void* send, void* recv, std::size_t bytes);

  /// The same on small host buffers (shapes, headers) whatever device() is:
  /// a GPU communicator stages them through device memory.
  void broadcast_host(void* buf, std::size_t bytes, int root);
  void all_gather_host(const void* send, void* recv, std::size_t bytes);
};

}  // namespace dtensor

template <>
struct fmt::formatter<dtensor::CollectiveKind> : fmt::formatter<std::string_view> {
  auto format(dtensor::CollectiveKind k, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(dtensor::collective_name(k), ctx);
  }
};

/// "3 collectives, 28 KiB received: all_gather x2 (24 KiB), all_reduce x1 (4 KiB)".
template <>
struct fmt::formatter<dtensor::CommStats> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  fmt::format_context::iterator format(const dtensor::CommStats& s, fmt::format_context& ctx) const;
};
