#pragma once
// The collective suite, written once (tests/collective_cases.cpp) and
// instantiated per buffer kind and communicator: host buffers on thread
// ranks or the processes of an MPI job (tests/test_collectives.cpp), device
// buffers on simulated GPU ranks or an NCCL local group
// (tests/test_device_collectives.cpp). Each case takes an Engine: where its
// ranks run, what backend they report, and where their buffers live.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm_checks.h"
#include "dtensor/mesh/communicator.h"

namespace comm_test {

enum class Buffers { Host, Device };

/// `bytes` of memory of one kind, written and read through host vectors (a
/// device copy for device memory). Filled with 0xee until written, so that a
/// collective that leaves bytes unwritten is seen.
class Buffer {
 public:
  Buffer(Buffers kind, std::size_t bytes);
  std::byte* data() { return mem_.get(); }
  std::size_t bytes() const { return bytes_; }
  void upload(const void* src, std::size_t n, std::size_t offset = 0);
  template <class T>
  std::vector<T> download(std::size_t offset_bytes, std::size_t count) const {
    std::vector<T> out(count);
    read(out.data(), offset_bytes, count * sizeof(T));
    return out;
  }

 private:
  void read(void* dst, std::size_t offset, std::size_t n) const;
  Buffers kind_;
  std::shared_ptr<std::byte[]> mem_;
  std::size_t bytes_;
};

/// A Buffer of `kind` holding `values`.
template <class T>
Buffer upload(Buffers kind, const std::vector<T>& values) {
  Buffer b(kind, values.size() * sizeof(T));
  b.upload(values.data(), b.bytes());
  return b;
}

/// Where the checks run.
struct Engine {
  std::string backend;  // what comm.backend() says, and the "[backend]" of its messages
  int n;                // ranks
  Buffers buffers;
  /// A send waits for its receive (NCCL): the ranks order their point to
  /// point calls so that none waits on another that also sends first.
  bool rendezvous_sends = false;
  /// Runs fn on every rank; a check that fails on a rank goes to failures.
  std::function<void(Failures&, const std::function<void(Communicator&)>&)> run;
};

void all_reduce_values_and_bytes(const Engine& engine);
void all_gather_uneven_equal_and_in_place(const Engine& engine);
void reduce_scatter_values_and_bytes(const Engine& engine);
void all_to_all_broadcast_scatter_barrier(const Engine& engine);
void send_recv_tags_and_size_mismatch(const Engine& engine);
void argument_checks(const Engine& engine);
void split_groups_and_shared_stats(const Engine& engine);

}  // namespace comm_test

/// X(name) for every case above: each test file instantiates the list with
/// its own test-case macro.
#define COLLECTIVE_CASES(X)               \
  X(all_reduce_values_and_bytes)          \
  X(all_gather_uneven_equal_and_in_place) \
  X(reduce_scatter_values_and_bytes)      \
  X(all_to_all_broadcast_scatter_barrier) \
  X(send_recv_tags_and_size_mismatch)     \
  X(argument_checks)                      \
  X(split_groups_and_shared_stats)
