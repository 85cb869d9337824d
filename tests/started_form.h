#pragma once
// A Communicator whose every data-moving call goes through the wrapped
// communicator's non-blocking form and waits for it at once: the collective
// suite (collective_cases.cpp) run through it checks that each start_* call
// moves, counts and refuses exactly as its blocking twin.
#include <memory>

#include "dtensor/mesh/communicator.h"

namespace comm_test {

class StartedForm final : public dtensor::Communicator {
 public:
  explicit StartedForm(dtensor::Communicator& inner) : inner_(&inner) {}
  explicit StartedForm(std::unique_ptr<dtensor::Communicator> owned) : owned_(std::move(owned)), inner_(owned_.get()) {}

  using Communicator::all_gather;
  using Communicator::start_all_gather;
  using Communicator::all_reduce;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string_view backend() const override { return inner_->backend(); }
  dtensor::Device device() const override { return inner_->device(); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  dtensor::CommStats& stats() override { return inner_->stats(); }
  const dtensor::CommStats& own_stats() const override { return inner_->own_stats(); }

  void all_reduce(const void* send, void* recv, std::size_t count, dtensor::DType dtype,
                  dtensor::ReduceOp op) override {
    inner_->start_all_reduce(send, recv, count, dtype, op).wait();
  }
  void all_gather(const void* send, void* recv, std::span<const std::size_t> recv_bytes) override {
    inner_->start_all_gather(send, recv, recv_bytes).wait();
  }
  void reduce_scatter(const void* send, void* recv, std::span<const std::size_t> counts, dtensor::DType dtype,
                      dtensor::ReduceOp op) override {
    inner_->start_reduce_scatter(send, recv, counts, dtype, op).wait();
  }
  void all_to_all(const void* send, std::span<const std::size_t> send_bytes, std::span<const std::size_t> send_offsets,
                  void* recv, std::span<const std::size_t> recv_bytes,
                  std::span<const std::size_t> recv_offsets) override {
    inner_->start_all_to_all(send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets).wait();
  }
  void broadcast(void* buf, std::size_t bytes, int root) override { inner_->start_broadcast(buf, bytes, root).wait(); }
  void scatter(const void* send, std::span<const std::size_t> bytes, void* recv, int root) override {
    inner_->start_scatter(send, bytes, recv, root).wait();
  }
  void send(const void* buf, std::size_t bytes, int dst, int tag) override {
    inner_->start_send(buf, bytes, dst, tag).wait();
  }
  void recv(void* buf, std::size_t bytes, int src, int tag) override { inner_->start_recv(buf, bytes, src, tag).wait(); }
  void barrier() override { inner_->barrier(); }
  std::unique_ptr<dtensor::Communicator> split(int color, int key) override {
    auto sub = inner_->split(color, key);
    return sub ? std::make_unique<StartedForm>(std::move(sub)) : nullptr;
  }

 private:
  std::unique_ptr<dtensor::Communicator> owned_;
  dtensor::Communicator* inner_;
};

}  // namespace comm_test
