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

#include "dtensor/core/cuda.h"
#include "dtensor/core/error.h"
#include "argument_checks.h"
#include "exact_average.h"
#include "stats_recorder.h"
#include "dtensor/core/shape.h"
#include "dtensor/core/tensor.h"
#include "dtensor/mesh/threads.h"
#include "threads_group.h"

namespace dtensor {
namespace {

using namespace threads_detail;
class ThreadsCommunicator final : public Communicator {
 public:
  ThreadsCommunicator(std::shared_ptr<World> world, std::shared_ptr<Group> group, int rank)
      : world_(std::move(world)),
        group_(std::move(group)),
        rank_(rank),
        world_rank_(group_->world_ranks[static_cast<std::size_t>(rank)]),
        stats_(world_->stats[static_cast<std::size_t>(world_rank_)]) {}

  using Communicator::all_gather;  // keep the equal-size overload visible

  int rank() const override { return rank_; }
  int size() const override { return group_->n; }
  std::string_view backend() const override { return "threads"; }
  Device device() const override { return world_->options.device; }
  std::chrono::milliseconds timeout() const override { return world_->options.timeout; }
  CommStats& stats() override { return stats_.rank_totals(); }
  const CommStats& own_stats() const override { return stats_.own(); }

  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) override {
    if (reduces_as_average_pairs(dtype, op, size()))
      return backend_detail::all_reduce_integer_average(*this, send, recv, count);
    constexpr auto kind = CollectiveKind::AllReduce;
    const std::size_t isz = check_dtype(kind, dtype);
    const int n = size();
    const Call call = enter(kind);
    const auto deadline = call.deadline;
    if (n == 1) {
      move_bytes(recv, send, count * isz);
      stats_.record(kind, 0);
      return;
    }
    Slot s;
    s.desc = {.kind = kind, .dtype = dtype, .op = op, .count = count};
    if (const auto* avg = backend_detail::carried_average()) {  // the pairs of an int64 Avg
      s.desc.op = ReduceOp::Avg;
      s.desc.count = avg->count;
    }
    s.send = send;
    s.recv = recv;
    const auto seq = post(s, deadline);

    const auto seg = even_split(static_cast<std::int64_t>(count), n, rank_);
    const std::size_t seg_off = static_cast<std::size_t>(seg.offset) * isz;
    const std::size_t seg_elems = static_cast<std::size_t>(seg.size);
    // Reduce-scatter: this rank owns segment r and folds every peer's
    // segment r into its own recv. In place, peers read only segments p != r
    // of this buffer, so writing segment r is race-free.
    auto* acc = static_cast<std::byte*>(recv) + seg_off;
    const auto* own = static_cast<const std::byte*>(send) + seg_off;
    fold_peers(acc, own, seg_off, seg_elems, dtype, op, seq);
    wait_phase(kind, deadline);
    // All-gather: copy every other segment from its owner's recv. After M no
    // one reads send buffers, so overwriting them in place is safe.
    for (int k = 1; k < n; ++k) {
      const int p = (rank_ + k) % n;
      const auto sp = even_split(static_cast<std::int64_t>(count), n, p);
      const std::size_t off = static_cast<std::size_t>(sp.offset) * isz;
      move_bytes(static_cast<std::byte*>(recv) + off, static_cast<const std::byte*>(group_->slot(p, seq).recv) + off,
                 static_cast<std::size_t>(sp.size) * isz);
    }
    wait_phase(kind, deadline);
    stats_.record(kind, static_cast<std::uint64_t>(all_reduce_recv_bytes(count, n, rank_, dtype, op)));
  }

