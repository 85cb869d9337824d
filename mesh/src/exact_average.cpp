#include "exact_average.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "dtensor/core/cuda.h"
#include "dtensor/core/shape.h"
#include "dtensor/core/tensor.h"

namespace dtensor::backend_detail {
namespace {

// Pairs for `count` values at x, in a buffer on the communicator's device.
Tensor split(Communicator& comm, const void* x, std::size_t count) {
  Tensor pairs = Tensor::empty({static_cast<std::int64_t>(2 * count)}, DType::Int64, comm.device());
  const auto* in = static_cast<const std::int64_t*>(x);
  if (comm.device() == Device::CUDA)
    cuda::average_split(in, pairs.data_as<std::int64_t>(), count, comm.size());
  else
    average_split(in, pairs.data_as<std::int64_t>(), count, comm.size());
  return pairs;
}

void finish(Communicator& comm, const Tensor& pairs, void* out, std::size_t count) {
  auto* o = static_cast<std::int64_t*>(out);
  if (comm.device() == Device::CUDA)
    cuda::average_finish(pairs.data_as<std::int64_t>(), o, count, comm.size());
  else
    average_finish(pairs.data_as<std::int64_t>(), o, count, comm.size());
}

// The int64 Avg call whose pairs this thread is reducing now.
struct CarriedAverage {
  std::size_t count = 0;                // all_reduce: the caller's count
  std::span<const std::size_t> counts;  // reduce_scatter: the caller's counts
};
thread_local const CarriedAverage* carried = nullptr;

std::size_t total_of(std::span<const std::size_t> counts) {
  std::size_t total = 0;
  for (std::size_t c : counts) total += c;
  return total;
}

// Marks the inner call as carrying `call` while alive.
class Carrying {
 public:
  explicit Carrying(const CarriedAverage& call) : previous_(std::exchange(carried, &call)) {}
  ~Carrying() { carried = previous_; }
  Carrying(const Carrying&) = delete;
  Carrying& operator=(const Carrying&) = delete;

 private:
  const CarriedAverage* previous_;
};

}  // namespace

CallAsMade all_reduce_as_made(ReduceOp op, std::size_t count) {
  if (carried != nullptr) return {.op = ReduceOp::Avg, .count = carried->count, .counts = {}};
  return {.op = op, .count = count, .counts = {}};
}

CallAsMade reduce_scatter_as_made(ReduceOp op, std::span<const std::size_t> counts) {
  if (carried != nullptr) return {.op = ReduceOp::Avg, .count = total_of(carried->counts), .counts = carried->counts};
  return {.op = op, .count = total_of(counts), .counts = counts};
}

void all_reduce_integer_average(Communicator& comm, const void* send, void* recv, std::size_t count) {
  Tensor pairs = split(comm, send, count);
  const CarriedAverage call{.count = count, .counts = {}};
  const Carrying carrying(call);
  comm.all_reduce(pairs.bytes(), pairs.bytes(), 2 * count, DType::Int64, ReduceOp::Sum);
  finish(comm, pairs, recv, count);
}

void reduce_scatter_integer_average(Communicator& comm, const void* send, void* recv,
                                    std::span<const std::size_t> counts) {
  // Rank p's block of pairs is the pairs of its block of values: the
  // interleaved layout keeps every block contiguous, at twice the count.
  std::vector<std::size_t> doubled(counts.begin(), counts.end());
  std::size_t total = 0;
  for (std::size_t& c : doubled) {
    total += c;
    c *= 2;
  }
  Tensor pairs = split(comm, send, total);
  const auto r = static_cast<std::size_t>(comm.rank());
  const std::size_t mine = r < counts.size() ? counts[r] : 0;  // a wrong list is the inner call's error
  Tensor reduced = Tensor::empty({static_cast<std::int64_t>(2 * mine)}, DType::Int64, comm.device());
  const CarriedAverage call{.count = 0, .counts = counts};
  {
    const Carrying carrying(call);
    comm.reduce_scatter(pairs.bytes(), reduced.bytes(), doubled, DType::Int64, ReduceOp::Sum);
  }
  finish(comm, reduced, recv, mine);
}

}  // namespace dtensor::backend_detail
