// The threads backend. Every collective is one round over the group's slot
// table:
//   A  each rank posts a descriptor of its call and its buffer pointers into
//      its slot and waits for the whole group (abortable: a peer failure or a
//      timeout breaks the group, and A then never completes for anyone);
//      every rank then checks the same table for agreement, so either all
//      ranks of the group proceed or all throw CollectiveMismatch;
//   M  (all_reduce, split) a second phase boundary;
//   B  a closing barrier, after which no peer reads this rank's buffers any
//      more, so the caller may reuse or free them.
// Ranks read straight from each other's buffers between A and B; nothing is
// staged centrally. Slots are double-buffered by round parity: a fast rank
// posting round k+1 never overwrites what a slow rank still reads of round k
// (round k+2 cannot start before every rank has left round k's A).
// M and B are not abortable: every rank that passed A reaches them without
// blocking on anything else, and leaving early would free buffers a peer may
// still be reading.
//
// Simulated GPU ranks (ThreadsOptions::device == CUDA): the buffers are device
// memory, copies are device-to-device on the rank's own stream and the
// reductions are kernels. A rank synchronises its stream before every phase
// boundary, so its send data is complete when peers start reading (A), and
// its reads of peers' buffers are done before it lets them go (M, B).
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backend_communicator.h"
#include "dtensor/core/cuda.h"
#include "dtensor/core/error.h"
#include "dtensor/core/shape.h"
#include "dtensor/core/tensor.h"
#include "dtensor/mesh/threads.h"
#include "exact_average.h"
#include "threads_group.h"

namespace dtensor {
namespace {

using namespace threads_detail;
class ThreadsCommunicator final : public backend_detail::BackendCommunicator {
 public:
  ThreadsCommunicator(std::shared_ptr<World> world, std::shared_ptr<Group> group, int rank)
      : BackendCommunicator(world->stats[static_cast<std::size_t>(group->world_ranks[static_cast<std::size_t>(rank)])]),
        world_(std::move(world)),
        group_(std::move(group)),
        rank_(rank),
        world_rank_(group_->world_ranks[static_cast<std::size_t>(rank)]) {}
  ~ThreadsCommunicator() override { finish_started_calls(); }

  int rank() const override { return rank_; }
  int size() const override { return group_->n; }
  std::string_view backend() const override { return "threads"; }
  Device device() const override { return world_->options.device; }
  std::chrono::milliseconds timeout() const override { return world_->options.timeout; }

 protected:
  // Fails at once if the world has failed (a broken group is caught when
  // posting); marks this rank's Activity as inside the call until leave().
  void enter(CollectiveKind kind) override {
    if (world_->has_failed()) throw peer_failed(kind);
    Activity& a = activity();
    a.kind.store(static_cast<int>(kind), std::memory_order_relaxed);
    a.calls.store(a.calls.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    a.inside.store(true, std::memory_order_relaxed);
    deadline_ = Clock::now() + timeout();
  }
  void leave() noexcept override { activity().inside.store(false, std::memory_order_relaxed); }

  void do_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) override {
    constexpr auto kind = CollectiveKind::AllReduce;
    const std::size_t isz = itemsize(dtype);
    const int n = size();
    if (n == 1) return move_bytes(recv, send, count * isz);
    const auto made = backend_detail::all_reduce_as_made(op, count);
    Slot s;
    s.desc = {.kind = kind, .dtype = dtype, .op = made.op, .count = made.count};
    s.send = send;
    s.recv = recv;
    const auto seq = post(s);

    const auto seg = even_split(static_cast<std::int64_t>(count), n, rank_);
    const std::size_t seg_off = static_cast<std::size_t>(seg.offset) * isz;
    const std::size_t seg_elems = static_cast<std::size_t>(seg.size);
    // Reduce-scatter: this rank owns segment r and folds every peer's
    // segment r into its own recv. In place, peers read only segments p != r
    // of this buffer, so writing segment r is race-free.
    auto* acc = static_cast<std::byte*>(recv) + seg_off;
    const auto* own = static_cast<const std::byte*>(send) + seg_off;
    fold_peers(acc, own, seg_off, seg_elems, dtype, op, seq);
    wait_phase(kind);
    // All-gather: copy every other segment from its owner's recv. After M no
    // one reads send buffers, so overwriting them in place is safe.
    for (int k = 1; k < n; ++k) {
      const int p = (rank_ + k) % n;
      const auto sp = even_split(static_cast<std::int64_t>(count), n, p);
      const std::size_t off = static_cast<std::size_t>(sp.offset) * isz;
      move_bytes(static_cast<std::byte*>(recv) + off, static_cast<const std::byte*>(group_->slot(p, seq).recv) + off,
                 static_cast<std::size_t>(sp.size) * isz);
    }
    wait_phase(kind);
  }

