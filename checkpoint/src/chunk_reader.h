#pragma once
// Internal: reads whole checksummed chunks of saved boxes, each file opened
// once, and verifies each chunk where it lands (load and verify both read
// through it).
#include <filesystem>
#include <map>
#include <string>

#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/checkpoint/detail/format.h"

namespace dtensor::dcp {

class ChunkReader {
 public:
  explicit ChunkReader(std::filesystem::path dir) : dir_(std::move(dir)) {}
  ~ChunkReader();
  ChunkReader(const ChunkReader&) = delete;
  ChunkReader& operator=(const ChunkReader&) = delete;

  /// Bytes [begin, end) of the box's range (whole chunks: begin on a chunk
  /// boundary, end on one or at the box's end) into `dest`, each chunk
  /// verified there; CheckpointError naming the file, tensor, box and chunk.
  void read(const format::TensorEntry& t, const format::SavedBox& b, std::uint64_t begin, std::uint64_t end,
            std::byte* dest);

  LoadStats stats;  // bytes read and chunks verified (bytes_needed: the caller's)

 private:
  int open(const std::string& file);

  std::filesystem::path dir_;
  std::map<std::string, int> open_;
};

}  // namespace dtensor::dcp
