#include "backend_communicator.h"

#include <cstdint>
#include <thread>
#include <vector>

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
// Before them, the rank's started calls finish (issue order); after the
// data moved, hold() waits out a modelled link's time.
class BackendCommunicator::Entered {
 public:
  Entered(BackendCommunicator& comm, CollectiveKind kind) : comm_(comm) {
    mesh_detail::RankWorker::drain_this_threads();
    if (comm.link_) began_ = std::chrono::steady_clock::now();
    comm.enter(kind);
    comm.stats_.begin();
  }
  ~Entered() { comm_.leave(); }
  Entered(const Entered&) = delete;
  Entered& operator=(const Entered&) = delete;

  /// Step 5: counts the call's `bytes`, after a modelled link has held it
  /// for their time.
  void record(CollectiveKind kind, std::uint64_t bytes) const {
    hold(bytes);
    comm_.stats_.record(kind, bytes);
  }
  /// The same for one end of a message.
  void record_message(bool sending, int peer, int tag, std::uint64_t bytes) const {
    hold(bytes);
    comm_.stats_.record_message(sending, comm_.rank(), peer, tag, bytes);
  }

 private:
  void hold(std::uint64_t bytes) const {
    if (comm_.link_) std::this_thread::sleep_until(began_ + comm_.link_->time_for(bytes));
  }
  BackendCommunicator& comm_;
  std::chrono::steady_clock::time_point began_{};
};

void BackendCommunicator::all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) {
  if (reduces_as_average_pairs(dtype, op, size())) return all_reduce_integer_average(*this, send, recv, count);
  constexpr auto kind = CollectiveKind::AllReduce;
  checks(*this).dtype(kind, dtype);
  const Entered call(*this, kind);
  do_all_reduce(send, recv, count, dtype, op);
  const auto bytes = all_reduce_recv_bytes(static_cast<std::int64_t>(count), size(), rank(), dtype, op);
  call.record(kind, static_cast<std::uint64_t>(bytes));
}

void BackendCommunicator::all_gather(const void* send, void* recv, std::span<const std::size_t> recv_bytes) {
  constexpr auto kind = CollectiveKind::AllGather;
  checks(*this).entries(kind, "recv_bytes", recv_bytes.size());
  const Entered call(*this, kind);
  do_all_gather(send, recv, recv_bytes);
  call.record(kind, from_others(recv_bytes, rank()));
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
  call.record(kind, static_cast<std::uint64_t>(reduce_scatter_recv_bytes(mine, size(), dtype, op)));
}

void BackendCommunicator::all_to_all(const void* send, std::span<const std::size_t> send_bytes,
                                     std::span<const std::size_t> send_offsets, void* recv,
                                     std::span<const std::size_t> recv_bytes,
                                     std::span<const std::size_t> recv_offsets) {
  constexpr auto kind = CollectiveKind::AllToAll;
  checks(*this).all_to_all(send_bytes, send_offsets, recv_bytes, recv_offsets);
  const Entered call(*this, kind);
  do_all_to_all(send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets);
  call.record(kind, from_others(recv_bytes, rank()));
}

void BackendCommunicator::broadcast(void* buf, std::size_t bytes, int root) {
  constexpr auto kind = CollectiveKind::Broadcast;
  checks(*this).root(kind, root);
  const Entered call(*this, kind);
  do_broadcast(buf, bytes, root);
  call.record(kind, rank() != root ? bytes : 0);
}

void BackendCommunicator::scatter(const void* send, std::span<const std::size_t> bytes, void* recv, int root) {
  constexpr auto kind = CollectiveKind::Scatter;
  checks(*this).entries(kind, "bytes", bytes.size());
  checks(*this).root(kind, root);
  const Entered call(*this, kind);
  do_scatter(send, bytes, recv, root);
  call.record(kind, rank() != root ? bytes[static_cast<std::size_t>(rank())] : 0);
}

void BackendCommunicator::send(const void* buf, std::size_t bytes, int dst, int tag) {
  checks(*this).peer("send to", dst);
  const Entered call(*this, CollectiveKind::Send);
  do_send(buf, bytes, dst, tag);
  call.record_message(true, dst, tag, bytes);
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
  call.record_message(false, src, tag, bytes);
}

void BackendCommunicator::barrier() {
  constexpr auto kind = CollectiveKind::Barrier;
  const Entered call(*this, kind);
  do_barrier();
  call.record(kind, 0);
}

std::unique_ptr<Communicator> BackendCommunicator::split(int color, int key) {
  constexpr auto kind = CollectiveKind::Split;
  const Entered call(*this, kind);
  std::unique_ptr<Communicator> out = do_split(color, key);
  if (auto* child = dynamic_cast<BackendCommunicator*>(out.get())) child->link_ = link_;
  stats_.record(kind, 0);
  return out;
}

