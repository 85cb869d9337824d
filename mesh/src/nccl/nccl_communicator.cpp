// The NCCL backend: one rank per GPU, buffers in device memory on the
// communicator's device, every call enqueued on the calling thread's stream
// (dtensor::cuda::current_stream()) and returning once its result is ready.
//
// Every wait has a deadline. The communicator runs in NCCL's nonblocking
// mode, so no NCCL call blocks the host: a call may return ncclInProgress
// while NCCL still enqueues it, and a wait polls ncclCommGetAsyncError until
// the work is enqueued, then cudaStreamQuery until it is done, checking the
// deadline and NCCL's asynchronous error as it goes. A call that times out
// aborts the NCCL communicator (ncclCommAbort, which also ends its kernels
// still waiting for peers), marks it broken so that every later call throws
// CommError at once, and throws CommTimeout naming the call.
//
// Mapping onto NCCL:
//  - Avg is a Sum followed by a division on the device for every floating
//    dtype (i64: the exact average of exact_average.h): ncclAvg pre-multiplies each rank's addend by 1/n
//    in floating types, which rounds differently from the sum / n of the
//    threads and MPI backends; with the division the backends agree bitwise
//    wherever the sum is exact.
//  - all_gather of equal blocks is ncclAllGather; uneven blocks are grouped
//    ncclSend/ncclRecv at the prefix offsets.
//  - reduce_scatter of equal blocks is ncclReduceScatter; uneven blocks are
//    one ncclReduce per non-empty block (root: the block's owner) in one
//    group. Each rank then sends and receives about what a ring
//    reduce-scatter moves, without padding every block to the largest (the
//    alternative, which moves n * max elements and costs two extra copies).
//  - all_to_all and scatter are grouped ncclSend/ncclRecv over the peers
//    with bytes to move; the self block is a device-to-device copy.
//  - barrier is an all-reduce of one int on a small device buffer.
//  - send/recv: a rendezvous through a header, see nccl_messages.cpp.
//
// Byte accounting follows communicator.h exactly, from the sizes, by the
// same formulas as the threads and MPI backends.
#include "nccl_communicator.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtensor/core/cuda.h"
#include "dtensor/core/detail/cuda_check.h"
#include "dtensor/core/error.h"
#include "dtensor/core/shape.h"
#include "dtensor/mesh/backends.h"

namespace dtensor::nccl_detail {
namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
    case DType::Int64: return ncclInt64;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Float16: return ncclFloat16;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) { return backend_detail::native_op(op, ncclSum, ncclMax, ncclMin); }

// Floating max/min: ncclMax and ncclMin are fmaxf and fminf (or __hmax),
// which drop NaN. The ranks reduce combine.h's order keys as integers
// instead, which order NaN as combine::max_nan does, and turn the result
// back. f32 and f64 keys move the bytes the values would; bf16 and f16
// keys are int32, twice theirs.
bool by_order_keys(DType dtype, ReduceOp op) {
  return (op == ReduceOp::Max || op == ReduceOp::Min) && is_floating(dtype);
}
std::size_t key_size(DType dtype) { return dtype == DType::Float64 ? 8 : 4; }
ncclDataType_t key_type(DType dtype) { return dtype == DType::Float64 ? ncclInt64 : ncclInt32; }

std::size_t prefix_sums(std::span<const std::size_t> sizes, std::vector<std::size_t>& offsets) {
  offsets.resize(sizes.size());
  std::size_t total = 0;
  for (std::size_t p = 0; p < sizes.size(); ++p) {
    offsets[p] = total;
    total += sizes[p];
  }
  return total;
}

}  // namespace

