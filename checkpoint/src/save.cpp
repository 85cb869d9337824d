// save(): each writing rank writes its boxes into one safetensors file in a
// temporary directory, rank 0 writes the manifest last and swaps the
// directory in. Every step that can fail on one rank is followed by an
// exchange of outcomes, so that all ranks throw together and none waits.
#include <fcntl.h>

#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/core/error.h"
#include "dtensor/checkpoint/detail/format.h"
#include "outcome.h"

namespace dtensor::dcp {
namespace {

namespace fs = std::filesystem;
using format::SavedBox;
using format::TensorEntry;

// One box this rank writes.
struct Piece {
  std::string name;
  Tensor local;  // on the CPU, C-order
  Box box;
};

fs::path staging_dir(const fs::path& dir) { return fs::path(dir.string() + ".saving"); }

std::string file_name(int rank) { return fmt::format("rank-{:05d}.safetensors", rank); }

// Writes this rank's pieces (if any) into `staging`; their manifest records.
std::vector<std::pair<std::string, SavedBox>> write_pieces(const fs::path& staging, int rank,
                                                           const std::vector<Piece>& pieces,
                                                           std::uint64_t chunk_bytes) {
  std::vector<std::pair<std::string, SavedBox>> out;
  if (pieces.empty()) return out;
  std::vector<format::FileTensor> tensors;
  for (const Piece& p : pieces)
    tensors.push_back({format::box_key(p.name, p.box), p.local.dtype(), p.box.size,
                       std::span<const std::byte>(p.local.bytes(), p.local.nbytes())});
  const std::string file = file_name(rank);
  const auto ranges = format::write_safetensors(staging / file, tensors);
  for (std::size_t i = 0; i < pieces.size(); ++i)
    out.emplace_back(pieces[i].name, SavedBox{file, ranges[i].first, ranges[i].second, pieces[i].box, chunk_bytes,
                                              format::chunk_checksums(tensors[i].bytes, chunk_bytes)});
  return out;
}

// Rank 0: the manifest, written last inside the staging directory, then the
// directory swapped in for `dir` (an older checkpoint there is exchanged
// atomically and then removed).
void publish(const fs::path& dir, const fs::path& staging, const format::Manifest& m) {
  const fs::path tmp = staging / "manifest.json.tmp";
  {
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    const std::string text = format::manifest_text(m);
    if (!f || std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fclose(f) != 0)
      throw CheckpointError(fmt::format("[checkpoint] writing {}: {}", tmp.string(), std::strerror(errno)));
  }
  format::sync_path(tmp, false);
  fs::rename(tmp, staging / format::kManifestName);
  format::sync_path(staging, true);
  const fs::path parent = fs::absolute(dir).parent_path();
  if (fs::exists(dir)) {
    if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) != 0)
      throw CheckpointError(
          fmt::format("[checkpoint] replacing {} by {}: {}", dir.string(), staging.string(), std::strerror(errno)));
    format::sync_path(parent, true);
    fs::remove_all(staging);  // the older checkpoint, now under the staging name
  } else {
    fs::rename(staging, dir);
  }
  format::sync_path(parent, true);
}

// The entries every rank knows from metadata alone.
format::Manifest entries(const std::map<std::string, DTensor>& tensors) {
  format::Manifest m;
  for (const auto& [name, t] : tensors) {
    TensorEntry e;
    e.name = name;
    e.dtype = t.dtype();
    e.shape = t.shape();
    e.mesh_shape = t.mesh().shape();
    e.mesh_dims = t.mesh().dim_names();
    e.layout = fmt::format("{}", t.placements());
    m.tensors.emplace(name, std::move(e));
  }
  return m;
}

// This rank's boxes to write: one rank per replicated group, none empty.
std::vector<Piece> pieces_of(const std::map<std::string, DTensor>& tensors, const SaveOptions& options) {
  std::vector<Piece> out;
  for (const auto& [name, given] : tensors) {
    DTensor t = given.detach();
    if (t.placements() != t.placements().without_partial()) {
      if (!options.allow_communication)
        throw LayoutError(
            fmt::format("[checkpoint] tensor {} is {} (Partial): saving it needs a reduction, and "
                        "SaveOptions::allow_communication is false",
                        name, t.placements()));
      t = t.redistribute(t.placements().without_partial());
    }
    bool writes = true;
    for (int m = 0; m < t.placements().mesh_ndim(); ++m)
      writes = writes && (!is_replicate(t.placements()[m]) || t.mesh().coordinate()[m] == 0);
    const Box box = t.local_box();
    if (writes && !box.empty()) out.push_back({name, t.to_local().to(Device::CPU), box});
  }
  return out;
}

void check_one_mesh(const std::map<std::string, DTensor>& tensors) {
  const DTensor* first = nullptr;
  for (const auto& [name, t] : tensors) {
    if (!first) first = &t;
    if (&t.mesh().comm() != &first->mesh().comm() || t.mesh().shape() != first->mesh().shape())
      throw ValueError(
          fmt::format("[checkpoint] tensor {} is on mesh [{}], {} on mesh [{}] of another group: one save "
                      "takes tensors of one mesh",
                      name, fmt::join(t.mesh().shape(), ","), tensors.begin()->first,
                      fmt::join(first->mesh().shape(), ",")));
  }
}