  void do_all_gather(const void* send, void* recv, std::span<const std::size_t> recv_bytes) override {
    const int n = size();
    auto* out = static_cast<std::byte*>(recv);
    if (n == 1) return move_bytes(out, send, recv_bytes[0]);
    Slot s;
    s.desc = {.kind = CollectiveKind::AllGather, .v0 = recv_bytes.data()};
    s.send = send;
    const auto seq = post(s);
    std::size_t off = 0;
    for (int p = 0; p < n; ++p) {
      const std::size_t b = recv_bytes[static_cast<std::size_t>(p)];
      move_bytes(out + off, p == rank_ ? send : group_->slot(p, seq).send, b);
      off += b;
    }
    wait_phase(CollectiveKind::AllGather);
  }

  void do_reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts, DType dtype,
                         ReduceOp op) override {
    constexpr auto kind = CollectiveKind::ReduceScatter;
    const std::size_t isz = itemsize(dtype);
    const int n = size();
    const std::size_t my_count = counts[static_cast<std::size_t>(rank_)];
    const std::size_t my_off = prefix(counts, rank_) * isz;
    const auto* own = static_cast<const std::byte*>(send) + my_off;
    if (n == 1) return move_bytes(recv, own, my_count * isz);
    const auto made = backend_detail::reduce_scatter_as_made(op, counts);
    Slot s;
    s.desc = {.kind = kind, .dtype = dtype, .op = made.op, .v0 = made.counts.data()};
    s.send = send;
    const auto seq = post(s);
    // recv may alias this rank's own block of send (peers never read it);
    // any other overlap with send would race with peers, so reduce into a
    // scratch buffer and copy out after the closing barrier.
    const auto* send_begin = static_cast<const std::byte*>(send);
    const auto* send_end = send_begin + prefix(counts, n) * isz;
    auto* out = static_cast<std::byte*>(recv);
    const bool overlaps = my_count != 0 && out < send_end && out + my_count * isz > send_begin && out != own;
    thread_local std::vector<std::byte> scratch;
    std::shared_ptr<std::byte[]> device_scratch;
    std::byte* acc = out;
    if (overlaps && on_gpu()) {
      device_scratch = cuda::allocate(my_count * isz);
      acc = device_scratch.get();
    } else if (overlaps) {
      scratch.resize(my_count * isz);
      acc = scratch.data();
    }
    fold_peers(acc, own, my_off, my_count, dtype, op, seq);
    wait_phase(kind);
    if (overlaps) move_bytes(out, acc, my_count * isz);
  }

  void do_all_to_all(const void* send, std::span<const std::size_t> send_bytes,
                     std::span<const std::size_t> send_offsets, void* recv, std::span<const std::size_t> recv_bytes,
                     std::span<const std::size_t> recv_offsets) override {
    const int n = size();
    const auto r = static_cast<std::size_t>(rank_);
    auto* out = static_cast<std::byte*>(recv);
    move_bytes(out + recv_offsets[r], static_cast<const std::byte*>(send) + send_offsets[r], recv_bytes[r]);
    if (n == 1) return;
    Slot s;
    s.desc = {.kind = CollectiveKind::AllToAll, .v0 = send_bytes.data(), .v1 = recv_bytes.data()};
    s.send = send;
    s.send_offsets = send_offsets.data();
    const auto seq = post(s);
    for (int k = 1; k < n; ++k) {
      const int p = (rank_ + k) % n;
      const Slot& peer = group_->slot(p, seq);
      move_bytes(out + recv_offsets[static_cast<std::size_t>(p)],
                 static_cast<const std::byte*>(peer.send) + peer.send_offsets[r],
                 recv_bytes[static_cast<std::size_t>(p)]);
    }
    wait_phase(CollectiveKind::AllToAll);
  }

