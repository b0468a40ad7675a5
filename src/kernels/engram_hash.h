// Engram n-gram hashing: the per-layer hash tables (multipliers, primes, row offsets) derived
// from config values, and the hash ids of a chunk of positions.
//
// Terms: L_E Engram layers (z = index in engram_layer_ids), Ng = engram_max_ngram_size (n-grams
// of size 2..Ng), Hh = engram_n_heads, NC = (Ng - 1) * Hh hash columns, column = g * Hh + h for
// n-gram size g + 2 and head h. Ids are compressed token ids in [0, V_c); kEngramDead marks a
// token that blocks every n-gram reaching it (image spans).
//
// For position p and shift i = 0..Ng-1 the token is tau_i = id(p - i), or the pad id once any
// of p - 0 .. p - i is before position 0 or DEAD. With pi_i = tau_i * mu[z][i] and the rolling
// XOR rho_g = pi_0 ^ ... ^ pi_{g+1}:
//   id[z][g * Hh + h] = rho_g mod P[z][g][h] + off[z][g * Hh + h]
// which is a row of layer z's table (the concatenation of its NC prime-sized buckets).
//
// The multipliers come from a bit-exact port of the part of numpy's random module that Engram
// needs (below).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace deepinfer {

constexpr int64_t kEngramDead = -1;

// Everything the hash needs, fixed by the config. Built once per model.
struct EngramTables {
  int n_layers = 0;                  // L_E
  int ngram_max = 0;                 // Ng
  int n_heads = 0;                   // Hh
  int n_cols = 0;                    // NC = (Ng - 1) * Hh
  int64_t compressed_vocab = 0;      // V_c; valid ids are [0, V_c)
  std::vector<int64_t> layer_ids;    // [L_E] model layer ids, in config order
  std::vector<int64_t> multipliers;  // [L_E, Ng] odd; id * mu < 2^63 for every id < V_c
  std::vector<int64_t> primes;       // [L_E, NC] bucket sizes
  std::vector<int64_t> offsets;      // [L_E, NC] first row of each bucket (prefix sums)
  std::vector<int64_t> rows;         // [L_E] rows the layer's table needs (sum of its primes)
};

// Builds the tables from engram_layer_ids, engram_max_ngram_size, engram_n_heads,
// engram_vocab_size and engram_compressed_vocab_size. Throws deepinfer::Error naming the field
// when a value is out of range.
EngramTables make_engram_tables(std::span<const int64_t> layer_ids, int64_t max_ngram_size,
                                int64_t n_heads, int64_t vocab_size, int64_t compressed_vocab_size);

// Deterministic primality test, exact for every 64-bit value.
bool is_prime_u64(uint64_t n);

// Throws unless engram_num_embeddings[z] >= tables.rows[z] for every Engram layer (and the list
// has one entry per layer).
void check_engram_num_embeddings(const EngramTables& tables,
                                 std::span<const int64_t> num_embeddings);

// Hash ids of the chunk of positions [start, start + T).
//   chunk:   [T] compressed ids of the chunk, or kEngramDead
//   history: [min(start, Ng - 1)] compressed ids of positions [start - history.size(), start)
//   pad:     compressed id of the padding token
//   ids:     [T, L_E, NC] output, every entry in [0, tables.rows[z])
// Throws deepinfer::Error on an id outside [0, V_c) (other than DEAD), a history of the wrong
// length or an output of the wrong size. Allocates nothing.
void engram_hash_ids(const EngramTables& tables, std::span<const int64_t> chunk,
                     std::span<const int64_t> history, int64_t start, int64_t pad,
                     std::span<int64_t> ids);

// Appends a processed chunk to the token history, keeping the last Ng - 1 ids.
//   history: buffer of at least Ng - 1 entries whose first `n_history` hold the ids before the
//            chunk, oldest first
// Returns the new count, min(n_history + chunk.size(), Ng - 1); the ids are again at the front.
int64_t engram_update_history(const EngramTables& tables, std::span<int64_t> history,
                              int64_t n_history, std::span<const int64_t> chunk);

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