NcclCommunicator::NcclCommunicator(ncclComm_t comm, int device, std::shared_ptr<CommStats> stats,
                                   std::chrono::milliseconds timeout)
    : BackendCommunicator(*stats), comm_(comm), device_(device), rank_stats_(std::move(stats)), timeout_(timeout) {
  ncclCommUserRank(comm_, &rank_);
  ncclCommCount(comm_, &size_);
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ == nullptr) return;  // aborted after a failure
  const ncclComm_t comm = std::exchange(comm_, nullptr);
  int previous = -1;
  try {
    previous = cuda::current_device();
    if (previous != device_) cuda::set_device(device_);
  } catch (...) {
  }
  stash_.clear();
  ctl_.reset();
  // Every call completed before returning, so finalizing only releases
  // resources; it still gets the deadline, and an abort otherwise.
  const ncclResult_t rc = ncclCommFinalize(comm);
  const ncclResult_t state = rc == ncclSuccess || rc == ncclInProgress ? wait_ready(comm, Clock::now() + timeout_) : rc;
  if (state == ncclSuccess)
    ncclCommDestroy(comm);
  else
    ncclCommAbort(comm);
  try {
    if (previous >= 0 && previous != device_) cuda::set_device(previous);
  } catch (...) {
  }
}

void NcclCommunicator::enter(CollectiveKind kind) {
  if (comm_ == nullptr)
    throw CommError(fmt::format("[nccl] {} on rank {} of {}: the communicator is unusable: {}", collective_name(kind),
                                rank_, size_, broken_msg_));
  if (cuda::current_device() != device_) cuda::set_device(device_);
  stream_ = cuda::stream();
}

void NcclCommunicator::do_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) {
  constexpr auto kind = CollectiveKind::AllReduce;
  const cudaStream_t s = stream_;
  if (size_ > 1 && count > 0 && by_order_keys(dtype, op)) {
    const std::size_t ksz = key_size(dtype);
    auto keys = cuda::allocate(count * ksz);
    cuda::order_keys(send, keys.get(), count, dtype, op);
    call(kind, "ncclAllReduce", ncclAllReduce(keys.get(), keys.get(), count, key_type(dtype), nccl_op(op), comm_, s));
    cuda::from_order_keys(keys.get(), recv, count, dtype);
    wait(kind);  // keys go back to the stream's pool after the wait
  } else if (size_ > 1 && count > 0) {
    call(kind, "ncclAllReduce", ncclAllReduce(send, recv, count, nccl_type(dtype), nccl_op(op), comm_, s));
    divide_average(recv, count, dtype, op);
  } else {
    copy_async(kind, recv, send, count * itemsize(dtype), s);
  }
  wait(kind);
}

void NcclCommunicator::do_all_gather(const void* send, void* recv, std::span<const std::size_t> recv_bytes) {
  constexpr auto kind = CollectiveKind::AllGather;
  const cudaStream_t s = stream_;
  const auto r = static_cast<std::size_t>(rank_);
  auto* out = static_cast<std::byte*>(recv);
  const std::size_t total = prefix_sums(recv_bytes, offsets_);
  if (size_ > 1 && total > 0) {
    const bool equal =
        std::all_of(recv_bytes.begin(), recv_bytes.end(), [&](std::size_t b) { return b == recv_bytes[0]; });
    if (equal) {
      // In place when send already is this rank's block of recv.
      call(kind, "ncclAllGather", ncclAllGather(send, recv, recv_bytes[0], ncclUint8, comm_, s));
    } else {
      copy_async(kind, out + offsets_[r], send, recv_bytes[r], s);
      grouped(kind, [&](Issue& issue) {
        for (int p = 0; p < size_; ++p) {
          const auto pp = static_cast<std::size_t>(p);
          if (p == rank_) continue;
          if (recv_bytes[r] > 0) issue(ncclSend(send, recv_bytes[r], ncclUint8, p, comm_, s), "ncclSend");
          if (recv_bytes[pp] > 0)
            issue(ncclRecv(out + offsets_[pp], recv_bytes[pp], ncclUint8, p, comm_, s), "ncclRecv");
        }
      });
    }
  } else {
    copy_async(kind, out + offsets_[r], send, recv_bytes[r], s);
  }
  wait(kind);
}

