#include "dtensor/core/memory_account.h"

#include <cstdlib>
#include <utility>

#include <fmt/format.h>

#include "dtensor/core/error.h"
#include "dtensor/core/units.h"

namespace dtensor {
namespace {
thread_local std::shared_ptr<MemoryAccount> current_account;
}  // namespace

void MemoryAccount::charge(std::size_t bytes) {
  const std::size_t now = in_use_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  if (const std::size_t budget = budget_.load(std::memory_order_relaxed); budget > 0 && now > budget) {
    in_use_.fetch_sub(bytes, std::memory_order_relaxed);
    const auto human = [](std::size_t b) { return human_bytes(static_cast<std::int64_t>(b)); };
    throw OutOfBudget(fmt::format("[memory] {}: {} more would hold {} in use, past the budget of {} ({} bytes); the "
                                  "peak so far {}",
                                  owner_, human(bytes), human(now), human(budget), budget,
                                  human(peak_.load(std::memory_order_relaxed))));
  }
  std::size_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void MemoryAccount::set_budget(std::size_t bytes, std::string owner) {
  owner_ = std::move(owner);
  budget_.store(bytes, std::memory_order_relaxed);
}

std::optional<std::size_t> memory_budget_from_environment() {
  const char* text = std::getenv("DTENSOR_MEMORY_BUDGET");
  if (text == nullptr || *text == '\0') return std::nullopt;
  try {
    return static_cast<std::size_t>(parse_bytes(text));
  } catch (const ParseError& e) {
    throw ParseError(fmt::format("[memory] DTENSOR_MEMORY_BUDGET: {}", e.what()));
  }
}

ChargeMemoryTo::ChargeMemoryTo(std::shared_ptr<MemoryAccount> account)
    : previous_(std::exchange(current_account, std::move(account))) {}

ChargeMemoryTo::~ChargeMemoryTo() { current_account = std::move(previous_); }

const std::shared_ptr<MemoryAccount>& charged_account() { return current_account; }

}  // namespace dtensor
