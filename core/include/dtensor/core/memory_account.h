#pragma once
// Who holds the tensor memory. A process per rank reads its bytes from
// host_memory_stats(); thread ranks share one process, so each charges its
// own account instead: while a ChargeMemoryTo guard is alive on a thread,
// every tensor that thread allocates (CPU or CUDA) is charged to the
// account, and uncharged when its storage is freed, on whichever thread.
// Counted in the bytes asked for (a tensor's nbytes), not the allocator's
// rounded blocks, so the figure is the same on every device and allocator.
#include <atomic>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

namespace dtensor {

class MemoryAccount {
 public:
  /// Bytes of live tensors charged to this account.
  std::size_t bytes_in_use() const { return in_use_.load(std::memory_order_relaxed); }
  /// The most bytes in use at once since creation or the last reset_peak().
  std::size_t peak_bytes() const { return peak_.load(std::memory_order_relaxed); }
  /// Starts a new peak from the bytes in use now (e.g. at a step's start).
  void reset_peak() { peak_.store(bytes_in_use(), std::memory_order_relaxed); }

  /// Takes `bytes` into the account; OutOfBudget, taking nothing, where
  /// that would hold more than the budget in use.
  void charge(std::size_t bytes);
  void uncharge(std::size_t bytes) { in_use_.fetch_sub(bytes, std::memory_order_relaxed); }

  /// From now on no allocation may take the bytes in use past `bytes`
  /// (0: no budget): charge() throws OutOfBudget naming `owner` ("rank
  /// 3"). Set it before other threads charge the account.
  void set_budget(std::size_t bytes, std::string owner);
  std::size_t budget() const { return budget_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::size_t> in_use_{0};
  std::atomic<std::size_t> peak_{0};
  std::atomic<std::size_t> budget_{0};
  std::string owner_;
};

/// DTENSOR_MEMORY_BUDGET as bytes (parse_bytes: "512MiB"), or none where it
/// is unset or empty. ParseError naming the variable if it does not parse.
std::optional<std::size_t> memory_budget_from_environment();

/// Charges this thread's tensor allocations to `account` while alive; the
/// account before it (or none) comes back at its end. Guards nest.
class ChargeMemoryTo {
 public:
  explicit ChargeMemoryTo(std::shared_ptr<MemoryAccount> account);
  ~ChargeMemoryTo();
  ChargeMemoryTo(const ChargeMemoryTo&) = delete;
  ChargeMemoryTo& operator=(const ChargeMemoryTo&) = delete;

 private:
  std::shared_ptr<MemoryAccount> previous_;
};

/// The account this thread charges now (null: none).
const std::shared_ptr<MemoryAccount>& charged_account();

}  // namespace dtensor