  void all_gather(const void* send, void* recv, std::span<const std::size_t> recv_bytes) override {
    constexpr auto kind = CollectiveKind::AllGather;
    const int n = size();
    check_entries(kind, "recv_bytes", recv_bytes.size());
    const Call call = enter(kind);
    const auto deadline = call.deadline;
    auto* out = static_cast<std::byte*>(recv);
    const std::size_t my_off = prefix(recv_bytes, rank_);
    if (n == 1) {
      move_bytes(out + my_off, send, recv_bytes[0]);
      stats_.record(kind, 0);
      return;
    }
    Slot s;
    s.desc = {.kind = kind, .v0 = recv_bytes.data()};
    s.send = send;
    const auto seq = post(s, deadline);
    move_bytes(out + my_off, send, recv_bytes[static_cast<std::size_t>(rank_)]);
    std::size_t off = 0, received = 0;
    for (int p = 0; p < n; ++p) {
      const std::size_t b = recv_bytes[static_cast<std::size_t>(p)];
      if (p != rank_) {
        move_bytes(out + off, group_->slot(p, seq).send, b);
        received += b;
      }
      off += b;
    }
    wait_phase(kind, deadline);
    stats_.record(kind, received);
  }

  void reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts, DType dtype,
                      ReduceOp op) override {
    if (reduces_as_average_pairs(dtype, op, size()))
      return backend_detail::reduce_scatter_integer_average(*this, send, recv, counts);
    constexpr auto kind = CollectiveKind::ReduceScatter;
    const std::size_t isz = check_dtype(kind, dtype);
    const int n = size();
    check_entries(kind, "counts", counts.size());
    const Call call = enter(kind);
    const auto deadline = call.deadline;
    const std::size_t my_count = counts[static_cast<std::size_t>(rank_)];
    const std::size_t my_off = prefix(counts, rank_) * isz;
    const auto* own = static_cast<const std::byte*>(send) + my_off;
    if (n == 1) {
      move_bytes(recv, own, my_count * isz);
      stats_.record(kind, 0);
      return;
    }
    Slot s;
    s.desc = {.kind = kind, .dtype = dtype, .op = op, .v0 = counts.data()};
    if (const auto* avg = backend_detail::carried_average()) {  // the pairs of an int64 Avg
      s.desc.op = ReduceOp::Avg;
      s.desc.v0 = avg->counts.data();
    }
    s.send = send;
    const auto seq = post(s, deadline);
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
    wait_phase(kind, deadline);
    if (overlaps) move_bytes(out, acc, my_count * isz);
    stats_.record(kind, static_cast<std::uint64_t>(reduce_scatter_recv_bytes(my_count, n, dtype, op)));
  }

  void all_to_all(const void* send, std::span<const std::size_t> send_bytes, std::span<const std::size_t> send_offsets,
                  void* recv, std::span<const std::size_t> recv_bytes,
                  std::span<const std::size_t> recv_offsets) override {
    constexpr auto kind = CollectiveKind::AllToAll;
    const int n = size();
    checks().all_to_all(send_bytes, send_offsets, recv_bytes, recv_offsets);
    const auto r = static_cast<std::size_t>(rank_);
    const Call call = enter(kind);
    const auto deadline = call.deadline;
    auto* out = static_cast<std::byte*>(recv);
    move_bytes(out + recv_offsets[r], static_cast<const std::byte*>(send) + send_offsets[r], recv_bytes[r]);
    if (n == 1) {
      stats_.record(kind, 0);
      return;
    }
    Slot s;
    s.desc = {.kind = kind, .v0 = send_bytes.data(), .v1 = recv_bytes.data()};
    s.send = send;
    s.send_offsets = send_offsets.data();
    const auto seq = post(s, deadline);
    std::size_t received = 0;
    for (int k = 1; k < n; ++k) {
      const int p = (rank_ + k) % n;
      const Slot& peer = group_->slot(p, seq);
      const std::size_t b = recv_bytes[static_cast<std::size_t>(p)];
      move_bytes(out + recv_offsets[static_cast<std::size_t>(p)],
                 static_cast<const std::byte*>(peer.send) + peer.send_offsets[r], b);
      received += b;
    }
    wait_phase(kind, deadline);
    stats_.record(kind, received);
  }

  void broadcast(void* buf, std::size_t bytes, int root) override {
    constexpr auto kind = CollectiveKind::Broadcast;
    check_root(kind, root);
    const Call call = enter(kind);
    const auto deadline = call.deadline;
    if (size() == 1) {
      stats_.record(kind, 0);
      return;
    }
    Slot s;
    s.desc = {.kind = kind, .root = root, .count = bytes};
    s.recv = buf;
    const auto seq = post(s, deadline);
    if (rank_ != root) move_bytes(buf, group_->slot(root, seq).recv, bytes);
    wait_phase(kind, deadline);
    stats_.record(kind, rank_ != root ? bytes : 0);
  }

