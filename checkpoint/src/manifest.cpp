// The manifest as JSON, and the checksums it holds.
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "dtensor/core/error.h"
#include "dtensor/checkpoint/detail/format.h"

namespace dtensor::dcp::format {
namespace {

using nlohmann::json;

std::string hex(std::uint64_t v) { return fmt::format("{:016x}", v); }

std::uint64_t parse_hex(const std::string& text, const std::string& where) {
  std::size_t used = 0;
  std::uint64_t v = 0;
  try {
    v = std::stoull(text, &used, 16);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.size() != 16 || used != text.size())
    throw CheckpointError(fmt::format("[checkpoint] {}: checksum '{}' is not 16 hex digits", where, text));
  return v;
}

json box_json(const SavedBox& b) {
  std::vector<std::string> sums;
  for (std::uint64_t c : b.checksums) sums.push_back(hex(c));
  return json{{"file", b.file},     {"byte_range", {b.begin, b.end}}, {"offset", b.box.offset},
              {"size", b.box.size}, {"chunk_bytes", b.chunk_bytes},   {"xxh64", sums}};
}

SavedBox parse_box(const json& j, const TensorEntry& t, const std::string& where) {
  SavedBox b;
  b.file = j.at("file").get<std::string>();
  const auto range = j.at("byte_range").get<std::vector<std::uint64_t>>();
  if (range.size() != 2 || range[0] > range[1])
    throw CheckpointError(fmt::format("[checkpoint] {}: tensor {}: byte_range {} is not [begin, end]", where, t.name,
                                      fmt::join(range, ",")));
  b.begin = range[0];
  b.end = range[1];
  b.box.offset = j.at("offset").get<Shape>();
  b.box.size = j.at("size").get<Shape>();
  b.chunk_bytes = j.at("chunk_bytes").get<std::uint64_t>();
  for (const auto& s : j.at("xxh64")) b.checksums.push_back(parse_hex(s.get<std::string>(), where));
  const auto bytes = static_cast<std::uint64_t>(b.box.numel()) * itemsize(t.dtype);
  const bool fits = b.box.ndim() == static_cast<int>(t.shape.size()) && contains(full_box(t.shape), b.box);
  if (!fits || b.end - b.begin != bytes || b.chunk_bytes == 0 ||
      b.checksums.size() != (bytes + b.chunk_bytes - 1) / b.chunk_bytes)
    throw CheckpointError(fmt::format("[checkpoint] {}: tensor {}: box {} (bytes {}..{}, {} checksums) does not fit "
                                      "the tensor's shape [{}] and dtype {}",
                                      where, t.name, b.box, b.begin, b.end, b.checksums.size(),
                                      fmt::join(t.shape, ","), t.dtype));
  return b;
}

}  // namespace

std::string manifest_text(const Manifest& m) {
  json tensors = json::object();
  for (const auto& [name, t] : m.tensors) {
    json boxes = json::array();
    for (const SavedBox& b : t.boxes) boxes.push_back(box_json(b));
    tensors[name] = {{"dtype", std::string(safetensors_dtype(t.dtype))},
                     {"shape", t.shape},
                     {"mesh", {{"shape", t.mesh_shape}, {"dims", t.mesh_dims}}},
                     {"layout", t.layout},
                     {"boxes", boxes}};
  }
  return json{{"format", "dtensor-checkpoint"}, {"version", kVersion}, {"tensors", tensors}}.dump(1) + "\n";
}

Manifest parse_manifest(std::string_view text, const std::string& where) {
  Manifest m;
  try {
    const json j = json::parse(text);
    if (j.at("format") != "dtensor-checkpoint" || j.at("version") != kVersion)
      throw CheckpointError(fmt::format("[checkpoint] {}: format {} version {}; expected dtensor-checkpoint version {}",
                                        where, j.at("format").dump(), j.at("version").dump(), kVersion));
    for (const auto& [name, tj] : j.at("tensors").items()) {
      TensorEntry t;
      t.name = name;
      t.dtype = parse_safetensors_dtype(tj.at("dtype").get<std::string>());
      t.shape = tj.at("shape").get<Shape>();
      t.mesh_shape = tj.at("mesh").at("shape").get<Shape>();
      t.mesh_dims = tj.at("mesh").at("dims").get<std::vector<std::string>>();
      t.layout = tj.at("layout").get<std::string>();
      for (const auto& bj : tj.at("boxes")) t.boxes.push_back(parse_box(bj, t, where));
      m.tensors.emplace(name, std::move(t));
    }
  } catch (const json::exception& e) {
    throw CheckpointError(fmt::format("[checkpoint] {} is not a checkpoint manifest: {}", where, e.what()));
  } catch (const ParseError& e) {
    throw CheckpointError(fmt::format("[checkpoint] {}: {}", where, e.what()));
  }
  return m;
}

std::string saved_boxes_text(const std::vector<std::pair<std::string, SavedBox>>& boxes) {
  json out = json::array();
  for (const auto& [name, box] : boxes) out.push_back({name, box_json(box)});
  return out.dump();
}

void add_saved_boxes(Manifest& m, std::string_view text, const std::string& where) {
  try {
    for (const auto& [name, box] : json::parse(text).get<std::vector<std::pair<std::string, json>>>()) {
      TensorEntry& t = m.tensors.at(name);
      t.boxes.push_back(parse_box(box, t, where));
    }
  } catch (const json::exception& e) {
    throw CheckpointError(fmt::format("[checkpoint] {}: not a list of saved boxes: {}", where, e.what()));
  } catch (const std::out_of_range&) {
    throw CheckpointError(fmt::format("[checkpoint] {}: a saved box of a tensor not being saved", where));
  }
}

Manifest read_manifest(const std::filesystem::path& dir) {
  const auto path = dir / kManifestName;
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw CheckpointError(fmt::format(
        "[checkpoint] {} has no {}: not a checkpoint, or a save that did not finish", dir.string(), kManifestName));
  std::stringstream text;
  text << in.rdbuf();
  return parse_manifest(text.str(), path.string());
}

std::uint64_t checksum(std::span<const std::byte> bytes) { return XXH64(bytes.data(), bytes.size(), 0); }

std::vector<std::uint64_t> chunk_checksums(std::span<const std::byte> bytes, std::uint64_t chunk_bytes) {
  std::vector<std::uint64_t> out;
  for (std::uint64_t at = 0; at < bytes.size(); at += chunk_bytes)
    out.push_back(checksum(bytes.subspan(at, std::min<std::uint64_t>(chunk_bytes, bytes.size() - at))));
  return out;
}

}  // namespace dtensor::dcp::format
