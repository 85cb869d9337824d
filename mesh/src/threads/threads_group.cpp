#include "threads_group.h"

#include <algorithm>
#include <cstring>

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