  void do_broadcast(void* buf, std::size_t bytes, int root) override {
    if (size() == 1) return;
    Slot s;
    s.desc = {.kind = CollectiveKind::Broadcast, .root = root, .count = bytes};
    s.recv = buf;
    const auto seq = post(s);
    if (rank_ != root) move_bytes(buf, group_->slot(root, seq).recv, bytes);
    wait_phase(CollectiveKind::Broadcast);
  }

  void do_scatter(const void* send, std::span<const std::size_t> bytes, void* recv, int root) override {
    const std::size_t mine = bytes[static_cast<std::size_t>(rank_)];
    if (size() == 1) return move_bytes(recv, send, mine);
    Slot s;
    s.desc = {.kind = CollectiveKind::Scatter, .root = root, .v0 = bytes.data()};
    s.send = send;
    const auto seq = post(s);
    move_bytes(recv, static_cast<const std::byte*>(group_->slot(root, seq).send) + prefix(bytes, rank_), mine);
    wait_phase(CollectiveKind::Scatter);
  }

  void do_send(const void* buf, std::size_t bytes, int dst, int tag) override {
    Message m;
    m.data.resize(bytes);
    if (on_gpu())
      cuda::copy(m.data.data(), Device::CPU, buf, Device::CUDA, bytes);
    else
      copy_bytes(m.data.data(), buf, bytes);
    {
      std::lock_guard lock(group_->mu);
      group_->mail[{rank_, dst, tag}].push_back(std::move(m));
    }
    group_->mail_cv.notify_all();
  }

  std::size_t do_recv(void* buf, std::size_t bytes, int src, int tag) override {
    Message m;
    {
      std::unique_lock lock(group_->mu);
      const std::tuple<int, int, int> key{src, rank_, tag};
      for (;;) {
        auto it = group_->mail.find(key);
        if (it != group_->mail.end() && !it->second.empty()) {
          m = std::move(it->second.front());
          it->second.pop_front();
          if (it->second.empty()) group_->mail.erase(it);
          break;
        }
        if (world_->has_failed()) throw peer_failed(CollectiveKind::Recv);
        if (group_->mail_cv.wait_until(lock, deadline_) == std::cv_status::timeout && Clock::now() >= deadline_) {
          it = group_->mail.find(key);
          if (it == group_->mail.end() || it->second.empty()) {
            lock.unlock();
            note_late({src});
            throw CommTimeout(fmt::format("[threads] recv on rank {} of {} from rank {} (tag {}) timed out after {} ms",
                                          rank_, size(), src, tag, timeout().count()));
          }
        }
      }
    }
    if (m.data.size() != bytes) return m.data.size();
    if (on_gpu())
      cuda::copy(buf, Device::CUDA, m.data.data(), Device::CPU, bytes);
    else
      copy_bytes(buf, m.data.data(), bytes);
    return bytes;
  }

  void do_barrier() override {
    if (size() == 1) return;
    Slot s;
    s.desc = {.kind = CollectiveKind::Barrier};
    post(s);  // one barrier suffices: no buffers are shared
  }

  std::unique_ptr<Communicator> do_split(int color, int key) override {
    const int n = size();
    std::shared_ptr<Group> group;
    int new_rank = 0;
    if (n == 1 && color >= 0) {
      group = std::make_shared<Group>(std::vector<int>{world_rank_});
      world_->add_group(group);
    } else if (n > 1) {
      Slot s;
      s.desc = {.kind = CollectiveKind::Split, .color = color, .key = key};
      const auto seq = post(s);
      if (color >= 0)
        group = join_split(color, seq, new_rank);
      else
        wait_phase(CollectiveKind::Split);
      // The leader's slot still holds the group until it is posted again;
      // the closing barrier keeps it from being reset while peers read it.
      wait_phase(CollectiveKind::Split);
      if (new_rank == 0 && group) group_->slot(rank_, seq).new_group.reset();
    }
    if (!group) return nullptr;
    return std::make_unique<ThreadsCommunicator>(world_, std::move(group), new_rank);
  }

