#include "chunk_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "dtensor/core/error.h"

namespace dtensor::dcp {

ChunkReader::~ChunkReader() {
  for (auto& [name, fd] : open_) ::close(fd);
}

void ChunkReader::read(const format::TensorEntry& t, const format::SavedBox& b, std::uint64_t begin,
                       std::uint64_t end, std::byte* dest) {
  format::read_at(open(b.file), dest, end - begin, b.begin + begin,
                  fmt::format("{}: tensor {} box {}", (dir_ / b.file).string(), t.name, b.box));
  for (std::uint64_t at = begin; at < end; at += b.chunk_bytes) {
    const std::uint64_t c = at / b.chunk_bytes, n = std::min(b.chunk_bytes, end - at);
    if (format::checksum(std::span<const std::byte>(dest + (at - begin), n)) != b.checksums[c])
      throw CheckpointError(fmt::format("[checkpoint] {}: tensor {} box {}: chunk {} (bytes {}..{}) does not match "
                                        "its checksum: the file is corrupt",
                                        (dir_ / b.file).string(), t.name, b.box, c, b.begin + at, b.begin + at + n));
    ++stats.chunks_verified;
  }
  stats.bytes_read += end - begin;
}

int ChunkReader::open(const std::string& file) {
  if (auto it = open_.find(file); it != open_.end()) return it->second;
  const std::filesystem::path path = dir_ / file;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw CheckpointError(fmt::format("[checkpoint] {} named by the manifest cannot be opened: {}", path.string(),
                                      std::strerror(errno)));
  open_.emplace(file, fd);
  return fd;
}

}  // namespace dtensor::dcp
