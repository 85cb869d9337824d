#pragma once
// Internal: the checkpoint's on-disk form. A manifest (JSON) lists every
// tensor and its saved boxes; each box is a byte range of one rank's
// safetensors file, checksummed per chunk with xxHash64.
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "dtensor/core/dtype.h"
#include "dtensor/core/shape.h"

namespace dtensor::dcp::format {

inline constexpr int kVersion = 1;
inline constexpr const char* kManifestName = "manifest.json";

struct SavedBox {
  std::string file;            // relative to the checkpoint directory
  std::uint64_t begin = 0;     // byte range in the file (header included)
  std::uint64_t end = 0;
  Box box;                     // where it sits in the global tensor
  std::uint64_t chunk_bytes = 0;
  std::vector<std::uint64_t> checksums;  // xxHash64 of each chunk of [begin, end)
};

struct TensorEntry {
  std::string name;
  DType dtype = DType::Float32;
  Shape shape;
  Shape mesh_shape;                  // the mesh it was saved from
  std::vector<std::string> mesh_dims;
  std::string layout;                // Layout's text, nesting order included
  std::vector<SavedBox> boxes;       // disjoint, covering the tensor
};

struct Manifest {
  std::map<std::string, TensorEntry> tensors;
};

/// safetensors' dtype names ("F32", "BF16", ...).
std::string_view safetensors_dtype(DType dtype);
DType parse_safetensors_dtype(std::string_view name);  // ParseError naming it

/// The box's name inside its safetensors file: "<tensor>@<offset,...>".
std::string box_key(const std::string& tensor, const Box& box);

std::string manifest_text(const Manifest& m);
/// Parses a manifest; CheckpointError naming `where` when it is not one.
Manifest parse_manifest(std::string_view text, const std::string& where);
/// One rank's saved boxes (tensor name, box) as text, in the manifest's box
/// form, for rank 0 to gather; add_saved_boxes files them under their
/// tensors in `m`, checked as the manifest's are.
std::string saved_boxes_text(const std::vector<std::pair<std::string, SavedBox>>& boxes);
void add_saved_boxes(Manifest& m, std::string_view text, const std::string& where);

/// Reads dir/manifest.json; CheckpointError when it is missing or bad.
Manifest read_manifest(const std::filesystem::path& dir);

/// xxHash64 of each chunk of `bytes` (the last chunk may be short).
std::vector<std::uint64_t> chunk_checksums(std::span<const std::byte> bytes, std::uint64_t chunk_bytes);
std::uint64_t checksum(std::span<const std::byte> bytes);

/// One tensor of a safetensors file to write.
struct FileTensor {
  std::string key;
  DType dtype;
  Shape shape;
  std::span<const std::byte> bytes;
};
/// Writes a safetensors file (8-byte little-endian header length, JSON
/// header padded with spaces to 8 bytes, the data) and fsyncs it. Returns
/// each tensor's byte range in the file. CheckpointError naming the file
/// on any failure.
std::vector<std::pair<std::uint64_t, std::uint64_t>> write_safetensors(const std::filesystem::path& path,
                                                                       std::span<const FileTensor> tensors);

/// A safetensors file's header: key -> (dtype, shape, absolute byte range).
struct FileEntry {
  DType dtype;
  Shape shape;
  std::uint64_t begin, end;
};
std::map<std::string, FileEntry> read_safetensors_header(const std::filesystem::path& path);

/// pread of exactly `bytes` at `offset` of `fd` into `dest`; a CheckpointError
/// "<what>: the file ends before byte N" when it cannot.
void read_at(int fd, std::byte* dest, std::uint64_t bytes, std::uint64_t offset, const std::string& what);

/// fsync of a file or directory; CheckpointError naming it on failure.
void sync_path(const std::filesystem::path& path, bool directory);

}  // namespace dtensor::dcp::format
