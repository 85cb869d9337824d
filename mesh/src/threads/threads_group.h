#pragma once
// Internal to the threads backend: the state shared by the ranks of one
// process (World) and of one communicator group (Group, its slot table and
// mailboxes), the phase boundaries and the agreement check on its slot
// table, and the text of collective descriptors for error messages.
// See threads_communicator.cpp for the protocol that uses them.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "dtensor/mesh/communicator.h"
#include "dtensor/mesh/threads.h"

namespace dtensor::threads_detail {

using Clock = std::chrono::steady_clock;

// Elements reduced per step: the accumulator block stays in cache while every
// peer's block is folded into it.
constexpr std::size_t kReduceBlockBytes = 32 * 1024;

struct Group;

// What a rank was last doing, for the report on a rank that never returns
// (see run_threads). Written by the rank's own thread on entering and leaving
// each collective, read by the thread that called run_threads: relaxed, as
// the report needs a recent value, not an ordering.
struct Activity {
  std::atomic<std::uint64_t> calls{0};  // collectives entered so far
  std::atomic<int> kind{-1};            // CollectiveKind of the last one; -1: none yet
  std::atomic<bool> inside{false};      // still inside it

  std::string text() const;  // "inside its all_reduce (collective 3)", ...
};

struct World {
  World(int n, ThreadsOptions o)
      : size(n), options(o), stats(static_cast<std::size_t>(n)), activity(new Activity[static_cast<std::size_t>(n)]) {}

  int size;
  ThreadsOptions options;
  std::vector<CommStats> stats;          // one per process rank, touched by its own thread only
  std::unique_ptr<Activity[]> activity;  // one per process rank

  std::atomic<bool> failed{false};
  // Written once, before `failed` is released; read only after acquiring it.
  int failed_rank = -1;
  std::string failed_msg;

  std::mutex mu;
  std::vector<std::weak_ptr<Group>> groups;

  void add_group(const std::shared_ptr<Group>& g) {
    std::lock_guard lock(mu);
    std::erase_if(groups, [](const std::weak_ptr<Group>& w) { return w.expired(); });
    groups.push_back(g);
  }
  // Process ranks that a collective timed out waiting for: if the world
  // fails, run_threads gives them less time to return (see run_threads.cpp).
  std::vector<int> late;  // guarded by mu

  void fail(int rank, std::string msg);
  void note_late(const std::vector<int>& ranks);
  bool has_failed() const { return failed.load(std::memory_order_acquire); }
};

struct Descriptor {
  CollectiveKind kind = CollectiveKind::Barrier;
  DType dtype = DType::Float32;
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  std::size_t count = 0;            // all_reduce elements, broadcast bytes
  const std::size_t* v0 = nullptr;  // per-rank sizes (n entries) the group must agree on
  const std::size_t* v1 = nullptr;  // all_to_all: recv_bytes
  int color = 0, key = 0;           // split
};

struct alignas(64) Slot {
  std::uint64_t seq = ~std::uint64_t{0};  // round this slot was posted for
  Descriptor desc;
  const void* send = nullptr;
  void* recv = nullptr;
  const std::size_t* send_offsets = nullptr;
  const std::size_t* recv_offsets = nullptr;
  std::shared_ptr<Group> new_group;  // split: the leader publishes the group here
};

struct Message {
  std::vector<std::byte> data;
};

struct Group {
  Group(std::vector<int> ranks) : n(static_cast<int>(ranks.size())), world_ranks(std::move(ranks)) {
    slots.resize(static_cast<std::size_t>(2 * n));
  }
  Slot& slot(int rank, std::uint64_t seq) { return slots[static_cast<std::size_t>(2 * rank) + (seq & 1)]; }

  const int n;
  const std::vector<int> world_ranks;  // group rank -> process rank

  std::mutex mu;
  std::condition_variable cv;       // barrier
  std::condition_variable mail_cv;  // mailboxes
  int arrived = 0;
  std::uint64_t gen = 0;
  // Set when a rank left barrier A without it completing: the round can
  // never complete, and every later call on the group fails at once.
  bool broken = false;
  bool broken_by_timeout = false;
  std::string broken_msg;

  std::vector<Slot> slots;                                        // [rank][round parity]
  std::map<std::tuple<int, int, int>, std::deque<Message>> mail;  // (src, dst, tag)

  // A phase boundary, with `lock` held on mu: counts this rank in. The last
  // rank to arrive starts the next generation, unlocks and wakes the others,
  // and gets true; the others get false and the generation they must wait
  // past in `gen_before`, the lock still held.
  bool arrive(std::unique_lock<std::mutex>& lock, std::uint64_t& gen_before);
  // Marks the group unusable for every rank (`msg` says why), then unlocks
  // `lock` and wakes every waiter.
  void fail(std::unique_lock<std::mutex>& lock, std::string msg, bool by_timeout);
};

// The communicator of group rank `rank` of `group` (threads_communicator.cpp).
std::unique_ptr<Communicator> make_communicator(std::shared_ptr<World> world, std::shared_ptr<Group> group, int rank);

std::string sizes_text(const std::size_t* v, int n);
std::string describe(const Descriptor& d, int n);
// Whether the group's calls of round `seq` agree: empty if so, else the
// CollectiveMismatch message as rank `seen_on` words it. A pure function of
// the round's slot table, so every rank reaches the same verdict.
std::string mismatch(Group& g, std::uint64_t seq, int seen_on);
bool same_sizes(const std::size_t* a, const std::size_t* b, int n);
std::size_t prefix(std::span<const std::size_t> v, int i);
void copy_bytes(void* dst, const void* src, std::size_t bytes);

}  // namespace dtensor::threads_detail