  void scatter(const void* send, std::span<const std::size_t> bytes, void* recv, int root) override {
    constexpr auto kind = CollectiveKind::Scatter;
    check_entries(kind, "bytes", bytes.size());
    check_root(kind, root);
    const Call call = enter(kind);
    const auto deadline = call.deadline;
    const std::size_t mine = bytes[static_cast<std::size_t>(rank_)];
    if (size() == 1) {
      move_bytes(recv, send, mine);
      stats_.record(kind, 0);
      return;
    }
    Slot s;
    s.desc = {.kind = kind, .root = root, .v0 = bytes.data()};
    s.send = send;
    const auto seq = post(s, deadline);
    move_bytes(recv, static_cast<const std::byte*>(group_->slot(root, seq).send) + prefix(bytes, rank_), mine);
    wait_phase(kind, deadline);
    stats_.record(kind, rank_ != root ? mine : 0);
  }

  void send(const void* buf, std::size_t bytes, int dst, int tag) override {
    constexpr auto kind = CollectiveKind::SendRecv;
    check_peer("send to", dst);
    const Call call = enter(kind);
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
    stats_.record_message(true, rank_, dst, tag, 0);
  }

  void recv(void* buf, std::size_t bytes, int src, int tag) override {
    constexpr auto kind = CollectiveKind::SendRecv;
    check_peer("recv from", src);
    const Call call = enter(kind);
    const auto deadline = call.deadline;
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
        if (world_->has_failed()) throw peer_failed(kind);
        if (group_->mail_cv.wait_until(lock, deadline) == std::cv_status::timeout && Clock::now() >= deadline) {
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
    if (m.data.size() != bytes) {
      stats_.drop_message(false, rank_, src, tag);
      throw CommError(
          fmt::format("[threads] recv on rank {} of {} from rank {} (tag {}): expected {} bytes but "
                      "the matching send has {} bytes",
                      rank_, size(), src, tag, bytes, m.data.size()));
    }
    if (on_gpu())
      cuda::copy(buf, Device::CUDA, m.data.data(), Device::CPU, bytes);
    else
      copy_bytes(buf, m.data.data(), bytes);
    stats_.record_message(false, rank_, src, tag, bytes);
  }

  void barrier() override {
    constexpr auto kind = CollectiveKind::Barrier;
    const Call call = enter(kind);
    const auto deadline = call.deadline;
    if (size() > 1) {
      Slot s;
      s.desc = {.kind = kind};
      post(s, deadline);  // one barrier suffices: no buffers are shared
    }
    stats_.record(kind, 0);
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    constexpr auto kind = CollectiveKind::Split;
    const Call call = enter(kind);
    const auto deadline = call.deadline;
    const int n = size();
    std::shared_ptr<Group> group;
    int new_rank = 0;
    if (n == 1) {
      if (color >= 0) {
        group = std::make_shared<Group>(std::vector<int>{world_rank_});
        world_->add_group(group);
      }
    } else {
      Slot s;
      s.desc = {.kind = kind, .color = color, .key = key};
      const auto seq = post(s, deadline);
      if (color >= 0) {
        std::vector<std::pair<int, int>> members;  // (key, group rank)
        for (int p = 0; p < n; ++p) {
          const auto& d = group_->slot(p, seq).desc;
          if (d.color == color) members.emplace_back(d.key, p);
        }
        std::sort(members.begin(), members.end());
        for (std::size_t i = 0; i < members.size(); ++i)
          if (members[i].second == rank_) new_rank = static_cast<int>(i);
        if (new_rank == 0) {
          std::vector<int> ranks;
          for (auto& m : members) ranks.push_back(group_->world_ranks[static_cast<std::size_t>(m.second)]);
          group = std::make_shared<Group>(std::move(ranks));
          world_->add_group(group);
          group_->slot(rank_, seq).new_group = group;
        }
        wait_phase(kind, deadline);
        if (new_rank != 0) group = group_->slot(members[0].second, seq).new_group;
      } else {
        wait_phase(kind, deadline);
      }
      // The leader's slot still holds the group until it is posted again;
      // the closing barrier keeps it from being reset while peers read it.
      wait_phase(kind, deadline);
      if (new_rank == 0 && group) group_->slot(rank_, seq).new_group.reset();
    }
    stats_.record(kind, 0);
    if (!group) return nullptr;
    return std::make_unique<ThreadsCommunicator>(world_, std::move(group), new_rank);
  }

 private:
  // acc = own op peer_1 op ... op peer_{n-1} over `elems` elements that sit
  // at byte `offset` of every peer's posted send buffer (Avg: then / n).
  // Block by block, so the accumulator stays in cache while every peer's
  // block is folded in.
  void fold_peers(std::byte* acc, const std::byte* own, std::size_t offset, std::size_t elems, DType dtype, ReduceOp op,
                  std::uint64_t seq) {
    const int n = size();
    const std::size_t isz = itemsize(dtype);
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
    if (op == ReduceOp::Avg && elems != 0) {
      if (on_gpu())
        cuda::divide_by(acc, elems, dtype, n);
      else
        divide_by(acc, elems, dtype, n);
    }
  }

  std::size_t check_dtype(CollectiveKind, DType dtype) const { return itemsize(dtype); }

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
  backend_detail::ArgumentChecks checks() const { return {"threads", rank_, size()}; }
  void check_entries(CollectiveKind kind, std::string_view what, std::size_t entries) const {
    checks().entries(kind, what, entries);
  }
  void check_root(CollectiveKind kind, int root) const { checks().root(kind, root); }
  void check_peer(std::string_view what, int peer) const { checks().peer(what, peer); }

  PeerFailed peer_failed(CollectiveKind kind) const {
    if (world_->failed_rank < 0)  // run_threads itself could not start every rank
      return PeerFailed(
          fmt::format("[threads] {} on rank {} of {}: {}", collective_name(kind), rank_, size(), world_->failed_msg));
    return PeerFailed(fmt::format("[threads] {} on rank {} of {}: rank {} failed: {}", collective_name(kind), rank_,
                                  size(), world_->failed_rank, world_->failed_msg));
  }

  // One collective call: its deadline, and this rank's Activity marked as
  // inside it until the call returns or throws.
  struct Call {
    Activity& activity;
    Clock::time_point deadline;
    Call(Activity& a, Clock::time_point d) : activity(a), deadline(d) {}
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;
    ~Call() { activity.inside.store(false, std::memory_order_relaxed); }
  };

  // Fails at once if the world has failed (a broken group is caught when
  // posting); returns the call, with its deadline.
  Call enter(CollectiveKind kind) {
    if (world_->has_failed()) throw peer_failed(kind);
    Activity& a = world_->activity[static_cast<std::size_t>(world_rank_)];
    a.kind.store(static_cast<int>(kind), std::memory_order_relaxed);
    a.calls.store(a.calls.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    a.inside.store(true, std::memory_order_relaxed);
    stats_.begin();
    return Call(a, Clock::now() + timeout());  // guaranteed elision: one Call, one reset
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
  std::uint64_t post(const Slot& s, Clock::time_point deadline) {
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
      const std::uint64_t my_gen = g.gen;
      if (++g.arrived == g.n) {
        g.arrived = 0;
        ++g.gen;
        lock.unlock();
        g.cv.notify_all();
      } else {
        while (g.gen == my_gen) {
          if (g.broken) throw_broken(kind);
          if (world_->has_failed()) {
            g.broken = true;
            g.broken_msg = fmt::format("rank {} failed: {}", world_->failed_rank, world_->failed_msg);
            lock.unlock();
            g.cv.notify_all();
            throw peer_failed(kind);
          }
          if (g.cv.wait_until(lock, deadline) == std::cv_status::timeout && g.gen == my_gen && !g.broken &&
              !world_->has_failed()) {
            const auto missing = missing_ranks(seq);
            const auto msg =
                fmt::format("{} on rank {} of {} timed out after {} ms waiting for rank(s) {}", collective_name(kind),
                            rank_, g.n, timeout().count(), fmt::join(missing, ", "));
            g.broken = true;
            g.broken_by_timeout = true;
            g.broken_msg = msg;
            lock.unlock();
            g.cv.notify_all();
            note_late(missing);
            throw CommTimeout("[threads] " + msg);
          }
        }
      }
    }
    if (auto msg = check_agreement(seq); !msg.empty()) {
      wait_phase(kind, deadline);  // peers may still read this round's slots
      throw CollectiveMismatch(msg);
    }
    return seq;
  }

  // M and B: not abortable (see the file comment).
  void wait_phase(CollectiveKind kind, Clock::time_point deadline) {
    settle();
    Group& g = *group_;
    std::unique_lock lock(g.mu);
    const std::uint64_t my_gen = g.gen;
    if (++g.arrived == g.n) {
      g.arrived = 0;
      ++g.gen;
      lock.unlock();
      g.cv.notify_all();
      return;
    }
    if (!g.cv.wait_until(lock, deadline, [&] { return g.gen != my_gen; })) {
      g.broken = true;
      g.broken_by_timeout = true;
      g.broken_msg = fmt::format("{} on rank {} of {} timed out after {} ms inside the collective",
                                 collective_name(kind), rank_, g.n, timeout().count());
      lock.unlock();
      g.cv.notify_all();
      throw CommTimeout("[threads] " + g.broken_msg);
    }
  }

  // A pure function of the round's slot table, so every rank reaches the
  // same verdict. Empty when the calls agree.
  std::string check_agreement(std::uint64_t seq) const {
    const Group& g = *group_;
    const int n = g.n;
    auto d = [&](int p) -> const Descriptor& { return const_cast<Group&>(g).slot(p, seq).desc; };
    auto mismatch = [&](int a, int b, std::string_view why) {
      return fmt::format(
          "[threads] collective mismatch in a group of {} (seen on rank {}): rank {} called {} but rank "
          "{} called {}{}",
          n, rank_, a, describe(d(a), n), b, describe(d(b), n), why);
    };
    const Descriptor& d0 = d(0);
    for (int p = 1; p < n; ++p) {
      const Descriptor& dp = d(p);
      if (dp.kind != d0.kind) return mismatch(0, p, "");
      switch (d0.kind) {
        case CollectiveKind::AllReduce:
          if (dp.count != d0.count || dp.dtype != d0.dtype || dp.op != d0.op) return mismatch(0, p, "");
          break;
        case CollectiveKind::AllGather:
          if (!same_sizes(dp.v0, d0.v0, n)) return mismatch(0, p, "");
          break;
        case CollectiveKind::ReduceScatter:
          if (!same_sizes(dp.v0, d0.v0, n) || dp.dtype != d0.dtype || dp.op != d0.op) return mismatch(0, p, "");
          break;
        case CollectiveKind::Broadcast:
          if (dp.count != d0.count || dp.root != d0.root) return mismatch(0, p, "");
          break;
        case CollectiveKind::Scatter:
          if (!same_sizes(dp.v0, d0.v0, n) || dp.root != d0.root) return mismatch(0, p, "");
          break;
        default: break;
      }
    }
    if (d0.kind == CollectiveKind::AllToAll) {
      for (int p = 0; p < n; ++p)
        for (int q = 0; q < n; ++q)
          if (d(p).v0[q] != d(q).v1[p])
            return mismatch(p, q,
                            fmt::format(" (rank {} sends {} bytes to rank {}, which expects {})", p, d(p).v0[q], q,
                                        d(q).v1[p]));
    }
    return {};
  }

  std::shared_ptr<World> world_;
  std::shared_ptr<Group> group_;
  int rank_;
  int world_rank_;
  backend_detail::StatsRecorder stats_;
  std::uint64_t seq_ = 0;  // rounds this rank has posted on the group
};

}  // namespace

namespace threads_detail {

std::unique_ptr<Communicator> make_communicator(std::shared_ptr<World> world, std::shared_ptr<Group> group, int rank) {
  return std::make_unique<ThreadsCommunicator>(std::move(world), std::move(group), rank);
}

}  // namespace threads_detail
}  // namespace dtensor