void save_pieces(const fs::path& dir, format::Manifest manifest, const std::vector<Piece>& pieces, Communicator* comm,
                 const SaveOptions& options) {
  const int rank = comm ? comm->rank() : 0;
  const fs::path staging = staging_dir(dir);
  agree(comm, "preparing the directory", [&] {
    if (rank != 0) return;
    if (dir.has_parent_path()) fs::create_directories(dir.parent_path());
    fs::remove_all(staging);  // what a save cut short left
    fs::create_directory(staging);
  });
  std::string mine;
  agree(comm, "writing its boxes", [&] {
    if (options.before_writing) options.before_writing(rank);
    mine = format::saved_boxes_text(write_pieces(staging, rank, pieces, options.chunk_bytes));
  });
  const std::vector<std::string> all = gather_texts(comm, mine);
  agree(comm, "writing the manifest", [&] {
    if (rank != 0) return;
    for (std::size_t r = 0; r < all.size(); ++r)
      format::add_saved_boxes(manifest, all[r], fmt::format("the boxes rank {} wrote", r));
    publish(dir, staging, manifest);
  });
}

// Plain tensors: their entries and their boxes, each whole.
std::pair<format::Manifest, std::vector<Piece>> plain_parts(const std::map<std::string, Tensor>& tensors) {
  format::Manifest manifest;
  std::vector<Piece> pieces;
  for (const auto& [name, t] : tensors) {
    TensorEntry e;
    e.name = name;
    e.dtype = t.dtype();
    e.shape = t.shape();
    manifest.tensors.emplace(name, std::move(e));
    if (t.numel() > 0) pieces.push_back({name, t.detach().to(Device::CPU), full_box(t.shape())});
  }
  return {std::move(manifest), std::move(pieces)};
}

// Every rank's entries, on rank 0 (the only one that writes the manifest):
// the union, a name given twice agreeing in dtype and shape. Every rank
// throws alike when the union fails or is empty.
format::Manifest merged_entries(const format::Manifest& mine, Communicator& world) {
  const std::vector<std::string> all = gather_texts(&world, format::manifest_text(mine));
  format::Manifest merged;
  agree(&world, "merging the groups' tensors", [&] {
    for (std::size_t r = 0; r < all.size(); ++r)
      for (auto& [name, e] : format::parse_manifest(all[r], fmt::format("the tensors rank {} holds", r)).tensors) {
        const auto [at, added] = merged.tensors.emplace(name, e);
        if (!added && (at->second.dtype != e.dtype || at->second.shape != e.shape))
          throw ValueError(fmt::format("[checkpoint] tensor {} is {} [{}] on rank {} but {} [{}] on another rank", name,
                                       e.dtype, fmt::join(e.shape, ","), r, at->second.dtype,
                                       fmt::join(at->second.shape, ",")));
      }
    if (merged.tensors.empty())
      throw ValueError("[checkpoint] save_parts of no tensors on any rank: expected at least one");
  });
  return merged;
}

}  // namespace

void save(const std::string& dir, const std::map<std::string, DTensor>& tensors, const SaveOptions& options) {
  if (tensors.empty()) throw ValueError("[checkpoint] save of no tensors: expected at least one");
  if (options.chunk_bytes == 0) throw ValueError("[checkpoint] SaveOptions::chunk_bytes = 0; expected at least 1");
  check_one_mesh(tensors);
  std::vector<Piece> pieces;
  Communicator& comm = tensors.begin()->second.mesh().comm();
  agree(&comm, "reducing Partial tensors", [&] { pieces = pieces_of(tensors, options); });
  save_pieces(dir, entries(tensors), pieces, &comm, options);
}

void save(const std::string& dir, const std::vector<std::pair<std::string, DTensor*>>& named,
          const SaveOptions& options) {
  std::map<std::string, DTensor> tensors;
  for (const auto& [name, t] : named)
    if (!tensors.emplace(name, *t).second)
      throw ValueError(fmt::format("[checkpoint] the name {} is given twice: expected each once", name));
  save(dir, tensors, options);
}

void save(const std::string& dir, const std::map<std::string, Tensor>& tensors, const SaveOptions& options) {
  if (tensors.empty()) throw ValueError("[checkpoint] save of no tensors: expected at least one");
  if (options.chunk_bytes == 0) throw ValueError("[checkpoint] SaveOptions::chunk_bytes = 0; expected at least 1");
  auto [manifest, pieces] = plain_parts(tensors);
  save_pieces(dir, std::move(manifest), pieces, nullptr, options);
}

void save_parts(const std::string& dir, const std::map<std::string, DTensor>& mine, Communicator& world,
                const SaveOptions& options) {
  if (options.chunk_bytes == 0) throw ValueError("[checkpoint] SaveOptions::chunk_bytes = 0; expected at least 1");
  check_one_mesh(mine);
  std::vector<Piece> pieces;
  agree(&world, "reducing Partial tensors", [&] { pieces = pieces_of(mine, options); });
  save_pieces(dir, merged_entries(entries(mine), world), pieces, &world, options);
}

void save_parts(const std::string& dir, const std::map<std::string, Tensor>& mine, Communicator& world,
                const SaveOptions& options) {
  if (options.chunk_bytes == 0) throw ValueError("[checkpoint] SaveOptions::chunk_bytes = 0; expected at least 1");
  auto [manifest, pieces] = plain_parts(mine);
  save_pieces(dir, merged_entries(std::move(manifest), world), pieces, &world, options);
}

}  // namespace dtensor::dcp
