#pragma once
// Distributed checkpoints: save DTensors on one mesh and layout, load them
// on any other (N ranks -> M ranks, uneven and empty shards, nested shard
// orders), in files the ecosystem reads.
//
//   dcp::save("ckpt", {{"w", w}, {"b", b}});              // every rank
//   auto got = dcp::load("ckpt", {{"w", {mesh, Layout::parse("S(1)")}}});
//
// On disk (readable without dtensor; README "Checkpoints"):
//   ckpt/manifest.json          per tensor: global shape, dtype, the source
//                               mesh and layout, and its saved boxes: file,
//                               byte range, offset and size in the global
//                               tensor, xxHash64 per chunk of the range
//   ckpt/rank-00003.safetensors the boxes rank 3 wrote, as safetensors
//                               tensors named "<name>@<offset,...>"
// Only one rank of each replicated group writes a box (the one at coordinate
// 0 on every Replicate mesh dim); Partial tensors are reduced first. A save
// writes into a temporary directory beside `dir`, fsyncs, writes the
// manifest last and renames (exchanging with an older checkpoint
// atomically), so a save cut short leaves the previous checkpoint loadable.
#include <cstdint>
#include <functional>
#include <optional>
#include <map>
#include <string>

#include "dtensor/api/dtensor_tensor.h"

namespace dtensor::dcp {

struct SaveOptions {
  /// Partial tensors are reduced before they are written (one collective
  /// each); false refuses them with a LayoutError instead.
  bool allow_communication = true;
  /// Bytes per checksummed chunk of a saved box: a reader reads whole chunks
  /// of what it needs and verifies each.
  std::size_t chunk_bytes = std::size_t{1} << 20;
  /// Called on every rank just before it writes its file, with its rank: a
  /// test injects a failure there (a save that throws on one rank leaves the
  /// older checkpoint at `dir` loadable).
  std::function<void(int rank)> before_writing = {};
};

/// Collective over the tensors' mesh (every rank passes the same names; all
/// tensors on one mesh, else ValueError). Replaces `dir` if it exists.
/// Partial tensors are reduced (SaveOptions). Errors: ValueError for bad
/// arguments; CheckpointError when a file cannot be written (on every rank,
/// naming the rank and file), leaving any older checkpoint at `dir` as it was.
void save(const std::string& dir, const std::map<std::string, DTensor>& tensors, const SaveOptions& options = {});

/// Where a loaded tensor goes.
struct Target {
  DeviceMesh mesh;
  Layout layout;
  /// When given, the saved tensor must have this shape / dtype (ShapeError /
  /// DTypeError naming both otherwise), e.g. the parameter it will replace.
  std::optional<Shape> shape = std::nullopt;
  std::optional<DType> dtype = std::nullopt;
};

/// What a load read on this rank.
struct LoadStats {
  std::uint64_t bytes_read = 0;    // file bytes read (whole chunks)
  std::uint64_t bytes_needed = 0;  // bytes of this rank's target boxes
  std::uint64_t chunks_verified = 0;
};

/// Collective over the targets' mesh (every rank the same names). Each rank
/// reads only the chunks of the saved boxes that meet its target boxes and
/// verifies their checksums. Errors, on every rank, with nothing returned:
/// ShapeError / DTypeError where the saved tensor is not the Target's;
/// CheckpointError (no manifest, a missing or truncated file, a checksum
/// mismatch naming the tensor, box and file), ValueError for a name not in
/// the checkpoint, LayoutError for a target layout invalid for the shape.
std::map<std::string, DTensor> load(const std::string& dir, const std::map<std::string, Target>& targets,
                                    LoadStats* stats = nullptr);

/// A model's named_parameters() (nn::NamedParameters<DTensor>, pairs of
/// name and pointer): saved as the map above.
void save(const std::string& dir, const std::vector<std::pair<std::string, DTensor*>>& named,
          const SaveOptions& options = {});
/// Loads each named tensor into its own mesh and layout, checked against its
/// shape and dtype, and replaces it in place (keeping requires_grad): a
/// model's parameters resumed from a checkpoint saved on any mesh. Nothing
/// is replaced when anything fails.
void load_into(const std::string& dir, const std::vector<std::pair<std::string, DTensor*>>& named,
               LoadStats* stats = nullptr);

/// A model split over groups of ranks (a pipeline's stages): collective over
/// `world`, where each rank passes the tensors its group holds (DTensors on
/// its group's mesh, a submesh of world's ranks; or plain tensors, one rank
/// a group), and the groups hold different names. One checkpoint results,
/// as save() would write it of the whole model: loadable on any mesh. A
/// name passed by two groups with different shapes or dtypes is a
/// ValueError (on every rank); each name must be held by one group only.
void save_parts(const std::string& dir, const std::map<std::string, DTensor>& mine, Communicator& world,
                const SaveOptions& options = {});
void save_parts(const std::string& dir, const std::map<std::string, Tensor>& mine, Communicator& world,
                const SaveOptions& options = {});

/// One process, plain tensors: saves as a 1-rank checkpoint.
void save(const std::string& dir, const std::map<std::string, Tensor>& tensors, const SaveOptions& options = {});
/// One process: the named tensors whole (all of the checkpoint's when
/// `names` is empty).
std::map<std::string, Tensor> load_full(const std::string& dir, const std::vector<std::string>& names = {});

/// What verify() checked.
struct VerifyReport {
  std::uint64_t tensors = 0, boxes = 0, bytes = 0, chunks = 0;
};
/// Reads every saved box whole and checks every chunk's checksum, and that
/// each tensor's boxes are disjoint and cover it. CheckpointError naming the
/// file, tensor and box of the first problem.
VerifyReport verify(const std::string& dir);

/// A safetensors file as plain tensors (F32, F64, I64, BF16, F16), e.g. one
/// written by Python; CheckpointError naming the file when it is not one.
std::map<std::string, Tensor> read_safetensors(const std::string& path);
/// Writes plain tensors as one safetensors file (fsynced).
void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors);

}  // namespace dtensor::dcp
