// safetensors files: an 8-byte little-endian header length, a JSON header
// (key -> dtype, shape, data_offsets relative to the data), the data.
#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dtensor/core/error.h"
#include "dtensor/checkpoint/detail/format.h"

namespace dtensor::dcp::format {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian, as this host is");

// The header's length must stay within what readers accept (100 MB in the
// reference implementation).
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

void write_all(int fd, const void* data, std::size_t bytes, const std::filesystem::path& path) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw CheckpointError(fmt::format("[checkpoint] writing {}: {}", path.string(), std::strerror(errno)));
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

}  // namespace

std::string_view safetensors_dtype(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "F32";
    case DType::Float64: return "F64";
    case DType::Int64: return "I64";
    case DType::BFloat16: return "BF16";
    case DType::Float16: return "F16";
  }
  return "?";
}

DType parse_safetensors_dtype(std::string_view name) {
  for (DType d : {DType::Float32, DType::Float64, DType::Int64, DType::BFloat16, DType::Float16})
    if (safetensors_dtype(d) == name) return d;
  throw ParseError(fmt::format("dtype '{}' is not one of F32, F64, I64, BF16, F16", name));
}

std::string box_key(const std::string& tensor, const Box& box) {
  return fmt::format("{}@{}", tensor, fmt::join(box.offset, ","));
}

std::vector<std::pair<std::uint64_t, std::uint64_t>> write_safetensors(const std::filesystem::path& path,
                                                                       std::span<const FileTensor> tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::uint64_t at = 0;
  for (const FileTensor& t : tensors) {
    header[t.key] = {{"dtype", std::string(safetensors_dtype(t.dtype))},
                     {"shape", t.shape},
                     {"data_offsets", {at, at + t.bytes.size()}}};
    at += t.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  const std::uint64_t length = text.size();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw CheckpointError(fmt::format("[checkpoint] creating {}: {}", path.string(), std::strerror(errno)));
  try {
    write_all(fd, &length, sizeof(length), path);
    write_all(fd, text.data(), text.size(), path);
    for (const FileTensor& t : tensors) write_all(fd, t.bytes.data(), t.bytes.size(), path);
    if (::fsync(fd) != 0)
      throw CheckpointError(fmt::format("[checkpoint] fsync of {}: {}", path.string(), std::strerror(errno)));
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  std::uint64_t data = sizeof(length) + length;
  for (const FileTensor& t : tensors) {
    ranges.emplace_back(data, data + t.bytes.size());
    data += t.bytes.size();
  }
  return ranges;
}

std::map<std::string, FileEntry> read_safetensors_header(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(fmt::format("[checkpoint] {} cannot be opened", path.string()));
  std::uint64_t length = 0;
  in.read(reinterpret_cast<char*>(&length), sizeof(length));
  std::error_code ec;
  const auto file_bytes = std::filesystem::file_size(path, ec);
  if (!in || ec || length > kMaxHeaderBytes || sizeof(length) + length > file_bytes)
    throw CheckpointError(fmt::format("[checkpoint] {}: header length {} does not fit the file ({} bytes)",
                                      path.string(), length, file_bytes));
  std::string text(length, '\0');
  in.read(text.data(), static_cast<std::streamsize>(length));
  std::map<std::string, FileEntry> out;
  try {
    const auto header = nlohmann::json::parse(text);
    const std::uint64_t data = sizeof(length) + length;
    for (const auto& [key, j] : header.items()) {
      if (key == "__metadata__") continue;
      const auto offsets = j.at("data_offsets").get<std::vector<std::uint64_t>>();
      FileEntry e{parse_safetensors_dtype(j.at("dtype").get<std::string>()), j.at("shape").get<Shape>(), 0, 0};
      if (offsets.size() != 2 || offsets[0] > offsets[1] || data + offsets[1] > file_bytes ||
          offsets[1] - offsets[0] != static_cast<std::uint64_t>(numel(e.shape)) * itemsize(e.dtype))
        throw CheckpointError(fmt::format("[checkpoint] {}: tensor {}: data_offsets do not fit its shape, dtype "
                                          "and the file ({} bytes)",
                                          path.string(), key, file_bytes));
      e.begin = data + offsets[0];
      e.end = data + offsets[1];
      out.emplace(key, std::move(e));
    }
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("[checkpoint] {}: the header is not safetensors JSON: {}", path.string(), e.what()));
  } catch (const ParseError& e) {
    throw CheckpointError(fmt::format("[checkpoint] {}: {}", path.string(), e.what()));
  }
  return out;
}

void read_at(int fd, std::byte* dest, std::uint64_t bytes, std::uint64_t offset, const std::string& what) {
  for (std::uint64_t done = 0; done < bytes;) {
    const ssize_t n = ::pread(fd, dest + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw CheckpointError(fmt::format("[checkpoint] {}: the file ends before byte {} ({})", what, offset + done,
                                        n < 0 ? std::strerror(errno) : "truncated"));
    done += static_cast<std::uint64_t>(n);
  }
}

void sync_path(const std::filesystem::path& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw CheckpointError(fmt::format("[checkpoint] fsync of {}: {}", path.string(), std::strerror(err)));
  }
  ::close(fd);
}

}  // namespace dtensor::dcp::format
