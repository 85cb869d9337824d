// The GPT trainer's support (train/): the text's split, batches that
// depend on (seed, step) alone with targets one byte ahead of inputs, the
// committed slice, where the text is looked for, the errors' messages, and
// the loss plot's SVG.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <dtensor/core/error.h>

#include "dtensor/train/loss_plot.h"
#include "dtensor/train/text_data.h"

namespace fs = std::filesystem;
using dtensor::train::Split;
using dtensor::train::TextData;

namespace gpt_data_suite {

// Bytes 0..255 over and over, so every token value occurs and no two nearby
// windows are equal.
std::string cycling_bytes(std::size_t n) {
  std::string text;
  for (std::size_t i = 0; i < n; ++i) text.push_back(static_cast<char>((i * 7 + i / 256) % 256));
  return text;
}

// True when what() contains every one of `parts`; shown when it does not.
auto message_has(std::vector<std::string> parts) {
  return [parts](const std::exception& e) {
    const std::string what = e.what();
    for (const auto& part : parts)
      if (what.find(part) == std::string::npos) {
        BOOST_TEST_MESSAGE("message '" << what << "' lacks '" << part << "'");
        return false;
      }
    return true;
  };
}

// A fresh folder under the system's temporary one, removed at scope end.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "test_gpt_data.XXXXXX").string();
    BOOST_REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// Sets an environment variable for one scope, then puts the old value back.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(std::string n, const std::string& value) : name(std::move(n)) {
    if (const char* v = std::getenv(name.c_str())) old = v;
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old)
      ::setenv(name.c_str(), old->c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
};

