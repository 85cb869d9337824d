#pragma once
// Internal to the NCCL backend: its communicator. nccl_communicator.cpp
// holds the collectives and how a call is issued and waited for;
// nccl_messages.cpp the point-to-point messages. Compiled only in a build
// with NCCL.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend_communicator.h"
#include "nccl_detail.h"

namespace dtensor::nccl_detail {

// The header of a point-to-point message.
struct Header {
  std::int64_t tag = 0;
  std::int64_t bytes = 0;
};
static_assert(sizeof(Header) == 16);

// A message received ahead of the recv that asks for it.
struct Stashed {
  std::shared_ptr<std::byte[]> data;
  std::size_t bytes = 0;
};

// Records the first failed NCCL call of a group; the group is closed
// before anything is thrown (aborting inside an open group is not allowed).
class Issue {
 public:
  void operator()(ncclResult_t rc, const char* call) {
    if (rc != ncclSuccess && rc != ncclInProgress && rc_ == ncclSuccess) {
      rc_ = rc;
      call_ = call;
    }
  }
  ncclResult_t rc_ = ncclSuccess;
  const char* call_ = "";
};

class NcclCommunicator final : public backend_detail::BackendCommunicator {
 public:
  NcclCommunicator(ncclComm_t comm, int device, std::shared_ptr<CommStats> stats, std::chrono::milliseconds timeout);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "nccl"; }
  Device device() const override { return Device::CUDA; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

 protected:
  // Fails at once on a communicator that an earlier failure left unusable;
  // makes the communicator's device current and takes the caller's stream.
  void enter(CollectiveKind kind) override;
  void do_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) override;
  void do_all_gather(const void* send, void* recv, std::span<const std::size_t> recv_bytes) override;
  void do_reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts, DType dtype,
                         ReduceOp op) override;
  void do_all_to_all(const void* send, std::span<const std::size_t> send_bytes,
                     std::span<const std::size_t> send_offsets, void* recv, std::span<const std::size_t> recv_bytes,
                     std::span<const std::size_t> recv_offsets) override;
  void do_broadcast(void* buf, std::size_t bytes, int root) override;
  void do_scatter(const void* send, std::span<const std::size_t> bytes, void* recv, int root) override;
  void do_send(const void* buf, std::size_t bytes, int dst, int tag) override;
  std::size_t do_recv(void* buf, std::size_t bytes, int src, int tag) override;
  void do_barrier() override;
  std::unique_ptr<Communicator> do_split(int color, int key) override;

 private:
  // reduce_scatter's body on keys (offsets_ already hold the prefix sums);
  // returns once the result is in recv.
  void reduce_scatter_keys(const void* send, void* recv, std::span<const std::size_t> counts, std::size_t total,
                           DType dtype, ReduceOp op, cudaStream_t s);
  // Issues the NCCL calls of `body` as one group.
  template <class Body>
  void grouped(CollectiveKind kind, Body&& body);
  // One NCCL call, checked, and enqueued before anything else goes on the
  // stream.
  void call(CollectiveKind kind, const char* call, ncclResult_t rc, std::string_view what = {});
  // In nonblocking mode a call returns ncclInProgress while NCCL still
  // enqueues its work (a first exchange with a peer connects first); work
  // that depends on it (the Avg division, a copy out of scratch) must not
  // reach the stream before it.
  void enqueued(CollectiveKind kind, std::string_view what = {});
  // Returns once everything enqueued on the caller's stream is done: first
  // NCCL's own enqueueing (nonblocking mode), then the stream itself.
  void wait(CollectiveKind kind, std::string_view what = {});
  [[noreturn]] void timed_out(CollectiveKind kind, std::string_view what);
  [[noreturn]] void fail(CollectiveKind kind, std::string_view call, const std::string& error);
  void abort_comm(std::string why);
  void copy_async(CollectiveKind kind, void* dst, const void* src, std::size_t bytes, cudaStream_t s);
  // 32 bytes of device memory: the outgoing and incoming message headers,
  // and the barrier's flag.
  std::byte* control();

  ncclComm_t comm_;  // nullptr once aborted
  int device_;
  int rank_ = 0;
  int size_ = 1;
  std::shared_ptr<CommStats> rank_stats_;  // kept alive here, handed on to splits
  std::chrono::milliseconds timeout_;
  cudaStream_t stream_ = nullptr;  // the caller's, taken by enter()
  std::string broken_msg_;
  std::shared_ptr<std::byte[]> ctl_;
  Header header_;                                             // the outgoing header, copied from here
  std::map<std::pair<int, int>, std::deque<Stashed>> stash_;  // (src, tag)
  std::vector<std::size_t> offsets_;
};

}  // namespace dtensor::nccl_detail
