#include "threads_group.h"

#include <algorithm>
#include <cstring>
#include <string_view>
#include <utility>

#include <fmt/format.h>

namespace dtensor::threads_detail {

void World::fail(int rank, std::string msg) {
  std::vector<std::shared_ptr<Group>> live;
  {
    std::lock_guard lock(mu);
    if (!failed.load(std::memory_order_relaxed)) {
      failed_rank = rank;
      failed_msg = std::move(msg);
      failed.store(true, std::memory_order_release);
    }
    for (auto& w : groups)
      if (auto g = w.lock()) live.push_back(std::move(g));
  }
  // Taking each group's lock after setting the flag means every waiter has
  // either seen the flag or is already blocked and gets this notification.
  for (auto& g : live) {
    { std::lock_guard lock(g->mu); }
    g->cv.notify_all();
    g->mail_cv.notify_all();
  }
}

void World::note_late(const std::vector<int>& ranks) {
  std::lock_guard lock(mu);
  for (int r : ranks)
    if (std::find(late.begin(), late.end(), r) == late.end()) late.push_back(r);
}

std::string Activity::text() const {
  const auto n = calls.load(std::memory_order_relaxed);
  const int k = kind.load(std::memory_order_relaxed);
  if (n == 0 || k < 0) return "running user code since it started (no collective yet)";
  const auto name = collective_name(static_cast<CollectiveKind>(k));
  if (inside.load(std::memory_order_relaxed)) return fmt::format("inside its {} (collective {})", name, n);
  return fmt::format("running user code since its {} (collective {}) returned", name, n);
}

std::string sizes_text(const std::size_t* v, int n) {
  if (v == nullptr) return "[]";
  std::string out = "[";
  for (int i = 0; i < n; ++i) {
    if (i == 8) {
      out += fmt::format(", ... ({} entries)", n);
      break;
    }
    out += fmt::format("{}{}", i ? ", " : "", v[i]);
  }
  return out + "]";
}

std::string describe(const Descriptor& d, int n) {
  const auto name = collective_name(d.kind);
  switch (d.kind) {
    case CollectiveKind::AllReduce: return fmt::format("{}(count={}, dtype={}, op={})", name, d.count, d.dtype, d.op);
    case CollectiveKind::AllGather: return fmt::format("{}(recv_bytes={})", name, sizes_text(d.v0, n));
    case CollectiveKind::ReduceScatter:
      return fmt::format("{}(counts={}, dtype={}, op={})", name, sizes_text(d.v0, n), d.dtype, d.op);
    case CollectiveKind::AllToAll:
      return fmt::format("{}(send_bytes={}, recv_bytes={})", name, sizes_text(d.v0, n), sizes_text(d.v1, n));
    case CollectiveKind::Broadcast: return fmt::format("{}(bytes={}, root={})", name, d.count, d.root);
    case CollectiveKind::Scatter: return fmt::format("{}(bytes={}, root={})", name, sizes_text(d.v0, n), d.root);
    default: return fmt::format("{}()", name);
  }
}

bool Group::arrive(std::unique_lock<std::mutex>& lock, std::uint64_t& gen_before) {
  gen_before = gen;
  if (++arrived != n) return false;
  arrived = 0;
  ++gen;
  lock.unlock();
  cv.notify_all();
  return true;
}

void Group::fail(std::unique_lock<std::mutex>& lock, std::string msg, bool by_timeout) {
  broken = true;
  broken_by_timeout = by_timeout;
  broken_msg = std::move(msg);
  lock.unlock();
  cv.notify_all();
}

std::string mismatch(Group& g, std::uint64_t seq, int seen_on) {
  const int n = g.n;
  auto d = [&](int p) -> const Descriptor& { return g.slot(p, seq).desc; };
  auto text = [&](int a, int b, std::string_view why) {
    return fmt::format(
        "[threads] collective mismatch in a group of {} (seen on rank {}): rank {} called {} but rank "
        "{} called {}{}",
        n, seen_on, a, describe(d(a), n), b, describe(d(b), n), why);
  };
  const Descriptor& d0 = d(0);
  for (int p = 1; p < n; ++p) {
    const Descriptor& dp = d(p);
    if (dp.kind != d0.kind) return text(0, p, "");
    switch (d0.kind) {
      case CollectiveKind::AllReduce:
        if (dp.count != d0.count || dp.dtype != d0.dtype || dp.op != d0.op) return text(0, p, "");
        break;
      case CollectiveKind::AllGather:
        if (!same_sizes(dp.v0, d0.v0, n)) return text(0, p, "");
        break;
      case CollectiveKind::ReduceScatter:
        if (!same_sizes(dp.v0, d0.v0, n) || dp.dtype != d0.dtype || dp.op != d0.op) return text(0, p, "");
        break;
      case CollectiveKind::Broadcast:
        if (dp.count != d0.count || dp.root != d0.root) return text(0, p, "");
        break;
      case CollectiveKind::Scatter:
        if (!same_sizes(dp.v0, d0.v0, n) || dp.root != d0.root) return text(0, p, "");
        break;
      default: break;
    }
  }
  if (d0.kind == CollectiveKind::AllToAll) {
    for (int p = 0; p < n; ++p)
      for (int q = 0; q < n; ++q)
        if (d(p).v0[q] != d(q).v1[p])
          return text(p, q,
                      fmt::format(" (rank {} sends {} bytes to rank {}, which expects {})", p, d(p).v0[q], q,
                                  d(q).v1[p]));
  }
  return {};
}

bool same_sizes(const std::size_t* a, const std::size_t* b, int n) { return n == 0 || std::equal(a, a + n, b); }

std::size_t prefix(std::span<const std::size_t> v, int i) {
  std::size_t s = 0;
  for (int j = 0; j < i; ++j) s += v[static_cast<std::size_t>(j)];
  return s;
}

void copy_bytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes != 0 && dst != src) std::memcpy(dst, src, bytes);
}

}  // namespace dtensor::threads_detail
