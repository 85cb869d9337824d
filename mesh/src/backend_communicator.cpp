#include "backend_communicator.h"

#include <cstdint>

#include <fmt/format.h>

#include "argument_checks.h"
#include "dtensor/core/cuda.h"
#include "dtensor/core/error.h"
#include "dtensor/core/reduction_bytes.h"
#include "dtensor/core/tensor.h"
#include "exact_average.h"

namespace dtensor::backend_detail {
namespace {

ArgumentChecks checks(const Communicator& comm) { return {comm.backend(), comm.rank(), comm.size()}; }

// The bytes of `sizes` that come from the other ranks.
std::uint64_t from_others(std::span<const std::size_t> sizes, int rank) {
  std::uint64_t total = 0;
  for (std::size_t p = 0; p < sizes.size(); ++p)
    if (p != static_cast<std::size_t>(rank)) total += sizes[p];
  return total;
}

}  // namespace

// Steps 3 and the leaving: the backend's gate and the start of the call's
// trace event; leave() however the call ends.
class BackendCommunicator::Entered {
 public:
  Entered(BackendCommunicator& comm, CollectiveKind kind) : comm_(comm) {
    comm.enter(kind);
    comm.stats_.begin();
  }
  ~Entered() { comm_.leave(); }
  Entered(const Entered&) = delete;
  Entered& operator=(const Entered&) = delete;

 private:
  BackendCommunicator& comm_;
};

void BackendCommunicator::all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) {
  if (reduces_as_average_pairs(dtype, op, size())) return all_reduce_integer_average(*this, send, recv, count);
  constexpr auto kind = CollectiveKind::AllReduce;
  checks(*this).dtype(kind, dtype);
  const Entered call(*this, kind);
  do_all_reduce(send, recv, count, dtype, op);
  const auto bytes = all_reduce_recv_bytes(static_cast<std::int64_t>(count), size(), rank(), dtype, op);
  stats_.record(kind, static_cast<std::uint64_t>(bytes));
}

void BackendCommunicator::all_gather(const void* send, void* recv, std::span<const std::size_t> recv_bytes) {
  constexpr auto kind = CollectiveKind::AllGather;
  checks(*this).entries(kind, "recv_bytes", recv_bytes.size());
  const Entered call(*this, kind);
  do_all_gather(send, recv, recv_bytes);
  stats_.record(kind, from_others(recv_bytes, rank()));
}

void BackendCommunicator::reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts, DType dtype,
                                         ReduceOp op) {
  if (reduces_as_average_pairs(dtype, op, size())) return reduce_scatter_integer_average(*this, send, recv, counts);
  constexpr auto kind = CollectiveKind::ReduceScatter;
  checks(*this).dtype(kind, dtype);
  checks(*this).entries(kind, "counts", counts.size());
  const Entered call(*this, kind);
  do_reduce_scatter(send, recv, counts, dtype, op);
  const auto mine = static_cast<std::int64_t>(counts[static_cast<std::size_t>(rank())]);
  stats_.record(kind, static_cast<std::uint64_t>(reduce_scatter_recv_bytes(mine, size(), dtype, op)));
}

void BackendCommunicator::all_to_all(const void* send, std::span<const std::size_t> send_bytes,
                                     std::span<const std::size_t> send_offsets, void* recv,
                                     std::span<const std::size_t> recv_bytes,
                                     std::span<const std::size_t> recv_offsets) {
  constexpr auto kind = CollectiveKind::AllToAll;
  checks(*this).all_to_all(send_bytes, send_offsets, recv_bytes, recv_offsets);
  const Entered call(*this, kind);
  do_all_to_all(send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets);
  stats_.record(kind, from_others(recv_bytes, rank()));
}

void BackendCommunicator::broadcast(void* buf, std::size_t bytes, int root) {
  constexpr auto kind = CollectiveKind::Broadcast;
  checks(*this).root(kind, root);
  const Entered call(*this, kind);
  do_broadcast(buf, bytes, root);
  stats_.record(kind, rank() != root ? bytes : 0);
}

void BackendCommunicator::scatter(const void* send, std::span<const std::size_t> bytes, void* recv, int root) {
  constexpr auto kind = CollectiveKind::Scatter;
  checks(*this).entries(kind, "bytes", bytes.size());
  checks(*this).root(kind, root);
  const Entered call(*this, kind);
  do_scatter(send, bytes, recv, root);
  stats_.record(kind, rank() != root ? bytes[static_cast<std::size_t>(rank())] : 0);
}

void BackendCommunicator::send(const void* buf, std::size_t bytes, int dst, int tag) {
  checks(*this).peer("send to", dst);
  const Entered call(*this, CollectiveKind::Send);
  do_send(buf, bytes, dst, tag);
  stats_.record_message(true, rank(), dst, tag, bytes);
}

void BackendCommunicator::recv(void* buf, std::size_t bytes, int src, int tag) {
  checks(*this).peer("recv from", src);
  const Entered call(*this, CollectiveKind::Recv);
  const std::size_t got = do_recv(buf, bytes, src, tag);
  if (got != bytes) {
    // The message is gone from its route: the route's later ones keep their numbers.
    stats_.drop_message(false, rank(), src, tag);
    throw CommError(
        fmt::format("[{}] recv on rank {} of {} from rank {} (tag {}): expected {} bytes but the matching send has "
                    "{} bytes",
                    backend(), rank(), size(), src, tag, bytes, got));
  }
  stats_.record_message(false, rank(), src, tag, bytes);
}

void BackendCommunicator::barrier() {
  constexpr auto kind = CollectiveKind::Barrier;
  const Entered call(*this, kind);
  do_barrier();
  stats_.record(kind, 0);
}

std::unique_ptr<Communicator> BackendCommunicator::split(int color, int key) {
  constexpr auto kind = CollectiveKind::Split;
  const Entered call(*this, kind);
  std::unique_ptr<Communicator> out = do_split(color, key);
  stats_.record(kind, 0);
  return out;
}

void BackendCommunicator::divide_average(void* data, std::size_t count, DType dtype, ReduceOp op) {
  if (op != ReduceOp::Avg || count == 0) return;
  if (device() == Device::CUDA)
    cuda::divide_by(data, count, dtype, size());
  else
    divide_by(data, count, dtype, size());
}

}  // namespace dtensor::backend_detail