void NcclCommunicator::do_reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts, DType dtype,
                                         ReduceOp op) {
  constexpr auto kind = CollectiveKind::ReduceScatter;
  const std::size_t isz = itemsize(dtype);
  const cudaStream_t s = stream_;
  const auto r = static_cast<std::size_t>(rank_);
  const std::size_t total = prefix_sums(counts, offsets_);
  const std::size_t mine = counts[r];
  const auto* in = static_cast<const std::byte*>(send);
  const auto* own = in + offsets_[r] * isz;
  auto* out = static_cast<std::byte*>(recv);
  if (size_ == 1 || total == 0) {
    copy_async(kind, out, own, mine * isz, s);
    return wait(kind);
  }
  if (by_order_keys(dtype, op)) return reduce_scatter_keys(send, recv, counts, total, dtype, op, s);
  // recv may be this rank's own block of send (NCCL's in-place form);
  // any other overlap with send would be read by the peers' reductions
  // while written: reduce into scratch then.
  const bool overlaps = mine != 0 && out < in + total * isz && out + mine * isz > in && out != own;
  std::shared_ptr<std::byte[]> scratch;
  std::byte* target = out;
  if (overlaps) {
    scratch = cuda::allocate(mine * isz);
    target = scratch.get();
  }
  const ncclDataType_t type = nccl_type(dtype);
  const bool equal = std::all_of(counts.begin(), counts.end(), [&](std::size_t c) { return c == counts[0]; });
  if (equal) {
    call(kind, "ncclReduceScatter", ncclReduceScatter(send, target, mine, type, nccl_op(op), comm_, s));
  } else {
    grouped(kind, [&](Issue& issue) {
      for (int p = 0; p < size_; ++p) {
        const auto pp = static_cast<std::size_t>(p);
        if (counts[pp] == 0) continue;
        const auto* block = in + offsets_[pp] * isz;
        // recvbuff is read by NCCL on the root only.
        void* dst = p == rank_ ? static_cast<void*>(target) : const_cast<std::byte*>(block);
        issue(ncclReduce(block, dst, counts[pp], type, nccl_op(op), p, comm_, s), "ncclReduce");
      }
    });
  }
  divide_average(target, mine, dtype, op);
  if (overlaps) copy_async(kind, out, target, mine * isz, s);
  wait(kind);  // scratch goes back to the stream's pool after the wait
}

void NcclCommunicator::do_all_to_all(const void* send, std::span<const std::size_t> send_bytes,
                                     std::span<const std::size_t> send_offsets, void* recv,
                                     std::span<const std::size_t> recv_bytes,
                                     std::span<const std::size_t> recv_offsets) {
  constexpr auto kind = CollectiveKind::AllToAll;
  const cudaStream_t s = stream_;
  const auto r = static_cast<std::size_t>(rank_);
  const auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  copy_async(kind, out + recv_offsets[r], in + send_offsets[r], recv_bytes[r], s);
  bool any = false;
  for (int p = 0; p < size_; ++p) {
    const auto pp = static_cast<std::size_t>(p);
    any = any || send_bytes[pp] > 0 || (p != rank_ && recv_bytes[pp] > 0);
  }
  if (size_ > 1 && any) {
    grouped(kind, [&](Issue& issue) {
      for (int k = 1; k < size_; ++k) {
        const int p = (rank_ + k) % size_;
        const auto pp = static_cast<std::size_t>(p);
        if (send_bytes[pp] > 0)
          issue(ncclSend(in + send_offsets[pp], send_bytes[pp], ncclUint8, p, comm_, s), "ncclSend");
        if (recv_bytes[pp] > 0)
          issue(ncclRecv(out + recv_offsets[pp], recv_bytes[pp], ncclUint8, p, comm_, s), "ncclRecv");
      }
    });
  }
  wait(kind);
}

void NcclCommunicator::do_broadcast(void* buf, std::size_t bytes, int root) {
  constexpr auto kind = CollectiveKind::Broadcast;
  if (size_ > 1 && bytes > 0) {
    call(kind, "ncclBroadcast", ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm_, stream_));
    wait(kind);
  }
}

