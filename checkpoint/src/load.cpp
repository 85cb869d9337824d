// load(): each rank finds the saved boxes that meet its target box (sorted
// by their offset on dim 0 and swept, not scanned whole), reads only the
// checksummed chunks that hold what it needs, verifies them, and copies the
// intersections into its shard.

#include <algorithm>
#include <cstring>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/core/error.h"
#include "chunk_reader.h"
#include "dtensor/checkpoint/detail/format.h"
#include "outcome.h"

namespace dtensor::dcp {
namespace {

namespace fs = std::filesystem;
using format::SavedBox;
using format::TensorEntry;

Shape strides_of(const Shape& size) {
  Shape s(size.size(), 1);
  for (int d = static_cast<int>(size.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * size[d + 1];
  return s;
}

std::int64_t linear(const Shape& index, const Box& box, const Shape& strides) {
  std::int64_t at = 0;
  for (std::size_t d = 0; d < index.size(); ++d) at += (index[d] - box.offset[d]) * strides[d];
  return at;
}

// One contiguous run of a cut: `length` elements at element `from` of the
// saved box and element `to` of this rank's box.
struct Run {
  std::int64_t from, to, length;
};

// The runs of `cut` (inside both boxes) in increasing order: the trailing
// dims where the cut spans both boxes whole merge into one run.
std::vector<Run> runs_of(const Box& saved, const Box& cut, const Box& mine) {
  const int nd = cut.ndim();
  int k = nd - 1;
  while (k > 0 && cut.size[k] == saved.size[k] && cut.size[k] == mine.size[k]) --k;
  const std::int64_t run =
      nd == 0 ? 1 : numel(std::span<const std::int64_t>(cut.size).subspan(static_cast<std::size_t>(k)));
  const Shape src_strides = strides_of(saved.size), dst_strides = strides_of(mine.size);
  std::vector<Run> out;
  Shape index = cut.offset;
  while (true) {
    out.push_back({linear(index, saved, src_strides), linear(index, mine, dst_strides), run});
    int d = k - 1;
    for (; d >= 0; --d) {
      if (++index[d] < cut.offset[d] + cut.size[d]) break;
      index[d] = cut.offset[d];
    }
    if (d < 0) return out;
  }
}

// Reads the chunks of `b` that hold `cut` (whole chunks, merged where they
// touch) and copies the cut into `out`. A run that starts and ends on chunk
// boundaries (a whole saved box, the common case) is read straight into
// `out` and verified there, without a copy.
void read_cut(ChunkReader& files, const TensorEntry& t, const SavedBox& b, const Box& cut, Tensor& out, const Box& mine) {
  const std::vector<Run> runs = runs_of(b.box, cut, mine);
  const auto isz = static_cast<std::uint64_t>(itemsize(t.dtype));
  const std::uint64_t cb = b.chunk_bytes, box_bytes = b.end - b.begin;
  auto byte_begin = [&](const Run& r) { return static_cast<std::uint64_t>(r.from) * isz; };
  auto byte_end = [&](const Run& r) { return static_cast<std::uint64_t>(r.from + r.length) * isz; };
  auto chunk_end = [&](std::uint64_t byte) { return std::min(box_bytes, (byte + cb - 1) / cb * cb); };
  std::unique_ptr<std::byte[]> buffer;
  for (std::size_t i = 0; i < runs.size();) {
    const std::uint64_t begin = byte_begin(runs[i]) / cb * cb;
    std::uint64_t end = chunk_end(byte_end(runs[i]));
    std::size_t j = i + 1;
    for (; j < runs.size() && byte_begin(runs[j]) / cb * cb <= end; ++j) end = std::max(end, chunk_end(byte_end(runs[j])));
    std::byte* into = out.bytes() + static_cast<std::uint64_t>(runs[i].to) * isz;
    if (j == i + 1 && begin == byte_begin(runs[i]) && end == byte_end(runs[i])) {
      files.read(t, b, begin, end, into);
      ++i;
      continue;
    }
    buffer.reset(new std::byte[end - begin]);  // uninitialised: read() fills it
    files.read(t, b, begin, end, buffer.get());
    for (; i < j; ++i)
      std::memcpy(out.bytes() + static_cast<std::uint64_t>(runs[i].to) * isz, buffer.get() + (byte_begin(runs[i]) - begin),
                  static_cast<std::size_t>(byte_end(runs[i]) - byte_begin(runs[i])));
  }
}

// The saved boxes of `t` that meet `mine`: sorted by their start on dim 0,
// the candidates are those starting within the longest box's length before
// `mine` ends (two binary searches), then each is intersected.
std::vector<const SavedBox*> meeting(const TensorEntry& t, const std::vector<const SavedBox*>& by_start,
                                     std::int64_t longest, const Box& mine) {
  std::vector<const SavedBox*> out;
  if (mine.empty()) return out;
  if (t.shape.empty()) return by_start;
  auto start = [](const SavedBox* b) { return b->box.offset[0]; };
  const auto lo = std::lower_bound(by_start.begin(), by_start.end(), mine.offset[0] - longest + 1,
                                   [&](const SavedBox* b, std::int64_t v) { return start(b) < v; });
  const auto hi = std::lower_bound(lo, by_start.end(), mine.offset[0] + mine.size[0],
                                   [&](const SavedBox* b, std::int64_t v) { return start(b) < v; });
  for (auto it = lo; it != hi; ++it)
    if (!intersect((*it)->box, mine).empty()) out.push_back(*it);
  return out;
}

// This rank's box `mine` of `t`, read from the files.
Tensor read_box(ChunkReader& files, const TensorEntry& t, const Box& mine) {
  Tensor out = Tensor::empty(mine.size, t.dtype);
  std::vector<const SavedBox*> by_start;
  std::int64_t longest = 0;
  for (const SavedBox& b : t.boxes) {
    by_start.push_back(&b);
    if (!t.shape.empty()) longest = std::max(longest, b.box.size[0]);
  }
  if (!t.shape.empty())
    std::sort(by_start.begin(), by_start.end(), [](auto* a, auto* b) { return a->box.offset[0] < b->box.offset[0]; });
  const std::size_t isz = itemsize(t.dtype);
  std::int64_t covered = 0;  // the saved boxes are disjoint: covered counts each element once
  for (const SavedBox* b : meeting(t, by_start, longest, mine)) {
    const Box cut = intersect(b->box, mine);
    read_cut(files, t, *b, cut, out, mine);
    covered += cut.numel();
  }
  if (covered != mine.numel())
    throw CheckpointError(fmt::format("[checkpoint] tensor {}: the saved boxes cover {} of the {} elements of box {}",
                                      t.name, covered, mine.numel(), mine));
  files.stats.bytes_needed += static_cast<std::uint64_t>(mine.numel()) * isz;
  return out;
}

const TensorEntry& entry(const format::Manifest& m, const std::string& name, const fs::path& dir) {
  const auto it = m.tensors.find(name);
  if (it == m.tensors.end()) {
    std::vector<std::string> names;
    for (const auto& [n, t] : m.tensors) names.push_back(n);
    throw ValueError(fmt::format("[checkpoint] {} has no tensor '{}'; it has: {}", dir.string(), name,
                                 fmt::join(names, ", ")));
  }
  return it->second;
}

}  // namespace

std::map<std::string, DTensor> load(const std::string& dir, const std::map<std::string, Target>& targets,
                                    LoadStats* stats) {
  if (targets.empty()) throw ValueError("[checkpoint] load of no tensors: expected at least one target");
  Communicator& comm = targets.begin()->second.mesh.comm();
  for (const auto& [name, target] : targets)
    if (&target.mesh.comm() != &comm)
      throw ValueError(fmt::format("[checkpoint] target {} is on another group than {}: one load takes targets of "
                                   "one mesh",
                                   name, targets.begin()->first));
  std::map<std::string, DTensor> out;
  ChunkReader files(dir);
  agree(&comm, "loading", [&] {
    const format::Manifest manifest = format::read_manifest(dir);
    for (const auto& [name, target] : targets) {
      const TensorEntry& t = entry(manifest, name, dir);
      if (target.shape && *target.shape != t.shape)
        throw ShapeError(fmt::format("[checkpoint] tensor {} was saved with shape [{}]; the target expects [{}]", name,
                                     fmt::join(t.shape, ","), fmt::join(*target.shape, ",")));
      if (target.dtype && *target.dtype != t.dtype)
        throw DTypeError(fmt::format("[checkpoint] tensor {} was saved as {}; the target expects {}", name, t.dtype,
                                     *target.dtype));
      const Layout layout = validate_layout(target.layout, target.mesh.shape(), t.shape);
      if (layout != layout.without_partial())
        throw LayoutError(fmt::format("[checkpoint] target layout {} of tensor {} is Partial: load into Replicate or "
                                      "Shard, then redistribute",
                                      layout, name));
      const Box mine = local_box(target.mesh.shape(), t.shape, layout, target.mesh.coordinate());
      Tensor local = read_box(files, t, mine).to(target.mesh.device());
      out.emplace(name, DTensor::from_local(std::move(local), target.mesh, layout, t.shape, FromLocalCheck::Trust));
    }
  });
  if (stats) *stats = files.stats;
  return out;
}

void load_into(const std::string& dir, const std::vector<std::pair<std::string, DTensor*>>& named, LoadStats* stats) {
  if (named.empty()) throw ValueError("[checkpoint] load_into no tensors: expected at least one");
  std::map<std::string, Target> targets;
  for (const auto& [name, t] : named)
    targets.emplace(name, Target{t->mesh(), t->placements().without_partial(), t->shape(), t->dtype()});
  auto got = load(dir, targets, stats);
  for (const auto& [name, t] : named) {
    const bool grad = t->requires_grad();
    *t = got.at(name);
    if (grad) t->requires_grad_();
  }
}

std::map<std::string, Tensor> load_full(const std::string& dir, const std::vector<std::string>& names) {
  const format::Manifest manifest = format::read_manifest(dir);
  std::vector<std::string> wanted = names;
  if (wanted.empty())
    for (const auto& [name, t] : manifest.tensors) wanted.push_back(name);
  ChunkReader files(dir);
  std::map<std::string, Tensor> out;
  for (const std::string& name : wanted) {
    const TensorEntry& t = entry(manifest, name, dir);
    out.emplace(name, read_box(files, t, full_box(t.shape)));
  }
  return out;
}

}  // namespace dtensor::dcp
