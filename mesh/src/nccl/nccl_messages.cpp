// The NCCL backend's point-to-point messages (nccl_communicator.h). NCCL
// has no tags and no buffering, so a send is a rendezvous: it returns once
// the peer has received it (a 16-byte header with the tag and size, then the
// payload). The receiver reads the header first: a message of another tag
// is received into a device buffer of this communicator and kept for the
// recv that asks for it, so tags match as on the other backends; a message
// of the wrong size is taken off the queue all the same, and the skeleton
// (backend_communicator.cpp) throws CommError naming both sizes. Unlike the
// threads and MPI backends, two ranks that both send to each other before
// receiving wait for each other until the deadline; a send to oneself is
// buffered.
#include "nccl_communicator.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "dtensor/core/cuda.h"
#include "dtensor/core/detail/cuda_check.h"
#include "dtensor/core/error.h"

namespace dtensor::nccl_detail {

void NcclCommunicator::do_send(const void* buf, std::size_t bytes, int dst, int tag) {
  constexpr auto kind = CollectiveKind::Send;
  const cudaStream_t s = stream_;
  if (dst == rank_) {
    // No peer to meet: keep a copy for the matching recv.
    Stashed m{cuda::allocate(std::max<std::size_t>(bytes, 1)), bytes};
    copy_async(kind, m.data.get(), buf, bytes, s);
    wait(kind);
    stash_[{rank_, tag}].push_back(std::move(m));
    return;
  }
  const std::string what = fmt::format("to rank {} (tag {})", dst, tag);
  header_ = Header{tag, static_cast<std::int64_t>(bytes)};
  std::byte* hdr = control();
  DTENSOR_CUDA_CHECK(cudaMemcpyAsync(hdr, &header_, sizeof(Header), cudaMemcpyHostToDevice, s));
  call(kind, "ncclSend", ncclSend(hdr, sizeof(Header), ncclUint8, dst, comm_, s), what);
  wait(kind, what);
  if (bytes > 0) {
    call(kind, "ncclSend", ncclSend(buf, bytes, ncclUint8, dst, comm_, s), what);
    wait(kind, what);
  }
}

std::size_t NcclCommunicator::do_recv(void* buf, std::size_t bytes, int src, int tag) {
  constexpr auto kind = CollectiveKind::Recv;
  const cudaStream_t s = stream_;
  const std::string what = fmt::format("from rank {} (tag {})", src, tag);
  for (;;) {
    if (auto it = stash_.find({src, tag}); it != stash_.end()) {
      Stashed m = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) stash_.erase(it);
      if (m.bytes != bytes) return m.bytes;
      copy_async(kind, buf, m.data.get(), bytes, s);
      wait(kind, what);
      return bytes;
    }
    if (src == rank_)
      throw CommError(fmt::format("[nccl] recv on rank {} of {} from itself (tag {}): no such message was sent", rank_,
                                  size_, tag));
    std::byte* hdr = control() + sizeof(Header);
    call(kind, "ncclRecv", ncclRecv(hdr, sizeof(Header), ncclUint8, src, comm_, s), what);
    wait(kind, what);
    Header got;
    DTENSOR_CUDA_CHECK(cudaMemcpyAsync(&got, hdr, sizeof(Header), cudaMemcpyDeviceToHost, s));
    wait(kind, what);
    if (got.bytes < 0)
      fail(kind, "recv", fmt::format("corrupt message header from rank {} ({} bytes)", src, got.bytes));
    const auto size = static_cast<std::size_t>(got.bytes);
    if (got.tag == tag && size == bytes) {
      if (bytes > 0) {
        call(kind, "ncclRecv", ncclRecv(buf, bytes, ncclUint8, src, comm_, s), what);
        wait(kind, what);
      }
      return bytes;
    }
    // Another message comes first, or this one has the wrong size: take
    // it off the queue either way, so that the next recv sees the next.
    Stashed m{cuda::allocate(std::max<std::size_t>(size, 1)), size};
    if (size > 0) {
      call(kind, "ncclRecv", ncclRecv(m.data.get(), size, ncclUint8, src, comm_, s), what);
      wait(kind, what);
    }
    if (got.tag == tag) return size;
    stash_[{src, static_cast<int>(got.tag)}].push_back(std::move(m));
  }
}

std::byte* NcclCommunicator::control() {
  if (!ctl_) ctl_ = cuda::allocate(2 * sizeof(Header));
  return ctl_.get();
}

}  // namespace dtensor::nccl_detail