void NcclCommunicator::do_scatter(const void* send, std::span<const std::size_t> bytes, void* recv, int root) {
  constexpr auto kind = CollectiveKind::Scatter;
  const cudaStream_t s = stream_;
  const std::size_t total = prefix_sums(bytes, offsets_);
  const auto r = static_cast<std::size_t>(rank_);
  const std::size_t mine = bytes[r];
  const auto* in = static_cast<const std::byte*>(send);
  if (rank_ == root) copy_async(kind, recv, in + offsets_[r], mine, s);
  if (size_ > 1 && total > 0) {
    grouped(kind, [&](Issue& issue) {
      if (rank_ == root) {
        for (int p = 0; p < size_; ++p) {
          const auto pp = static_cast<std::size_t>(p);
          if (p != root && bytes[pp] > 0)
            issue(ncclSend(in + offsets_[pp], bytes[pp], ncclUint8, p, comm_, s), "ncclSend");
        }
      } else if (mine > 0) {
        issue(ncclRecv(recv, mine, ncclUint8, root, comm_, s), "ncclRecv");
      }
    });
  }
  wait(kind);
}

void NcclCommunicator::do_barrier() {
  constexpr auto kind = CollectiveKind::Barrier;
  if (size_ > 1) {
    std::byte* flag = control();
    DTENSOR_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), stream_));
    call(kind, "ncclAllReduce", ncclAllReduce(flag, flag, 1, ncclInt32, ncclSum, comm_, stream_));
    wait(kind);
  }
}

std::unique_ptr<Communicator> NcclCommunicator::do_split(int color, int key) {
  constexpr auto kind = CollectiveKind::Split;
  ncclConfig_t config = nonblocking_config();
  ncclComm_t out = nullptr;
  const ncclResult_t rc = ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &out, &config);
  // Nonblocking: the new communicator (and the parent, which every rank
  // passes through, NOCOLOR ones included) leaves ncclInProgress when
  // the split is done.
  const auto deadline = Clock::now() + timeout_;
  ncclResult_t state = rc == ncclInProgress ? ncclSuccess : rc;
  if (state == ncclSuccess && out != nullptr) state = wait_ready(out, deadline);
  if (state == ncclSuccess) state = wait_ready(comm_, deadline);
  if (state != ncclSuccess) {
    if (out != nullptr) ncclCommAbort(out);
    if (state == ncclInProgress) timed_out(kind, "");
    fail(kind, "ncclCommSplit", error_text(state, comm_));
  }
  if (out == nullptr) return nullptr;
  return std::make_unique<NcclCommunicator>(out, device_, rank_stats_, timeout_);
}

void NcclCommunicator::reduce_scatter_keys(const void* send, void* recv, std::span<const std::size_t> counts,
                                           std::size_t total, DType dtype, ReduceOp op, cudaStream_t s) {
  constexpr auto kind = CollectiveKind::ReduceScatter;
  const std::size_t ksz = key_size(dtype);
  const ncclDataType_t type = key_type(dtype);
  const std::size_t mine = counts[static_cast<std::size_t>(rank_)];
  auto keys = cuda::allocate(total * ksz);
  auto reduced = cuda::allocate(std::max<std::size_t>(mine, 1) * ksz);
  cuda::order_keys(send, keys.get(), total, dtype, op);
  const bool equal = std::all_of(counts.begin(), counts.end(), [&](std::size_t c) { return c == counts[0]; });
  if (equal) {
    call(kind, "ncclReduceScatter", ncclReduceScatter(keys.get(), reduced.get(), mine, type, nccl_op(op), comm_, s));
  } else {
    grouped(kind, [&](Issue& issue) {
      for (int p = 0; p < size_; ++p) {
        const auto pp = static_cast<std::size_t>(p);
        if (counts[pp] == 0) continue;
        std::byte* block = keys.get() + offsets_[pp] * ksz;
        void* dst = p == rank_ ? static_cast<void*>(reduced.get()) : static_cast<void*>(block);
        issue(ncclReduce(block, dst, counts[pp], type, nccl_op(op), p, comm_, s), "ncclReduce");
      }
    });
  }
  cuda::from_order_keys(reduced.get(), recv, mine, dtype);
  wait(kind);  // the keys go back to the stream's pool after the wait
}

