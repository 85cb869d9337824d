#include "dtensor/train/text_data.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <utility>

#include <dtensor/core/error.h>

// meson passes the slice's absolute path in the source tree.
#ifndef DTENSOR_SHAKESPEARE_SLICE
#error "build with -DDTENSOR_SHAKESPEARE_SLICE=\"<source>/train/data/shakespeare_slice.txt\""
#endif

namespace dtensor::train {
namespace {

// Training text's share of the file, as a fraction: 9/10.
constexpr std::int64_t kTrainNumerator = 9;
constexpr std::int64_t kTrainDenominator = 10;

// splitmix64 (Steele, Lea, Flood 2014): a few lines whose output is fixed by
// its definition, unlike std::uniform_int_distribution's, which differs
// between standard libraries.
std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// One stream per (seed, step, split): each value goes through the mixer
// before the next is folded in, so nearby steps or seeds give unrelated
// streams.
std::uint64_t stream_state(std::uint64_t seed, std::uint64_t step, Split split) {
  std::uint64_t state = seed;
  state = splitmix64(state) ^ step;
  state = splitmix64(state) ^ static_cast<std::uint64_t>(split);
  return splitmix64(state);
}

const char* split_name(Split split) { return split == Split::Train ? "train" : "validation"; }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw dtensor::ValueError("[text_data] cannot open '" + path + "' (missing or unreadable)");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw dtensor::ValueError("[text_data] error reading '" + path + "'");
  return bytes;
}

}  // namespace

TextData::TextData(std::string path) : TextData(read_file(path), path) {}

TextData TextData::from_bytes(std::string bytes, std::string name) {
  return TextData(std::move(bytes), std::move(name));
}

TextData::TextData(std::string bytes, std::string path) : bytes_(std::move(bytes)), path_(std::move(path)) {
  if (bytes_.empty()) throw dtensor::ValueError("[text_data] '" + path_ + "' is empty: it holds no text to train on");
}

std::int64_t TextData::split_size(Split split) const {
  const std::int64_t train = size() * kTrainNumerator / kTrainDenominator;
  return split == Split::Train ? train : size() - train;
}

std::string_view TextData::split_text(Split split) const {
  const auto train = static_cast<std::size_t>(split_size(Split::Train));
  const std::string_view all(bytes_);
  return split == Split::Train ? all.substr(0, train) : all.substr(train);
}

Batch TextData::next_batch(Split split, std::int64_t batch, std::int64_t seq, std::uint64_t step,
                           std::uint64_t seed) const {
  if (batch < 1 || seq < 1) {
    std::ostringstream msg;
    msg << "[text_data] next_batch(batch=" << batch << ", seq=" << seq << "): both must be at least 1";
    throw dtensor::ValueError(msg.str());
  }
  const std::string_view text = split_text(split);
  const auto length = static_cast<std::int64_t>(text.size());
  if (length < seq + 1) {
    std::ostringstream msg;
    msg << "[text_data] '" << path_ << "': the " << split_name(split) << " split holds " << length << " bytes (of "
        << size() << "), fewer than seq + 1 = " << seq + 1 << " that one window of inputs and targets needs";
    throw dtensor::ValueError(msg.str());
  }
  // Window starts run over [0, length - seq - 1]. The modulo's bias is below
  // starts / 2^64: nothing next to a text of a few megabytes.
  const auto starts = static_cast<std::uint64_t>(length - seq);
  std::uint64_t state = stream_state(seed, step, split);

  Batch out{batch, seq, {}, {}};
  out.inputs.reserve(static_cast<std::size_t>(batch * seq));
  out.targets.reserve(static_cast<std::size_t>(batch * seq));
  for (std::int64_t b = 0; b < batch; ++b) {
    const auto start = static_cast<std::size_t>(splitmix64(state) % starts);
    for (std::int64_t t = 0; t < seq; ++t) {
      const auto at = start + static_cast<std::size_t>(t);
      // Through unsigned char: bytes above 127 (UTF-8) are tokens 128..255.
      out.inputs.push_back(static_cast<unsigned char>(text[at]));
      out.targets.push_back(static_cast<unsigned char>(text[at + 1]));
    }
  }
  return out;
}

std::string cached_text_path() {
  namespace fs = std::filesystem;
  fs::path base;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    base = xdg;
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    base = fs::path(home) / ".cache";
  } else {
    return {};  // no cache to look in
  }
  return (base / "dtensor" / "shakespeare" / "shakespeare.txt").string();
}

std::string committed_slice_path() { return DTENSOR_SHAKESPEARE_SLICE; }

std::string find_text(const std::optional<std::string>& path) {
  // An explicit path is returned even when missing, so that loading it
  // fails naming it instead of quietly training on other text.
  if (path) return *path;
  const std::string cached = cached_text_path();
  std::error_code ec;
  if (!cached.empty() && std::filesystem::is_regular_file(cached, ec)) return cached;
  return committed_slice_path();
}

std::string decode(const std::vector<std::int64_t>& tokens) {
  std::string text;
  text.reserve(tokens.size());
  for (std::int64_t token : tokens) text.push_back(static_cast<char>(static_cast<unsigned char>(token)));
  return text;
}

}  // namespace dtensor::train
