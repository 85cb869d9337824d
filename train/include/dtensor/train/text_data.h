#pragma once
// Byte-level text for the GPT example: a file read as bytes (tokens 0..255),
// split into training and validation text, and batches drawn from either
// split by a rule that depends only on (seed, step), so that every rank of
// every mesh draws the same batch without communicating.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtensor::train {

/// The vocabulary: one token per byte value.
inline constexpr std::int64_t kVocabSize = 256;

/// Which part of the text a batch comes from.
enum class Split { Train, Validation };

/// A batch of `batch` windows of `seq` tokens, row-major [batch, seq]:
/// targets[b, t] is the token after inputs[b, t] in the text
/// (inputs[b, t + 1] for t < seq - 1).
struct Batch {
  std::int64_t batch = 0;
  std::int64_t seq = 0;
  std::vector<std::int64_t> inputs;
  std::vector<std::int64_t> targets;
};

/// A text file held in memory as bytes. The first 90% of its bytes are the
/// training split and the last 10% the validation split (floor(size * 9 / 10)
/// bytes of training text), so the split depends on the file alone.
class TextData {
 public:
  /// Reads the file at `path`. Throws dtensor::ValueError naming the path
  /// when it cannot be read or holds no bytes.
  explicit TextData(std::string path);

  /// Text given directly (for tests); `name` stands for the path in errors.
  static TextData from_bytes(std::string bytes, std::string name);

  const std::string& path() const { return path_; }
  /// Bytes in the whole file.
  std::int64_t size() const { return static_cast<std::int64_t>(bytes_.size()); }
  /// Bytes in one split; train + validation = size().
  std::int64_t split_size(Split split) const;
  /// The bytes of one split.
  std::string_view split_text(Split split) const;

  /// `batch` windows of `seq` + 1 bytes from `split`, each starting at a
  /// position drawn uniformly from those where it fits. The draw depends on
  /// (split, seed, step) only: a splitmix64 stream, so the same on every
  /// platform. Throws dtensor::ValueError when batch or seq is below 1, or
  /// when the split is shorter than seq + 1 bytes (naming path and sizes).
  Batch next_batch(Split split, std::int64_t batch, std::int64_t seq, std::uint64_t step,
                   std::uint64_t seed = 0) const;

 private:
  TextData(std::string bytes, std::string path);
  std::string bytes_;
  std::string path_;
};

/// The text to train on: `path` when given; else the fetched corpus,
/// cached_text_path(), when that file exists; else the slice in the source
/// tree, committed_slice_path().
std::string find_text(const std::optional<std::string>& path);

/// Where tools/fetch_shakespeare.py writes the full corpus:
/// ${XDG_CACHE_HOME:-$HOME/.cache}/dtensor/shakespeare/shakespeare.txt.
std::string cached_text_path();

/// train/data/shakespeare_slice.txt in the source tree this was built
/// from (at most 50 KB of Hamlet).
std::string committed_slice_path();

/// Tokens back to text (each token one byte), e.g. to print a sample.
std::string decode(const std::vector<std::int64_t>& tokens);

}  // namespace dtensor::train
