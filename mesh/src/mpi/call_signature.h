#pragma once
// Internal to the MPI backend: the signature of a collective call, which
// every rank sends to every peer before the call itself (see
// mpi_communicator.cpp), and the verdict over the group's signatures. The
// verdict is a pure function of the table of signatures, which every rank of
// the group holds in full, so that either every rank proceeds or every rank
// throws the same CollectiveMismatch, as on the threads backend.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "dtensor/core/dtype.h"
#include "dtensor/core/reduce_op.h"
#include "dtensor/mesh/communicator.h"

namespace dtensor::mpi_detail {

// Words of a signature. The first kCompared must be equal on every rank; the
// all_to_all balance words must sum to zero over the group (a send of b
// bytes from p to q adds what q's expectation of b bytes from p subtracts);
// kRegular is only combined (AND), never compared.
enum SignatureWord : std::size_t {
  kKind,
  kDType,
  kOp,
  kRoot,
  kCount,  // all_reduce elements, broadcast bytes, the total of the others
  kSizes,  // a hash of the per-rank sizes the group must agree on
  kSeq,    // calls this rank made on the communicator before this one
  kCompared,
  kBalance = kCompared,
  kRegular,
  kSignatureWords,
};
using Signature = std::array<std::uint64_t, kSignatureWords>;

inline constexpr std::uint64_t kNone = ~std::uint64_t{0};

Signature make_signature(CollectiveKind kind);
Signature make_signature(CollectiveKind kind, DType dtype, ReduceOp op);
std::uint64_t sizes_hash(std::span<const std::size_t> sizes);
/// This rank's share of the all_to_all balance.
std::uint64_t all_to_all_balance(int rank, std::span<const std::size_t> send_bytes,
                                 std::span<const std::size_t> recv_bytes);

/// Whether the n signatures (back to back) describe one call.
bool signatures_agree(std::span<const std::uint64_t> signatures, int n);

/// The message of a mismatch: the first pair of ranks whose calls differ,
/// described as the threads backend describes them. `sizes` holds 2n words
/// per rank: the per-rank list its call passed (all_gather's recv_bytes,
/// reduce_scatter's counts, scatter's bytes, all_to_all's send_bytes), then
/// all_to_all's recv_bytes; zeros where the call has none.
std::string mismatch_message(std::span<const std::uint64_t> signatures, std::span<const std::size_t> sizes, int n,
                             int seen_on);

}  // namespace dtensor::mpi_detail
