// The checkpoint as files: verify() over every box, and whole safetensors
// files read and written as plain tensors (the consolidated form).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/core/error.h"
#include "chunk_reader.h"
#include "dtensor/checkpoint/detail/format.h"

namespace dtensor::dcp {
namespace {

namespace fs = std::filesystem;

struct Fd {
  int fd;
  explicit Fd(const fs::path& path) : fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd < 0) throw CheckpointError(fmt::format("[checkpoint] {} cannot be opened: {}", path.string(), std::strerror(errno)));
  }
  ~Fd() { ::close(fd); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

// Boxes of one tensor pairwise disjoint (sorted by dim-0 start, each
// compared with those that start before it ends).
void check_disjoint(const format::TensorEntry& t, const fs::path& dir) {
  std::vector<const format::SavedBox*> boxes;
  std::int64_t covered = 0;
  for (const auto& b : t.boxes) {
    boxes.push_back(&b);
    covered += b.box.numel();
  }
  if (!t.shape.empty()) {
    std::sort(boxes.begin(), boxes.end(), [](auto* a, auto* b) { return a->box.offset[0] < b->box.offset[0]; });
    for (std::size_t i = 0; i < boxes.size(); ++i)
      for (std::size_t j = i + 1; j < boxes.size() && boxes[j]->box.offset[0] < boxes[i]->box.offset[0] + boxes[i]->box.size[0]; ++j)
        if (!intersect(boxes[i]->box, boxes[j]->box).empty())
          throw CheckpointError(fmt::format("[checkpoint] {}: tensor {}: boxes {} ({}) and {} ({}) overlap",
                                            dir.string(), t.name, boxes[i]->box, boxes[i]->file, boxes[j]->box,
                                            boxes[j]->file));
  }
  if (covered != numel(t.shape))
    throw CheckpointError(fmt::format("[checkpoint] {}: tensor {}: its boxes hold {} of its {} elements", dir.string(),
                                      t.name, covered, numel(t.shape)));
}

}  // namespace

VerifyReport verify(const std::string& dir_text) {
  const fs::path dir(dir_text);
  const format::Manifest m = format::read_manifest(dir);
  VerifyReport report;
  ChunkReader reader(dir);
  std::vector<std::byte> chunk;
  for (const auto& [name, t] : m.tensors) {
    check_disjoint(t, dir);
    ++report.tensors;
    for (const format::SavedBox& b : t.boxes) {
      for (std::uint64_t at = 0; at < b.end - b.begin; at += b.chunk_bytes) {
        const std::uint64_t end = std::min(b.end - b.begin, at + b.chunk_bytes);
        chunk.resize(end - at);
        reader.read(t, b, at, end, chunk.data());
      }
      ++report.boxes;
    }
  }
  report.chunks = reader.stats.chunks_verified;
  report.bytes = reader.stats.bytes_read;
  return report;
}

std::map<std::string, Tensor> read_safetensors(const std::string& path) {
  const auto header = format::read_safetensors_header(path);
  const Fd file(path);
  std::map<std::string, Tensor> out;
  for (const auto& [key, e] : header) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    format::read_at(file.fd, t.bytes(), e.end - e.begin, e.begin, fmt::format("{}: tensor {}", path, key));
    out.emplace(key, std::move(t));
  }
  return out;
}

void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors) {
  std::vector<Tensor> host;
  std::vector<format::FileTensor> files;
  for (const auto& [name, t] : tensors) host.push_back(t.detach().to(Device::CPU));
  std::size_t i = 0;
  for (const auto& [name, t] : tensors) {
    files.push_back({name, t.dtype(), t.shape(), std::span<const std::byte>(host[i].bytes(), host[i].nbytes())});
    ++i;
  }
  format::write_safetensors(path, files);
}

}  // namespace dtensor::dcp
