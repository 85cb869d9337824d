#pragma once
// One exception hierarchy for the whole library. Every message starts with
// where it comes from in brackets and names the bad value and what was
// expected, e.g. "[layout] Shard(2) on mesh dim 1: the tensor has 2 dims".
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dtensor {

/// Base of every exception dtensor throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A caller passed a value the library cannot accept.
class ValueError : public Error {
 public:
  using Error::Error;
};

/// Text that does not parse (placements, dtypes, shapes, meshes).
class ParseError : public ValueError {
 public:
  using ValueError::ValueError;
};

/// Shapes that do not fit together (wrong rank, negative size, mismatch).
class ShapeError : public ValueError {
 public:
  using ValueError::ValueError;
};

/// A dtype that is not the one an operation needs.
class DTypeError : public ValueError {
 public:
  using ValueError::ValueError;
};

/// Placements that do not fit the tensor or mesh (shard dim out of range,
/// wrong number of placements, a transition no plan can make).
class LayoutError : public ValueError {
 public:
  using ValueError::ValueError;
};

/// A mesh that does not multiply out to the world, an unknown dim name.
class MeshError : public ValueError {
 public:
  using ValueError::ValueError;
};

/// A checkpoint that cannot be read as it is: a missing manifest or file, a
/// truncated file, a checksum that does not match (the message names the
/// file, tensor and box), or a save that could not finish.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

/// A feature that this build does not have (MPI, CUDA, NCCL).
class UnsupportedError : public Error {
 public:
  using Error::Error;
};

/// Autograd cannot do what was asked: a backward through a graph an earlier
/// backward freed, through an op without a backward rule, or from a tensor
/// that does not require a gradient. Names the op or tensor.
class AutogradError : public Error {
 public:
  using Error::Error;
};

/// An allocation that would take a memory account past its budget
/// (MemoryAccount::set_budget, DTENSOR_MEMORY_BUDGET): names the account's
/// owner (a rank), the bytes asked for, the bytes then in use, the budget
/// and the peak so far. "This plan does not fit" as a deterministic
/// outcome on a machine with plenty of memory.
class OutOfBudget : public Error {
 public:
  using Error::Error;
};

/// A device runtime call failed (CUDA, cuBLAS): names the call and the
/// runtime's own message, e.g. "[cuda] cudaMalloc of 8 GiB: out of memory".
class DeviceError : public Error {
 public:
  using Error::Error;
};

/// Any failure inside a communicator.
class CommError : public Error {
 public:
  using Error::Error;
};

/// A collective did not complete before the communicator's deadline.
class CommTimeout : public CommError {
 public:
  using CommError::CommError;
};

/// Ranks of one group called different collectives (or the same one with
/// different roots, dtypes or sizes).
class CollectiveMismatch : public CommError {
 public:
  using CommError::CommError;
};

/// Another rank of the group failed; this rank gives up instead of waiting.
class PeerFailed : public CommError {
 public:
  using CommError::CommError;
};

/// Raised by run_threads on the calling thread when a rank threw: names the
/// rank and carries the original message.
class RankFailed : public Error {
 public:
  RankFailed(int rank, const std::string& what) : Error(what), rank_(rank) {}
  int rank() const noexcept { return rank_; }

 private:
  int rank_;
};

/// Raised by run_threads when, after a rank failed, other ranks were still
/// running one deadline later (stalled in user code: sleeping, looping):
/// rank() is the first of them, stalled() all of them, and the message says
/// what each was last doing. Their threads are detached and may still be
/// running the caller's function, so the caller must end the process without
/// returning into the state that function refers to (launch() flushes the
/// output and calls _Exit).
class RankStalled : public RankFailed {
 public:
  RankStalled(std::vector<int> stalled, const std::string& what)
      : RankFailed(stalled.at(0), what), stalled_(std::move(stalled)) {}
  const std::vector<int>& stalled() const noexcept { return stalled_; }

 private:
  std::vector<int> stalled_;
};

}  // namespace dtensor