template <class Body>
void NcclCommunicator::grouped(CollectiveKind kind, Body&& body) {
  Issue issue;
  issue(ncclGroupStart(), "ncclGroupStart");
  if (issue.rc_ == ncclSuccess) {
    try {
      body(issue);
    } catch (...) {
      ncclGroupEnd();
      throw;
    }
    issue(ncclGroupEnd(), "ncclGroupEnd");
  }
  if (issue.rc_ != ncclSuccess) fail(kind, issue.call_, error_text(issue.rc_, comm_));
  enqueued(kind);
}

void NcclCommunicator::call(CollectiveKind kind, const char* call, ncclResult_t rc, std::string_view what) {
  if (rc != ncclSuccess && rc != ncclInProgress) fail(kind, call, error_text(rc, comm_));
  enqueued(kind, what);
}

void NcclCommunicator::enqueued(CollectiveKind kind, std::string_view what) {
  const ncclResult_t state = wait_ready(comm_, Clock::now() + timeout_);
  if (state == ncclInProgress) timed_out(kind, what);
  if (state != ncclSuccess) fail(kind, "asynchronous error", error_text(state, comm_));
}

void NcclCommunicator::wait(CollectiveKind kind, std::string_view what) {
  const auto deadline = Clock::now() + timeout_;
  const cudaStream_t s = cuda::stream();
  for (int spins = 0;; ++spins) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
    if (rc != ncclSuccess) fail(kind, "ncclCommGetAsyncError", error_text(rc, comm_));
    if (state == ncclSuccess) {
      const cudaError_t q = cudaStreamQuery(s);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) {
        (void)cudaGetLastError();
        fail(kind, "cudaStreamQuery", cudaGetErrorString(q));
      }
    } else if (state != ncclInProgress) {
      fail(kind, "asynchronous error", error_text(state, comm_));
    }
    // Spin first (a small collective is done in microseconds), then give
    // the core away between polls.
    if (spins >= 1024) std::this_thread::yield();
    if ((spins & 63) == 0 && Clock::now() >= deadline) timed_out(kind, what);
  }
}

[[noreturn]] void NcclCommunicator::timed_out(CollectiveKind kind, std::string_view what) {
  abort_comm(fmt::format("{} timed out after {} ms", collective_name(kind), timeout_.count()));
  throw CommTimeout(fmt::format("[nccl] {}{}{} on rank {} of {} timed out after {} ms: a peer did not join",
                                collective_name(kind), what.empty() ? "" : " ", what, rank_, size_, timeout_.count()));
}

[[noreturn]] void NcclCommunicator::fail(CollectiveKind kind, std::string_view call, const std::string& error) {
  abort_comm(fmt::format("{} failed: {}", collective_name(kind), error));
  throw CommError(fmt::format("[nccl] {} on rank {} of {}: {}: {}", collective_name(kind), rank_, size_, call, error));
}

void NcclCommunicator::abort_comm(std::string why) {
  broken_msg_ = std::move(why);
  if (comm_ != nullptr) ncclCommAbort(comm_);
  comm_ = nullptr;
  stash_.clear();
  ctl_.reset();
}

void NcclCommunicator::copy_async(CollectiveKind kind, void* dst, const void* src, std::size_t bytes, cudaStream_t s) {
  if (bytes == 0 || dst == src) return;
  const cudaError_t rc = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    throw DeviceError(fmt::format("[nccl] {} on rank {}: cudaMemcpyAsync of {} bytes: {}", collective_name(kind), rank_,
                                  bytes, cudaGetErrorString(rc)));
  }
}

std::unique_ptr<Communicator> make_communicator(ncclComm_t comm, int device, std::shared_ptr<CommStats> stats,
                                                std::chrono::milliseconds timeout) {
  return std::make_unique<NcclCommunicator>(comm, device, std::move(stats), timeout);
}

}  // namespace dtensor::nccl_detail
