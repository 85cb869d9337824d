#include "outcome.h"

#include <algorithm>
#include <cstring>
#include <exception>

#include <fmt/format.h>

#include "dtensor/core/error.h"

namespace dtensor::dcp {
namespace {
constexpr std::size_t kMessageBytes = 1024;  // first byte: failed; then the message, cut to fit
}  // namespace

void agree(Communicator* comm, std::string_view what, const std::function<void()>& step) {
  std::exception_ptr failure;
  std::string message;
  try {
    step();
  } catch (const std::exception& e) {
    failure = std::current_exception();
    message = e.what();
  }
  if (!comm || comm->size() == 1) {
    if (failure) std::rethrow_exception(failure);
    return;
  }
  std::vector<char> mine(kMessageBytes, '\0');
  mine[0] = failure ? 1 : 0;
  std::memcpy(mine.data() + 1, message.data(), std::min(message.size(), kMessageBytes - 2));
  const auto n = static_cast<std::size_t>(comm->size());
  std::vector<char> all(n * kMessageBytes);
  const std::vector<std::size_t> sizes(n, kMessageBytes);
  comm->all_gather(mine.data(), all.data(), sizes);
  if (failure) std::rethrow_exception(failure);
  for (std::size_t r = 0; r < n; ++r)
    if (all[r * kMessageBytes])
      throw CheckpointError(
          fmt::format("[checkpoint] rank {} failed {}: {}", r, what, std::string(all.data() + r * kMessageBytes + 1)));
}

std::vector<std::string> gather_texts(Communicator* comm, const std::string& text) {
  if (!comm || comm->size() == 1) return {text};
  const auto n = static_cast<std::size_t>(comm->size());
  std::uint64_t mine = text.size();
  std::vector<std::uint64_t> lengths(n);
  comm->all_gather(&mine, lengths.data(), std::vector<std::size_t>(n, sizeof(mine)));
  std::vector<std::size_t> sizes(lengths.begin(), lengths.end());
  std::size_t total = 0;
  for (std::size_t s : sizes) total += s;
  std::string all(total, '\0');
  comm->all_gather(text.data(), all.data(), sizes);
  std::vector<std::string> out;
  std::size_t at = 0;
  for (std::size_t s : sizes) {
    out.push_back(all.substr(at, s));
    at += s;
  }
  return out;
}

}  // namespace dtensor::dcp