// ---- started calls -------------------------------------------------------------

Work BackendCommunicator::start(CollectiveKind kind, std::function<void()> call) {
  // GPU communicators keep their calls on the rank's own streams for now;
  // a call made on the worker itself is already in order.
  if (device() == Device::CUDA || mesh_detail::RankWorker::on_worker_thread()) {
    call();
    return Work();
  }
  if (!worker_) worker_ = mesh_detail::RankWorker::of(&stats_.rank_totals());
  auto state = std::make_shared<mesh_detail::WorkState>(
      fmt::format("[{}] started {} on rank {} of {}", backend(), collective_name(kind), rank(), size()), timeout());
  // When the rank issued it: its trace event tells how long it queued on the worker.
  const trace::Clock::time_point issued = trace::current != nullptr ? trace::Clock::now() : trace::Clock::time_point{};
  state->apply = [this, alive = std::weak_ptr<char>(alive_),
                  issued](const std::vector<mesh_detail::DeferredRecord>& records) {
    if (!alive.expired()) stats_.apply(records, issued);
  };
  worker_->submit(state, std::move(call));
  return Work(std::move(state));
}

void BackendCommunicator::finish_started_calls() noexcept {
  if (worker_) worker_->drain();
}

namespace {
std::vector<std::size_t> copied(std::span<const std::size_t> v) { return {v.begin(), v.end()}; }
}  // namespace

Work BackendCommunicator::start_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) {
  return start(CollectiveKind::AllReduce, [=, this] { all_reduce(send, recv, count, dtype, op); });
}

Work BackendCommunicator::start_all_gather(const void* send, void* recv, std::span<const std::size_t> recv_bytes) {
  return start(CollectiveKind::AllGather,
               [=, this, sizes = copied(recv_bytes)] { all_gather(send, recv, std::span<const std::size_t>(sizes)); });
}

Work BackendCommunicator::start_reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts,
                                               DType dtype, ReduceOp op) {
  return start(CollectiveKind::ReduceScatter, [=, this, sizes = copied(counts)] {
    reduce_scatter(send, recv, std::span<const std::size_t>(sizes), dtype, op);
  });
}

Work BackendCommunicator::start_all_to_all(const void* send, std::span<const std::size_t> send_bytes,
                                           std::span<const std::size_t> send_offsets, void* recv,
                                           std::span<const std::size_t> recv_bytes,
                                           std::span<const std::size_t> recv_offsets) {
  return start(CollectiveKind::AllToAll, [=, this, sb = copied(send_bytes), so = copied(send_offsets),
                                          rb = copied(recv_bytes), ro = copied(recv_offsets)] {
    all_to_all(send, std::span<const std::size_t>(sb), std::span<const std::size_t>(so), recv,
               std::span<const std::size_t>(rb), std::span<const std::size_t>(ro));
  });
}

Work BackendCommunicator::start_broadcast(void* buf, std::size_t bytes, int root) {
  return start(CollectiveKind::Broadcast, [=, this] { broadcast(buf, bytes, root); });
}

Work BackendCommunicator::start_scatter(const void* send, std::span<const std::size_t> bytes, void* recv, int root) {
  return start(CollectiveKind::Scatter,
               [=, this, sizes = copied(bytes)] { scatter(send, std::span<const std::size_t>(sizes), recv, root); });
}

Work BackendCommunicator::start_send(const void* buf, std::size_t bytes, int dst, int tag) {
  return start(CollectiveKind::Send, [=, this] { send(buf, bytes, dst, tag); });
}

Work BackendCommunicator::start_recv(void* buf, std::size_t bytes, int src, int tag) {
  return start(CollectiveKind::Recv, [=, this] { recv(buf, bytes, src, tag); });
}

void BackendCommunicator::model_link(std::optional<LinkModel> link) {
  if (link && !(link->bytes_per_second > 0))
    throw ValueError(fmt::format("[{}] model_link: bandwidth {} B/s; expected a positive bandwidth", backend(),
                                 link->bytes_per_second));
  if (link && link->latency.count() < 0)
    throw ValueError(fmt::format("[{}] model_link: latency {} ns; expected at least 0", backend(), link->latency.count()));
  finish_started_calls();
  link_ = link;
}

void BackendCommunicator::divide_average(void* data, std::size_t count, DType dtype, ReduceOp op) {
  if (op != ReduceOp::Avg || count == 0) return;
  if (device() == Device::CUDA)
    cuda::divide_by(data, count, dtype, size());
  else
    divide_by(data, count, dtype, size());
}

}  // namespace dtensor::backend_detail