void write(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Every (batch, seq) window: inputs are a run of the split's bytes and the
// targets the same run one byte later.
void check_windows(const TextData& data, Split split, const dtensor::train::Batch& b) {
  BOOST_REQUIRE_EQUAL(b.inputs.size(), static_cast<std::size_t>(b.batch * b.seq));
  BOOST_REQUIRE_EQUAL(b.targets.size(), b.inputs.size());
  const std::string_view text = data.split_text(split);
  for (std::int64_t row = 0; row < b.batch; ++row) {
    std::vector<std::int64_t> window(b.inputs.begin() + row * b.seq, b.inputs.begin() + (row + 1) * b.seq);
    window.push_back(b.targets[static_cast<std::size_t>((row + 1) * b.seq - 1)]);
    for (std::int64_t t = 0; t + 1 < b.seq; ++t)
      BOOST_CHECK_EQUAL(b.targets[static_cast<std::size_t>(row * b.seq + t)],
                        b.inputs[static_cast<std::size_t>(row * b.seq + t + 1)]);
    for (std::int64_t token : window) BOOST_CHECK(token >= 0 && token < dtensor::train::kVocabSize);
    BOOST_CHECK_MESSAGE(text.find(dtensor::train::decode(window)) != std::string_view::npos,
                        "row " << row << " is not a run of the " << (split == Split::Train ? "train" : "val")
                               << " split");
  }
}

// The numbers of each polyline's points attribute.
std::vector<std::vector<double>> polylines(const std::string& svg) {
  std::vector<std::vector<double>> out;
  const std::regex points_attr("<polyline[^>]* points=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), points_attr); it != std::sregex_iterator(); ++it) {
    std::vector<double> values;
    std::string list = (*it)[1].str();
    for (char& c : list) c = c == ',' ? ' ' : c;
    std::istringstream in(list);
    for (std::string word; in >> word;) values.push_back(std::strtod(word.c_str(), nullptr));
    out.push_back(values);
  }
  return out;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Structure every plot must have, whatever its data.
void check_svg(const std::string& svg) {
  BOOST_CHECK_EQUAL(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  BOOST_CHECK(svg.ends_with("</svg>\n"));
  BOOST_CHECK_EQUAL(count(svg, "<text"), count(svg, "</text>"));
  BOOST_CHECK(svg.find("step</text>") != std::string::npos);
  BOOST_CHECK(svg.find("loss (nats per byte)") != std::string::npos);
  // fmt writes a NaN or infinity as "nan", "inf": none may reach a coordinate.
  BOOST_CHECK(svg.find("nan") == std::string::npos);
  const std::regex non_finite("[ \"=,](-?inf)[ \",]");
  BOOST_CHECK(!std::regex_search(svg, non_finite));
  for (const auto& line : polylines(svg))
    for (double v : line) BOOST_CHECK(std::isfinite(v));
}

BOOST_AUTO_TEST_SUITE(gpt_data)

BOOST_AUTO_TEST_CASE(split_is_first_ninety_percent_by_bytes) {
  for (std::size_t n : {1u, 2u, 7u, 10u, 1000u, 1001u}) {
    const std::string bytes = cycling_bytes(n);
    const TextData data = TextData::from_bytes(bytes, "cycle");
    const auto train = static_cast<std::int64_t>(n * 9 / 10);
    BOOST_CHECK_EQUAL(data.size(), static_cast<std::int64_t>(n));
    BOOST_CHECK_EQUAL(data.split_size(Split::Train), train);
    BOOST_CHECK_EQUAL(data.split_size(Split::Validation), static_cast<std::int64_t>(n) - train);
    BOOST_CHECK(std::string(data.split_text(Split::Train)) + std::string(data.split_text(Split::Validation)) == bytes);
  }
}

BOOST_AUTO_TEST_CASE(batches_depend_on_seed_and_step_alone) {
  const std::string bytes = cycling_bytes(5000);
  // Two loads stand for two ranks: they draw the same batch without talking.
  const TextData rank0 = TextData::from_bytes(bytes, "rank0");
  const TextData rank1 = TextData::from_bytes(bytes, "rank1");
  for (Split split : {Split::Train, Split::Validation}) {
    const dtensor::train::Batch a = rank0.next_batch(split, 4, 16, /*step=*/3, /*seed=*/11);
    check_windows(rank0, split, a);
    const dtensor::train::Batch again = rank1.next_batch(split, 4, 16, 3, 11);
    BOOST_CHECK(a.inputs == again.inputs && a.targets == again.targets);
    BOOST_CHECK(rank0.next_batch(split, 4, 16, 4, 11).inputs != a.inputs);
    BOOST_CHECK(rank0.next_batch(split, 4, 16, 3, 12).inputs != a.inputs);
  }
  // The same step of the two splits draws from different text.
  BOOST_CHECK(rank0.next_batch(Split::Train, 4, 16, 3).inputs != rank0.next_batch(Split::Validation, 4, 16, 3).inputs);
}

BOOST_AUTO_TEST_CASE(draws_are_pinned) {
  // The generator is splitmix64, fixed by its definition: these windows are
  // the same on every platform and standard library. A change here changes
  // every training run's data.
  const TextData data = TextData::from_bytes(cycling_bytes(100000), "cycle");
  const dtensor::train::Batch b = data.next_batch(Split::Train, 3, 2, /*step=*/0, /*seed=*/0);
  BOOST_CHECK(b.inputs == (std::vector<std::int64_t>{7, 14, 202, 209, 182, 189}));
  BOOST_CHECK(b.targets == (std::vector<std::int64_t>{14, 21, 209, 216, 189, 196}));
  // Starts cover the split: over many steps, both ends are reached.
  std::int64_t lowest = std::numeric_limits<std::int64_t>::max(), highest = -1;
  const TextData small = TextData::from_bytes(cycling_bytes(20), "small");  // 18 train bytes
  for (std::uint64_t step = 0; step < 2000; ++step) {
    const dtensor::train::Batch w = small.next_batch(Split::Train, 1, 1, step);
    const auto start = static_cast<std::int64_t>(small.split_text(Split::Train).find(dtensor::train::decode(w.inputs)));
    lowest = std::min(lowest, start);
    highest = std::max(highest, start);
  }
  BOOST_CHECK_EQUAL(lowest, 0);
  BOOST_CHECK_EQUAL(highest, 16);  // the last start whose target fits: 18 - 1 - 1
}

BOOST_AUTO_TEST_CASE(a_window_the_size_of_the_split_fits) {
  const TextData data = TextData::from_bytes(cycling_bytes(100), "cycle");  // 90 + 10
  const dtensor::train::Batch b = data.next_batch(Split::Validation, 2, 9, 5);
  check_windows(data, Split::Validation, b);
  BOOST_CHECK_EQUAL(b.inputs[0], static_cast<unsigned char>(data.split_text(Split::Validation)[0]));
}

BOOST_AUTO_TEST_CASE(committed_slice_loads) {
  const std::string path = dtensor::train::committed_slice_path();
  BOOST_REQUIRE(fs::is_regular_file(path));
  BOOST_CHECK_LE(fs::file_size(path), 50000u);  // the 50 KB
  const TextData data(path);
  BOOST_CHECK(std::string(data.split_text(Split::Train)).starts_with("Hamlet\n"));
  BOOST_CHECK(std::string(data.split_text(Split::Train)).find("BERNARDO:\nWho's there?") != std::string::npos);
  const dtensor::train::Batch b = data.next_batch(Split::Validation, 8, 128, 0);
  check_windows(data, Split::Validation, b);
}

BOOST_AUTO_TEST_CASE(find_text_prefers_the_path_then_the_cache_then_the_slice) {
  TempDir cache;
  const ScopedEnv xdg("XDG_CACHE_HOME", cache.path.string());
  BOOST_CHECK_EQUAL(dtensor::train::find_text("/some/where.txt"), "/some/where.txt");
  BOOST_CHECK_EQUAL(dtensor::train::find_text(std::nullopt), dtensor::train::committed_slice_path());
  const fs::path cached = cache.path / "dtensor" / "shakespeare" / "shakespeare.txt";
  BOOST_CHECK_EQUAL(dtensor::train::cached_text_path(), cached.string());
  fs::create_directories(cached.parent_path());
  write(cached, "To be, or not to be\n");
  BOOST_CHECK_EQUAL(dtensor::train::find_text(std::nullopt), cached.string());
}

BOOST_AUTO_TEST_CASE(errors_name_the_path_and_sizes) {
  TempDir dir;
  const std::string missing = (dir.path / "no_such.txt").string();
  BOOST_CHECK_EXCEPTION(TextData{missing}, dtensor::ValueError, message_has({"[text_data]", missing}));
  const std::string empty = (dir.path / "empty.txt").string();
  write(empty, "");
  BOOST_CHECK_EXCEPTION(TextData{empty}, dtensor::ValueError, message_has({empty, "empty"}));

  const std::string short_file = (dir.path / "short.txt").string();
  write(short_file, cycling_bytes(100));  // 90 train bytes, 10 validation
  const TextData data(short_file);
  BOOST_CHECK_EXCEPTION(data.next_batch(Split::Validation, 1, 10, 0), dtensor::ValueError,
                        message_has({short_file, "validation", "10 bytes", "of 100", "seq + 1 = 11"}));
  BOOST_CHECK_EXCEPTION(data.next_batch(Split::Train, 1, 90, 0), dtensor::ValueError,
                        message_has({short_file, "train", "90 bytes", "seq + 1 = 91"}));
  BOOST_CHECK_EXCEPTION(data.next_batch(Split::Train, 0, 4, 0), dtensor::ValueError, message_has({"batch=0"}));
  BOOST_CHECK_EXCEPTION(data.next_batch(Split::Train, 2, 0, 0), dtensor::ValueError, message_has({"seq=0"}));
}

BOOST_AUTO_TEST_CASE(loss_plot_draws_both_series) {
  std::vector<double> train;
  for (int i = 0; i < 300; ++i) train.push_back(5.5 - 4.0 * i / 300.0);
  train[7] = std::numeric_limits<double>::quiet_NaN();
  train[8] = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<std::int64_t, double>> val = {{0, 5.6}, {100, 3.0}, {200, -std::numeric_limits<double>::infinity()}, {299, 1.8}};
  const std::string title = "layers=2 d_model=64 <mesh 2x2> & seed=0";
  const std::string svg = dtensor::train::loss_svg(title, train, val);
  check_svg(svg);
  BOOST_CHECK(svg.find("layers=2 d_model=64 &lt;mesh 2x2&gt; &amp; seed=0") != std::string::npos);
  const auto lines = polylines(svg);
  BOOST_REQUIRE_EQUAL(lines.size(), 2u);
  BOOST_CHECK_EQUAL(lines[0].size(), 2u * 298);  // x, y of each finite training loss
  BOOST_CHECK_EQUAL(lines[1].size(), 2u * 3);
  BOOST_CHECK(svg.find("train (298 steps), 2 NaN/inf skipped") != std::string::npos);
  BOOST_CHECK(svg.find("validation (3 points), 1 NaN/inf skipped") != std::string::npos);
  // Round ticks: the loss axis runs 1 to 6 in steps of 1 here.
  for (const char* tick : {">1</text>", ">6</text>", ">0</text>", ">300</text>"})
    BOOST_CHECK_MESSAGE(svg.find(tick) != std::string::npos, "no tick label " << tick);
}

BOOST_AUTO_TEST_CASE(loss_plot_edge_cases) {
  check_svg(dtensor::train::loss_svg("one point", {3.0}, {}));
  BOOST_CHECK_EQUAL(polylines(dtensor::train::loss_svg("one point", {3.0}, {})).size(), 1u);
  check_svg(dtensor::train::loss_svg("flat", {2.0, 2.0, 2.0}, {{1, 2.0}}));
  check_svg(dtensor::train::loss_svg("nothing", {}, {}));
  check_svg(dtensor::train::loss_svg("all bad", {std::nan(""), std::numeric_limits<double>::infinity()}, {}));
  const std::string long_title(400, 'x');
  const std::string wrapped = dtensor::train::loss_svg(long_title + " " + long_title, {1.0, 0.5}, {});
  check_svg(wrapped);
  BOOST_CHECK_EQUAL(count(wrapped, "<tspan"), 2u);  // one over-long word per line
}

BOOST_AUTO_TEST_CASE(write_loss_svg_names_a_bad_path) {
  TempDir dir;
  const std::string good = (dir.path / "loss.svg").string();
  dtensor::train::write_loss_svg(good, "t", {2.0, 1.0}, {{1, 1.5}});
  std::ifstream in(good);
  const std::string written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  BOOST_CHECK(written == dtensor::train::loss_svg("t", {2.0, 1.0}, {{1, 1.5}}));
  const std::string bad = (dir.path / "no_dir" / "loss.svg").string();
  BOOST_CHECK_EXCEPTION(dtensor::train::write_loss_svg(bad, "t", {1.0}, {}), dtensor::ValueError, message_has({bad}));
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace gpt_data_suite
