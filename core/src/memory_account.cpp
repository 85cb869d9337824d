#include "dtensor/core/memory_account.h"

#include <utility>

namespace dtensor {
namespace {
thread_local std::shared_ptr<MemoryAccount> current_account;
}  // namespace

void MemoryAccount::charge(std::size_t bytes) {
  const std::size_t now = in_use_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  std::size_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

ChargeMemoryTo::ChargeMemoryTo(std::shared_ptr<MemoryAccount> account)
    : previous_(std::exchange(current_account, std::move(account))) {}

ChargeMemoryTo::~ChargeMemoryTo() { current_account = std::move(previous_); }

const std::shared_ptr<MemoryAccount>& charged_account() { return current_account; }

}  // namespace dtensor
