#include "dtensor/mesh/communicator.h"

#include <vector>

#include "dtensor/core/cuda.h"
#include "dtensor/core/error.h"
#include "dtensor/core/units.h"

namespace dtensor {

std::chrono::milliseconds checked_timeout(std::string_view what, std::chrono::milliseconds timeout) {
  if (timeout < kMinTimeout || timeout > kMaxTimeout)
    throw ValueError(fmt::format("{} {} ms: expected a timeout from {} to {} ms (30 days)", what, timeout.count(),
                                 kMinTimeout.count(), kMaxTimeout.count()));
  return timeout;
}

std::string_view collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::AllReduce: return "all_reduce";
    case CollectiveKind::AllGather: return "all_gather";
    case CollectiveKind::ReduceScatter: return "reduce_scatter";
    case CollectiveKind::AllToAll: return "all_to_all";
    case CollectiveKind::Broadcast: return "broadcast";
    case CollectiveKind::Scatter: return "scatter";
    case CollectiveKind::Send: return "send";
    case CollectiveKind::Recv: return "recv";
    case CollectiveKind::Barrier: return "barrier";
    case CollectiveKind::Split: return "split";
  }
  return "unknown";
}

// The blocking call, then a handle that is already done: for communicators
// that run nothing apart (see communicator.h).
Work Communicator::start_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) {
  all_reduce(send, recv, count, dtype, op);
  return Work();
}
Work Communicator::start_all_gather(const void* send, void* recv, std::span<const std::size_t> recv_bytes) {
  all_gather(send, recv, recv_bytes);
  return Work();
}
Work Communicator::start_reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts, DType dtype,
                                        ReduceOp op) {
  reduce_scatter(send, recv, counts, dtype, op);
  return Work();
}
Work Communicator::start_all_to_all(const void* send, std::span<const std::size_t> send_bytes,
                                    std::span<const std::size_t> send_offsets, void* recv,
                                    std::span<const std::size_t> recv_bytes,
                                    std::span<const std::size_t> recv_offsets) {
  all_to_all(send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets);
  return Work();
}
Work Communicator::start_broadcast(void* buf, std::size_t bytes, int root) {
  broadcast(buf, bytes, root);
  return Work();
}
Work Communicator::start_scatter(const void* send, std::span<const std::size_t> bytes, void* recv, int root) {
  scatter(send, bytes, recv, root);
  return Work();
}
Work Communicator::start_send(const void* buf, std::size_t bytes, int dst, int tag) {
  send(buf, bytes, dst, tag);
  return Work();
}
Work Communicator::start_recv(void* buf, std::size_t bytes, int src, int tag) {
  recv(buf, bytes, src, tag);
  return Work();
}

void Communicator::model_link(std::optional<LinkModel>) {
  throw UnsupportedError(fmt::format("[{}] this communicator cannot model a link", backend()));
}

std::uint64_t CommStats::data_collectives() const {
  std::uint64_t total = 0;
  for (int k = 0; k < kNumCollectiveKinds; ++k) {
    auto kind = static_cast<CollectiveKind>(k);
    if (kind != CollectiveKind::Barrier && kind != CollectiveKind::Split) total += calls[k];
  }
  return total;
}

CommStats operator-(const CommStats& after, const CommStats& before) {
  CommStats d;
  for (int k = 0; k < kNumCollectiveKinds; ++k) {
    d.calls[k] = after.calls[k] - before.calls[k];
    d.bytes_by_kind[k] = after.bytes_by_kind[k] - before.bytes_by_kind[k];
  }
  d.recv_bytes = after.recv_bytes - before.recv_bytes;
  return d;
}

CommStats operator+(const CommStats& a, const CommStats& b) {
  CommStats s;
  for (int k = 0; k < kNumCollectiveKinds; ++k) {
    s.calls[k] = a.calls[k] + b.calls[k];
    s.bytes_by_kind[k] = a.bytes_by_kind[k] + b.bytes_by_kind[k];
  }
  s.recv_bytes = a.recv_bytes + b.recv_bytes;
  return s;
}

Work Communicator::start_all_gather(const void* send, void* recv, std::size_t bytes) {
  // The sizes are copied by the call, so a vector on the stack will do.
  const std::vector<std::size_t> sizes(static_cast<std::size_t>(size()), bytes);
  return start_all_gather(send, recv, std::span<const std::size_t>(sizes));
}

void Communicator::all_gather(const void* send, void* recv, std::size_t bytes) {
  // Small groups (the common case) keep the size list on the stack.
  constexpr int kInline = 64;
  const int n = size();
  if (n <= kInline) {
    std::array<std::size_t, kInline> sizes;
    sizes.fill(bytes);
    all_gather(send, recv, std::span<const std::size_t>(sizes.data(), static_cast<std::size_t>(n)));
  } else {
    std::vector<std::size_t> sizes(static_cast<std::size_t>(n), bytes);
    all_gather(send, recv, std::span<const std::size_t>(sizes));
  }
}

void Communicator::broadcast_host(void* buf, std::size_t bytes, int root) {
  if (device() == Device::CPU) {
    broadcast(buf, bytes, root);
    return;
  }
  auto staged = cuda::allocate(bytes);
  if (rank() == root) cuda::copy(staged.get(), Device::CUDA, buf, Device::CPU, bytes);
  broadcast(staged.get(), bytes, root);
  cuda::copy(buf, Device::CPU, staged.get(), Device::CUDA, bytes);
}

void Communicator::all_gather_host(const void* send, void* recv, std::size_t bytes) {
  if (device() == Device::CPU) {
    all_gather(send, recv, bytes);
    return;
  }
  const std::size_t total = bytes * static_cast<std::size_t>(size());
  auto staged_send = cuda::allocate(bytes);
  auto staged_recv = cuda::allocate(total);
  cuda::copy(staged_send.get(), Device::CUDA, send, Device::CPU, bytes);
  all_gather(staged_send.get(), staged_recv.get(), bytes);
  cuda::copy(recv, Device::CPU, staged_recv.get(), Device::CUDA, total);
}

}  // namespace dtensor

fmt::format_context::iterator fmt::formatter<dtensor::CommStats>::format(const dtensor::CommStats& s,
                                                                         fmt::format_context& ctx) const {
  auto out = fmt::format_to(ctx.out(), "{} collective{}, {} received", s.data_collectives(),
                            s.data_collectives() == 1 ? "" : "s",
                            dtensor::human_bytes(static_cast<std::int64_t>(s.recv_bytes)));
  const char* sep = ": ";
  for (int k = 0; k < dtensor::kNumCollectiveKinds; ++k) {
    if (s.calls[k] == 0) continue;
    out = fmt::format_to(out, "{}{} x{} ({})", sep, static_cast<dtensor::CollectiveKind>(k), s.calls[k],
                         dtensor::human_bytes(static_cast<std::int64_t>(s.bytes_by_kind[k])));
    sep = ", ";
  }
  return out;
}
