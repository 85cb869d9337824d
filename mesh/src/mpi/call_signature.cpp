#include "call_signature.h"

#include <fmt/format.h>

#include "threads/threads_group.h"

namespace dtensor::mpi_detail {
namespace {

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// One transfer of `bytes` from rank `from` to rank `to`.
std::uint64_t transfer(int from, int to, std::size_t bytes) {
  return mix(mix((static_cast<std::uint64_t>(from) << 32) ^ static_cast<std::uint32_t>(to)) + bytes);
}

threads_detail::Descriptor descriptor(std::span<const std::uint64_t> sig, const std::size_t* sizes, int n) {
  threads_detail::Descriptor d;
  d.kind = static_cast<CollectiveKind>(sig[kKind]);
  if (sig[kDType] != kNone) d.dtype = static_cast<DType>(sig[kDType]);
  if (sig[kOp] != kNone) d.op = static_cast<ReduceOp>(sig[kOp]);
  if (sig[kRoot] != kNone) d.root = static_cast<int>(sig[kRoot]);
  d.count = sig[kCount];
  d.v0 = sizes;
  d.v1 = sizes + n;
  return d;
}

}  // namespace

Signature make_signature(CollectiveKind kind) {
  Signature s;
  s.fill(kNone);
  s[kKind] = static_cast<std::uint64_t>(kind);
  s[kBalance] = 0;
  s[kRegular] = 1;
  return s;
}

Signature make_signature(CollectiveKind kind, DType dtype, ReduceOp op) {
  Signature s = make_signature(kind);
  s[kDType] = static_cast<std::uint64_t>(dtype);
  s[kOp] = static_cast<std::uint64_t>(op);
  return s;
}

std::uint64_t sizes_hash(std::span<const std::size_t> sizes) {
  std::uint64_t h = mix(sizes.size());
  for (std::size_t v : sizes) h = mix(h ^ v);
  return h;
}

std::uint64_t all_to_all_balance(int rank, std::span<const std::size_t> send_bytes,
                                 std::span<const std::size_t> recv_bytes) {
  std::uint64_t b = 0;  // wraps: only the sum over the group matters
  for (std::size_t p = 0; p < send_bytes.size(); ++p) b += transfer(rank, static_cast<int>(p), send_bytes[p]);
  for (std::size_t p = 0; p < recv_bytes.size(); ++p) b -= transfer(static_cast<int>(p), rank, recv_bytes[p]);
  return b;
}

bool signatures_agree(std::span<const std::uint64_t> signatures, int n) {
  std::uint64_t balance = 0;
  for (int p = 0; p < n; ++p) {
    const auto s = signatures.subspan(static_cast<std::size_t>(p) * kSignatureWords, kSignatureWords);
    for (std::size_t w = 0; w < kCompared; ++w)
      if (s[w] != signatures[w]) return false;
    balance += s[kBalance];
  }
  return balance == 0;
}

std::string mismatch_message(std::span<const std::uint64_t> signatures, std::span<const std::size_t> sizes, int n,
                             int seen_on) {
  const auto un = static_cast<std::size_t>(n);
  auto sig = [&](int p) { return signatures.subspan(static_cast<std::size_t>(p) * kSignatureWords, kSignatureWords); };
  auto list = [&](int p) { return sizes.data() + static_cast<std::size_t>(p) * 2 * un; };
  auto mismatch = [&](int a, int b, const std::string& why) {
    return fmt::format(
        "[mpi] collective mismatch in a group of {} (seen on rank {}): rank {} called {} but rank {} called {}{}", n,
        seen_on, a, threads_detail::describe(descriptor(sig(a), list(a), n), n), b,
        threads_detail::describe(descriptor(sig(b), list(b), n), n), why);
  };
  for (int p = 1; p < n; ++p) {
    const auto s = sig(p);
    for (std::size_t w = 0; w < kCompared; ++w) {
      if (s[w] == signatures[w]) continue;
      if (w == kSeq)
        return mismatch(0, p,
                        fmt::format(" (as call {} on the communicator on rank 0 but call {} on rank {})",
                                    signatures[kSeq], s[kSeq], p));
      return mismatch(0, p, "");
    }
  }
  // Every signature is the same all_to_all: find the transfer the two ends
  // disagree on.
  for (int p = 0; p < n; ++p)
    for (int q = 0; q < n; ++q) {
      const std::size_t sent = list(p)[q], expected = list(q)[un + static_cast<std::size_t>(p)];
      if (sent != expected)
        return mismatch(p, q,
                        fmt::format(" (rank {} sends {} bytes to rank {}, which expects {})", p, sent, q, expected));
    }
  return mismatch(0, 0, " (the signatures differ, but no field does: report this as a bug)");
}

}  // namespace dtensor::mpi_detail
