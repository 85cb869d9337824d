// The tiled transpose of transpose_plane.h, as templates over the vector
// width. No include guard: transpose_plane.cpp includes it once per SIMD
// target inside that target's namespace, transpose_plane_fallback.cpp once.
// The includer defines, before including, a RowStore type whose call
// (from, to, bytes) writes one tile row of the destination.

// The edge of a square tile, in bytes of a row: two cache lines on each
// side. Tiles go a row of tiles at a time (one tile's height of source rows,
// read along their whole length), which keeps the source's few streams
// sequential for the hardware prefetcher while the destination is streamed
// out. Measured on transposes of 4096x1024 f32, bf16 and 2048x1024 f64 on an
// AVX-512 Xeon, one run alternating with the strips of 256 rows used before:
// f32 1.0-1.2 of memcpy against 0.6-1.0 (memcpy does not stream at 16 MiB),
// bf16 0.4-0.7 against 0.4-0.6, f64 1.2-1.3 against 0.8-0.9; strips of 2
// and 4 tiles were in between.
constexpr std::int64_t kTileBytes = 128;

// A block of kLanes x kLanes elements transposed in registers: one vector of
// VB bytes per row, log2(kLanes) rounds of interleaving (each round pairs row
// i with row i + kLanes/2). GCC's generic vectors lower each interleave to
// the target's shuffles (unpck on SSE2, vpermt2 on AVX-512), so one source
// serves every width; at 64 bytes a block is 16x16 f32, four times the work
// per shuffle of 16-byte vectors, which is what makes the copy keep up with
// memory rather than with the shuffles.
template <class T, int VB>
struct Block {
  static constexpr int kLanes = VB / static_cast<int>(sizeof(T));
  typedef T Vec __attribute__((vector_size(VB)));

  template <int... J>
  static Vec interleave_low(Vec x, Vec y, std::integer_sequence<int, J...>) {
    return __builtin_shufflevector(x, y, (J % 2 ? kLanes + J / 2 : J / 2)...);
  }
  template <int... J>
  static Vec interleave_high(Vec x, Vec y, std::integer_sequence<int, J...>) {
    return __builtin_shufflevector(x, y, (J % 2 ? kLanes + kLanes / 2 + J / 2 : kLanes / 2 + J / 2)...);
  }

  // d[i * ds + j] = s[j * ss + i] for i, j < kLanes.
  static void transpose(const T* s, std::int64_t ss, T* d, std::int64_t ds) {
    Vec row[kLanes], next[kLanes];
    for (int j = 0; j < kLanes; ++j) std::memcpy(&row[j], s + j * ss, sizeof(Vec));
    constexpr auto lanes = std::make_integer_sequence<int, kLanes>{};
    for (int round = 1; round < kLanes; round *= 2) {
      for (int i = 0; i < kLanes / 2; ++i) {
        next[2 * i] = interleave_low(row[i], row[i + kLanes / 2], lanes);
        next[2 * i + 1] = interleave_high(row[i], row[i + kLanes / 2], lanes);
      }
      std::memcpy(row, next, sizeof(row));
    }
    for (int i = 0; i < kLanes; ++i) std::memcpy(d + i * ds, &row[i], sizeof(Vec));
  }
};

// A full tile through a buffer on the stack: each source row is read whole
// and each destination row written whole, so the tile's rows, whose
// power-of-two strides map them to one cache set, are never evicted half
// used, and a streamed destination row fills whole lines.
template <class T, int VB>
void full_tile(const T* s, std::int64_t sb, T* d, std::int64_t da, const RowStore& store) {
  constexpr std::int64_t kEdge = kTileBytes / static_cast<std::int64_t>(sizeof(T)), kLanes = Block<T, VB>::kLanes;
  static_assert(kEdge % kLanes == 0);
  alignas(64) T tile[kEdge * kEdge];
  for (std::int64_t b = 0; b < kEdge; b += kLanes)
    for (std::int64_t a = 0; a < kEdge; a += kLanes)
      Block<T, VB>::transpose(s + a + b * sb, sb, tile + a * kEdge + b, kEdge);
  for (std::int64_t a = 0; a < kEdge; ++a) store(tile + a * kEdge, d + a * da, kTileBytes);
}

// The plane tile by tile, a row of tiles (along a) for each kEdge of b;
// ragged edge tiles element by element.
template <class T, int VB>
void transpose_plane_t(const T* s, std::int64_t sb, T* d, std::int64_t da, std::int64_t na, std::int64_t nb,
                       const RowStore& store) {
  constexpr std::int64_t kEdge = kTileBytes / static_cast<std::int64_t>(sizeof(T));
  for (std::int64_t b0 = 0; b0 < nb; b0 += kEdge) {
    const std::int64_t tb = std::min(kEdge, nb - b0);
    for (std::int64_t a0 = 0; a0 < na; a0 += kEdge) {
      const std::int64_t ta = std::min(kEdge, na - a0);
      const T* st = s + a0 + b0 * sb;
      T* dt = d + a0 * da + b0;
      if (ta == kEdge && tb == kEdge) {
        full_tile<T, VB>(st, sb, dt, da, store);
        continue;
      }
      for (std::int64_t i = 0; i < ta; ++i)
        for (std::int64_t j = 0; j < tb; ++j) dt[i * da + j] = st[j * sb + i];
    }
  }
}

template <int VB>
void transpose_plane_bytes(const std::byte* s, std::int64_t sb, std::byte* d, std::int64_t da, std::int64_t na,
                           std::int64_t nb, std::size_t itemsize, const RowStore& store) {
  switch (itemsize) {
    case 1:
      return transpose_plane_t<std::uint8_t, VB>(reinterpret_cast<const std::uint8_t*>(s), sb,
                                                 reinterpret_cast<std::uint8_t*>(d), da, na, nb, store);
    case 2:
      return transpose_plane_t<std::uint16_t, VB>(reinterpret_cast<const std::uint16_t*>(s), sb,
                                                  reinterpret_cast<std::uint16_t*>(d), da, na, nb, store);
    case 4:
      return transpose_plane_t<std::uint32_t, VB>(reinterpret_cast<const std::uint32_t*>(s), sb,
                                                  reinterpret_cast<std::uint32_t*>(d), da, na, nb, store);
    default:
      return transpose_plane_t<std::uint64_t, VB>(reinterpret_cast<const std::uint64_t*>(s), sb,
                                                  reinterpret_cast<std::uint64_t*>(d), da, na, nb, store);
  }
}
