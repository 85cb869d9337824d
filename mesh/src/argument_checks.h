#pragma once
// Internal to the backends: the argument checks the skeleton of every
// collective makes (backend_communicator.cpp), with one wording for all
// backends ("[mpi] all_gather on rank 2: recv_bytes has 3 entries; expected
// one per rank (4)"). They check only what this rank passed; whether the
// ranks agree is each backend's own business.
#include <cstddef>
#include <span>
#include <string_view>

#include <fmt/format.h>

#include "dtensor/core/dtype.h"
#include "dtensor/core/error.h"
#include "dtensor/mesh/communicator.h"

namespace dtensor::backend_detail {

struct ArgumentChecks {
  std::string_view backend;  // "threads", "mpi", "nccl"
  int rank;
  int size;

  /// A dtype the library knows (another code can only come from a cast).
  void dtype(CollectiveKind kind, DType d) const {
    switch (d) {
      case DType::Float32:
      case DType::Float64:
      case DType::Int64:
      case DType::BFloat16:
      case DType::Float16: return;
    }
    throw DTypeError(fmt::format("[{}] {} on rank {}: unknown dtype code {}", backend, collective_name(kind), rank,
                                 static_cast<int>(d)));
  }
  /// A per-rank list must have one entry per rank.
  void entries(CollectiveKind kind, std::string_view what, std::size_t n) const {
    if (n != static_cast<std::size_t>(size))
      throw ValueError(fmt::format("[{}] {} on rank {}: {} has {} entries; expected one per rank ({})", backend,
                                   collective_name(kind), rank, what, n, size));
  }
  void root(CollectiveKind kind, int root_rank) const {
    if (root_rank < 0 || root_rank >= size)
      throw ValueError(fmt::format("[{}] {} on rank {}: root {} is not a rank of a group of {}", backend,
                                   collective_name(kind), rank, root_rank, size));
  }
  /// `what` is "send to" or "recv from".
  void peer(std::string_view what, int peer_rank) const {
    if (peer_rank < 0 || peer_rank >= size)
      throw ValueError(
          fmt::format("[{}] {} rank {} on rank {}: expected a rank in [0, {})", backend, what, peer_rank, rank, size));
  }
  /// all_to_all: four lists of one entry per rank, and this rank sends
  /// itself exactly what it expects from itself.
  void all_to_all(std::span<const std::size_t> send_bytes, std::span<const std::size_t> send_offsets,
                  std::span<const std::size_t> recv_bytes, std::span<const std::size_t> recv_offsets) const {
    constexpr auto kind = CollectiveKind::AllToAll;
    entries(kind, "send_bytes", send_bytes.size());
    entries(kind, "send_offsets", send_offsets.size());
    entries(kind, "recv_bytes", recv_bytes.size());
    entries(kind, "recv_offsets", recv_offsets.size());
    const auto r = static_cast<std::size_t>(rank);
    if (send_bytes[r] != recv_bytes[r])
      throw ValueError(fmt::format("[{}] all_to_all on rank {}: sends {} bytes to itself but expects {}", backend, rank,
                                   send_bytes[r], recv_bytes[r]));
  }
};

}  // namespace dtensor::backend_detail