 private:
  // split, for a rank with a color, after posting round `seq`: the ranks of
  // that color ordered by (key, rank); the first makes their group and
  // publishes it in its slot, the others take it from there after M.
  std::shared_ptr<Group> join_split(int color, std::uint64_t seq, int& new_rank) {
    std::vector<std::pair<int, int>> members;  // (key, group rank)
    for (int p = 0; p < size(); ++p) {
      const auto& d = group_->slot(p, seq).desc;
      if (d.color == color) members.emplace_back(d.key, p);
    }
    std::sort(members.begin(), members.end());
    for (std::size_t i = 0; i < members.size(); ++i)
      if (members[i].second == rank_) new_rank = static_cast<int>(i);
    std::shared_ptr<Group> group;
    if (new_rank == 0) {
      std::vector<int> ranks;
      for (auto& m : members) ranks.push_back(group_->world_ranks[static_cast<std::size_t>(m.second)]);
      group = std::make_shared<Group>(std::move(ranks));
      world_->add_group(group);
      group_->slot(rank_, seq).new_group = group;
    }
    wait_phase(CollectiveKind::Split);
    if (new_rank != 0) group = group_->slot(members[0].second, seq).new_group;
    return group;
  }

  // acc = own op peer_1 op ... op peer_{n-1} over `elems` elements that sit
  // at byte `offset` of every peer's posted send buffer (Avg: then / n).
  // Block by block, so the accumulator stays in cache while every peer's
  // block is folded in.
  void fold_peers(std::byte* acc, const std::byte* own, std::size_t offset, std::size_t elems, DType dtype, ReduceOp op,
                  std::uint64_t seq) {
    const int n = size();
    const std::size_t isz = itemsize(dtype);
    if (on_gpu()) {
      // One fused pass: a copy and a reduce per peer in 32 KiB blocks made a
      // 64 MiB reduce_scatter 8,192 launches per rank and ran at 3 GB/s
      // (bench/gpu on an H200, 2026-12-04).
      std::vector<const void*> peers;
      for (int k = 1; k < n; ++k)
        peers.push_back(static_cast<const std::byte*>(group_->slot((rank_ + k) % n, seq).send) + offset);
      cuda::fold_into(acc, own, peers, elems, dtype, op);
      return divide_average(acc, elems, dtype, op);
    }
    // Blocks that stay in cache while every peer folds in.
    const std::size_t block = std::max<std::size_t>(1, kReduceBlockBytes / isz);
    for (std::size_t b = 0; b < elems; b += block) {
      const std::size_t m = std::min(block, elems - b);
      move_bytes(acc + b * isz, own + b * isz, m * isz);
      for (int k = 1; k < n; ++k) {
        const int p = (rank_ + k) % n;
        const auto* src = static_cast<const std::byte*>(group_->slot(p, seq).send) + offset + b * isz;
        reduce_bytes(acc + b * isz, src, m, dtype, op);
      }
    }
    divide_average(acc, elems, dtype, op);
  }

  Activity& activity() const { return world_->activity[static_cast<std::size_t>(world_rank_)]; }
  bool on_gpu() const { return world_->options.device == Device::CUDA; }
  // Copies between collective buffers: memcpy, or a device-to-device copy on
  // this rank's stream for simulated GPU ranks.
  void move_bytes(void* dst, const void* src, std::size_t bytes) const {
    if (!on_gpu()) {
      copy_bytes(dst, src, bytes);
    } else if (bytes != 0 && dst != src) {
      cuda::copy(dst, Device::CUDA, src, Device::CUDA, bytes);
    }
  }
  void reduce_bytes(void* acc, const void* x, std::size_t count, DType dtype, ReduceOp op) const {
    if (on_gpu())
      cuda::reduce_into(acc, x, count, dtype, op);
    else
      reduce_into(acc, x, count, dtype, op);
  }
  // Before a phase boundary: this rank's queued device work is done.
  void settle() const {
    if (on_gpu()) cuda::synchronize();
  }

