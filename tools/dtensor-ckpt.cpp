// dtensor-ckpt: looks into, checks and converts dtensor checkpoints.
//
//   dtensor-ckpt info DIR                       what is in it, per tensor, with a picture of the boxes
//   dtensor-ckpt verify DIR                     every chunk's checksum, boxes disjoint and covering
//   dtensor-ckpt convert DIR --to-single F.safetensors
//   dtensor-ckpt convert F.safetensors --mesh 2x4 [--dims dp,tp] --layout w=S(0),R [--layout ...] --out DIR
//
// Exit 0 only when all is well; 1 when the checkpoint or file is bad (the
// message names the file, tensor and box); 2 for a bad command line.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtensor/checkpoint/detail/format.h"
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/dtensor.h"
#include "layout_text.h"

namespace {

using namespace dtensor;
namespace fs = std::filesystem;

constexpr int kExitBad = 1;
constexpr int kExitUsage = 2;

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int info(const std::string& dir) {
  const auto manifest = dcp::format::read_manifest(dir);
  std::uint64_t total = 0;
  for (const auto& [name, t] : manifest.tensors) {
    std::uint64_t bytes = static_cast<std::uint64_t>(numel(t.shape)) * itemsize(t.dtype);
    total += bytes;
    std::vector<std::string> files;
    for (const auto& b : t.boxes)
      if (std::find(files.begin(), files.end(), b.file) == files.end()) files.push_back(b.file);
    fmt::print("{}: {} {} ({}), {} box{} in {} file{}\n", name, t.dtype, cli::shape_text(t.shape),
               human_bytes(static_cast<std::int64_t>(bytes)), t.boxes.size(), t.boxes.size() == 1 ? "" : "es",
               files.size(), files.size() == 1 ? "" : "s");
    if (t.mesh_shape.empty()) {
      fmt::print("  saved from plain tensors (one process)\n");
      continue;
    }
    fmt::print("  saved from mesh {} ({}) as {}\n", fmt::join(t.mesh_shape, "x"), fmt::join(t.mesh_dims, ","),
               t.layout);
    const Layout layout = validate_layout(Layout::parse(t.layout), t.mesh_shape, t.shape);
    fmt::print("{}", cli::layout_text(t.mesh_shape, t.shape, itemsize(t.dtype), layout, "    "));
  }
  fmt::print("{} tensors, {}\n", manifest.tensors.size(), human_bytes(static_cast<std::int64_t>(total)));
  return 0;
}

int verify(const std::string& dir) {
  const dcp::VerifyReport r = dcp::verify(dir);
  fmt::print("ok: {} tensors, {} boxes, {} in {} checksummed chunks\n", r.tensors, r.boxes,
             human_bytes(static_cast<std::int64_t>(r.bytes)), r.chunks);
  return 0;
}

int to_single(const std::string& dir, const std::string& out) {
  const auto tensors = dcp::load_full(dir);
  dcp::write_safetensors(out, tensors);
  fmt::print("wrote {} tensors to {}\n", tensors.size(), out);
  return 0;
}

// "name=S(0),R" -> {name, layout text}.
std::map<std::string, Layout> parse_layouts(const std::vector<std::string>& specs, int mesh_ndim) {
  std::map<std::string, Layout> out;
  for (const std::string& spec : specs) {
    const auto eq = spec.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UsageError(fmt::format("--layout '{}': expected NAME=PLACEMENTS, e.g. w=S(0),R", spec));
    Layout layout = Layout::parse(spec.substr(eq + 1));
    if (layout.mesh_ndim() != mesh_ndim)
      throw UsageError(fmt::format("--layout '{}': {} placements for a mesh of {} dims", spec, layout.mesh_ndim(),
                                   mesh_ndim));
    out.emplace(spec.substr(0, eq), std::move(layout));
  }
  return out;
}

// Shards a safetensors file into a checkpoint on thread ranks, one per mesh
// rank; tensors without a --layout are replicated.
int from_single(const std::string& file, const std::string& mesh_text, const std::vector<std::string>& dims,
                const std::vector<std::string>& layout_specs, const std::string& out) {
  if (out.empty()) throw UsageError("convert FILE.safetensors needs --out DIR");
  const Shape mesh_shape = parse_shape(mesh_text);
  const auto layouts = parse_layouts(layout_specs, static_cast<int>(mesh_shape.size()));
  const auto tensors = dcp::read_safetensors(file);
  for (const auto& [name, layout] : layouts)
    if (!tensors.contains(name)) throw UsageError(fmt::format("--layout names {}, which {} does not hold", name, file));
  run_threads(static_cast<int>(numel(mesh_shape)), [&](Communicator& world) {
    const DeviceMesh mesh(world, mesh_shape, dims);
    std::map<std::string, DTensor> sharded;
    for (const auto& [name, t] : tensors) {
      const auto it = layouts.find(name);
      sharded.emplace(name, from_full(t, mesh, it != layouts.end() ? it->second : Layout::replicated(mesh.ndim())));
    }
    dcp::save(out, sharded);
  });
  fmt::print("wrote {} tensors from {} to {} (mesh {})\n", tensors.size(), file, out, fmt::join(mesh_shape, "x"));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dtensor-ckpt: look into, verify and convert dtensor checkpoints"};
  app.require_subcommand(1);
  std::string dir, source, single, mesh = "1", out;
  std::vector<std::string> dims, layouts;
  auto* info_cmd = app.add_subcommand("info", "what is in a checkpoint, per tensor, with its boxes drawn");
  info_cmd->add_option("DIR", dir, "the checkpoint directory")->required();
  auto* verify_cmd = app.add_subcommand("verify", "check every checksum, and that boxes cover each tensor once");
  verify_cmd->add_option("DIR", dir, "the checkpoint directory")->required();
  auto* convert_cmd = app.add_subcommand("convert", "to one safetensors file, or a safetensors file to a checkpoint");
  convert_cmd->add_option("SOURCE", source, "a checkpoint directory, or a .safetensors file")->required();
  convert_cmd->add_option("--to-single", single, "write the checkpoint as one safetensors file");
  convert_cmd->add_option("--mesh", mesh, "the mesh to shard a safetensors file onto, e.g. 2x4");
  convert_cmd->add_option("--dims", dims, "mesh dim names")->delimiter(',');
  convert_cmd->add_option("--layout", layouts, "NAME=PLACEMENTS, e.g. w=S(0),R (others: replicated)");
  convert_cmd->add_option("--out", out, "the checkpoint directory to write");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  try {
    if (info_cmd->parsed()) return info(dir);
    if (verify_cmd->parsed()) return verify(dir);
    if (fs::is_directory(source)) {
      if (single.empty()) throw UsageError("convert DIR needs --to-single FILE.safetensors");
      return to_single(source, single);
    }
    if (!fs::exists(source)) throw UsageError(fmt::format("convert: {} does not exist", source));
    return from_single(source, mesh, dims, layouts, out);
  } catch (const UsageError& e) {
    fmt::print(stderr, "dtensor-ckpt: {}\n", e.what());
    return kExitUsage;
  } catch (const CheckpointError& e) {
    fmt::print(stderr, "dtensor-ckpt: {}\n", e.what());
    return kExitBad;
  } catch (const ValueError& e) {  // a bad mesh or layout text
    fmt::print(stderr, "dtensor-ckpt: {}\n", e.what());
    return kExitUsage;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dtensor-ckpt: {}\n", e.what());
    return kExitBad;
  }
}
