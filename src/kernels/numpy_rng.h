// A bit-exact port of the part of numpy's random module that Engram needs:
// `numpy.random.default_rng(seed).integers(low, high, size=n, dtype=np.int64)`.
//
// Three stages, each reproducing numpy (stable since numpy 1.17, checked against 1.24):
//   SeedSequence  seed words -> 4-word hashed pool -> any number of state words
//   Pcg64         PCG XSL-RR 128/64, seeded from 4 SeedSequence u64 words; next32 serves the
//                 low then the high half of one 64-bit draw
//   integers      numpy's bounded draw: Lemire's multiply-and-reject on 64 bits, or on 32 bits
//                 (fed by next32) when the range fits in 32 bits
// All arithmetic is unsigned and wraps (words mod 2^32, PCG state mod 2^128).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace deepinfer {

using u128 = unsigned __int128;

// Little-endian 32-bit words of a non-negative seed, as numpy splits an int seed: 0 -> {0}.
std::vector<uint32_t> seed_words(u128 seed);

// SeedSequence(entropy).generate_state(out.size(), np.uint32), `entropy` being the seed as
// little-endian 32-bit words (at least one; no spawn key). np.uint64 takes the words in pairs,
// low word first.
void seed_sequence_state(std::span<const uint32_t> entropy, std::span<uint32_t> out);

class Pcg64 {
 public:
  // What numpy's PCG64(SeedSequence(seed)) does, `seed` given as its little-endian 32-bit words:
  // 4 u64 state words as (initstate hi, lo, initseq hi, lo), then
  // pcg64_srandom(initstate, initseq).
  explicit Pcg64(std::span<const uint32_t> seed);

  uint64_t next64();
  // Low half of a fresh next64 first; its high half is kept for the following call.
  uint32_t next32();

 private:
  void step();

  u128 state_ = 0;
  u128 inc_ = 0;
  bool has_high_ = false;  // a buffered high half is pending for next32
  uint32_t high_ = 0;
};

// Generator.integers(low, high, size=out.size(), dtype=np.int64), high exclusive. Draws from
// `gen` exactly as numpy does, so consecutive calls continue one stream. Throws deepinfer::Error
// when low >= high.
void random_integers_int64(Pcg64& gen, int64_t low, int64_t high, std::span<int64_t> out);

}  // namespace deepinfer