  PeerFailed peer_failed(CollectiveKind kind) const {
    if (world_->failed_rank < 0)  // run_threads itself could not start every rank
      return PeerFailed(
          fmt::format("[threads] {} on rank {} of {}: {}", collective_name(kind), rank_, size(), world_->failed_msg));
    return PeerFailed(fmt::format("[threads] {} on rank {} of {}: rank {} failed: {}", collective_name(kind), rank_,
                                  size(), world_->failed_rank, world_->failed_msg));
  }

  [[noreturn]] void throw_broken(CollectiveKind kind) const {
    const auto msg = fmt::format("[threads] {} on rank {} of {}: the group is unusable: {}", collective_name(kind),
                                 rank_, size(), group_->broken_msg);
    if (group_->broken_by_timeout) throw CommTimeout(msg);
    throw PeerFailed(msg);
  }

  // The group ranks that have not posted round `seq`.
  std::vector<int> missing_ranks(std::uint64_t seq) const {
    std::vector<int> missing;
    for (int p = 0; p < size(); ++p)
      if (group_->slot(p, seq).seq != seq) missing.push_back(p);
    return missing;
  }
  // Tells the world which process ranks this rank timed out waiting for.
  void note_late(const std::vector<int>& group_ranks) const {
    std::vector<int> ranks;
    for (int p : group_ranks) ranks.push_back(group_->world_ranks[static_cast<std::size_t>(p)]);
    world_->note_late(ranks);
  }

  // Phase A: post this rank's slot, wait for the group, check agreement.
  std::uint64_t post(const Slot& s) {
    settle();
    const std::uint64_t seq = seq_++;
    const auto kind = s.desc.kind;
    Group& g = *group_;
    {
      std::unique_lock lock(g.mu);
      if (g.broken) throw_broken(kind);
      Slot& mine = g.slot(rank_, seq);
      mine = s;
      mine.seq = seq;
      std::uint64_t my_gen = 0;
      if (!g.arrive(lock, my_gen)) {
        while (g.gen == my_gen) {
          if (g.broken) throw_broken(kind);
          if (world_->has_failed()) {
            g.fail(lock, fmt::format("rank {} failed: {}", world_->failed_rank, world_->failed_msg), false);
            throw peer_failed(kind);
          }
          if (g.cv.wait_until(lock, deadline_) == std::cv_status::timeout && g.gen == my_gen && !g.broken &&
              !world_->has_failed()) {
            const auto missing = missing_ranks(seq);
            const auto msg =
                fmt::format("{} on rank {} of {} timed out after {} ms waiting for rank(s) {}", collective_name(kind),
                            rank_, g.n, timeout().count(), fmt::join(missing, ", "));
            g.fail(lock, msg, true);
            note_late(missing);
            throw CommTimeout("[threads] " + msg);
          }
        }
      }
    }
    if (auto msg = mismatch(g, seq, rank_); !msg.empty()) {
      wait_phase(kind);  // peers may still read this round's slots
      throw CollectiveMismatch(msg);
    }
    return seq;
  }

  // M and B: not abortable (see the file comment).
  void wait_phase(CollectiveKind kind) {
    settle();
    Group& g = *group_;
    std::unique_lock lock(g.mu);
    std::uint64_t my_gen = 0;
    if (g.arrive(lock, my_gen)) return;
    if (!g.cv.wait_until(lock, deadline_, [&] { return g.gen != my_gen; })) {
      const auto msg = fmt::format("{} on rank {} of {} timed out after {} ms inside the collective",
                                   collective_name(kind), rank_, g.n, timeout().count());
      g.fail(lock, msg, true);
      throw CommTimeout("[threads] " + msg);
    }
  }

  std::shared_ptr<World> world_;
  std::shared_ptr<Group> group_;
  int rank_;
  int world_rank_;
  Clock::time_point deadline_{};  // of the call this rank is in (set by enter)
  std::uint64_t seq_ = 0;         // rounds this rank has posted on the group
};

}  // namespace

namespace threads_detail {

std::unique_ptr<Communicator> make_communicator(std::shared_ptr<World> world, std::shared_ptr<Group> group, int rank) {
  return std::make_unique<ThreadsCommunicator>(std::move(world), std::move(group), rank);
}

}  // namespace threads_detail
}  // namespace dtensor
