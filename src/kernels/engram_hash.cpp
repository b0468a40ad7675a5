#include "kernels/engram_hash.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace deepinfer {
namespace {

// --- SeedSequence constants (numpy bit_generator.pyx) ---
constexpr uint32_t kInitA = 0x43b0d7e5u;
constexpr uint32_t kMultA = 0x931e8875u;
constexpr uint32_t kInitB = 0x8b51f9ddu;
constexpr uint32_t kMultB = 0x58f38dedu;
constexpr uint32_t kMixL = 0xca01f9ddu;
constexpr uint32_t kMixR = 0x4973f715u;
constexpr int kXShift = 16;

// The running constant advances on every call, so its order of use matters (the pool's hashing
// multiplies it by kMultA, generate_state by kMultB).
uint32_t hashmix(uint32_t v, uint32_t* hc, uint32_t mult = kMultA) {
  v ^= *hc;
  *hc *= mult;
  v *= *hc;
  return v ^ (v >> kXShift);
}

uint32_t mix(uint32_t x, uint32_t y) {
  const uint32_t t = kMixL * x - kMixR * y;
  return t ^ (t >> kXShift);
}

// PCG 128-bit LCG multiplier.
constexpr u128 kPcgMult = (u128(0x2360ED051FC65DA4ull) << 64) | 0x4385DF649FCCF645ull;

// Lemire's method for a range rng + 1 with 0 < rng < 2^bits - 1, on draws next() of U's width
// (W twice as wide); the threshold (2^bits mod e) is only computed when the cheap test lo < e says
// a rejection is possible.
template <typename U, typename W, typename Next>
U bounded_lemire(U rng, Next next) {
  const U e = rng + 1;
  W m = W(next()) * e;
  U lo = U(m);
  if (lo < e) {
    const U thr = U(~U(0) - rng) % e;
    while (lo < thr) {
      m = W(next()) * e;
      lo = U(m);
    }
  }
  return U(m >> (8 * sizeof(U)));
}

// --- Engram ---

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
// Beyond this many hash columns over all layers a config is surely corrupt, not a model.
constexpr int64_t kMaxTotalCols = int64_t(1) << 20;

uint64_t mulmod(uint64_t a, uint64_t b, uint64_t m) {
  return uint64_t(u128(a) * b % m);
}

uint64_t powmod(uint64_t b, uint64_t e, uint64_t m) {
  uint64_t r = 1 % m;
  b %= m;
  for (; e != 0; e >>= 1) {
    if (e & 1) r = mulmod(r, b, m);
    b = mulmod(b, b, m);
  }
  return r;
}

// The smallest prime above `after`; throws when it would not fit an int64.
int64_t next_prime(int64_t after) {
  for (int64_t c = after;;) {
    DI_REQUIRE(c < kInt64Max, "engram_vocab_size: the hash primes exceed the int64 range");
    ++c;
    if (is_prime_u64(uint64_t(c))) return c;
  }
}

void check_id(int64_t id, int64_t vc, const char* what, int64_t index) {
  DI_REQUIRE(id == kEngramDead || (id >= 0 && id < vc), "Engram hash: ", what, "[", index,
             "] = ", id, " must be a compressed token id in [0, ", vc, ") or ", kEngramDead,
             " (DEAD)");
}

// Multipliers of the layer with model layer id `layer_id`: mu[i] = 2 * v_i + 1 where v =
// numpy default_rng(10007 * layer_id).integers(0, bound, size=mu.size(), dtype=int64) and
// bound = max(1, ((2^63 - 1) / V_c) / 2).
void engram_multipliers(int64_t layer_id, int64_t compressed_vocab_size, std::span<int64_t> mu) {
  DI_REQUIRE(layer_id >= 0, "engram_layer_ids: layer id ", layer_id, " must be >= 0");
  // Halving the bound keeps 2 * v + 1 < (2^63 - 1) / V_c, so id * mu cannot overflow.
  const int64_t bound = std::max<int64_t>(1, kInt64Max / compressed_vocab_size / 2);
  Pcg64 gen{seed_words(u128(10007) * uint64_t(layer_id))};
  random_integers_int64(gen, 0, bound, mu);
  for (int64_t& m : mu) m = 2 * m + 1;
}

}  // namespace

std::vector<uint32_t> seed_words(u128 seed) {
  std::vector<uint32_t> words;
  do {
    words.push_back(uint32_t(seed));
    seed >>= 32;
  } while (seed != 0);
  return words;
}

// --- SeedSequence ---

void seed_sequence_state(std::span<const uint32_t> entropy, std::span<uint32_t> out) {
  DI_REQUIRE(!entropy.empty(), "SeedSequence: the seed must have at least one 32-bit word");
  // The entropy hashed into a pool of 4 words, which the state words are hashed from.
  constexpr int kPoolSize = 4;
  uint32_t pool[kPoolSize];
  uint32_t hc = kInitA;
  for (int i = 0; i < kPoolSize; ++i)
    pool[i] = hashmix(size_t(i) < entropy.size() ? entropy[i] : 0u, &hc);
  for (int src = 0; src < kPoolSize; ++src)
    for (int dst = 0; dst < kPoolSize; ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], &hc));
  for (size_t src = kPoolSize; src < entropy.size(); ++src)
    for (int dst = 0; dst < kPoolSize; ++dst)
      pool[dst] = mix(pool[dst], hashmix(entropy[src], &hc));
  hc = kInitB;
  for (size_t i = 0; i < out.size(); ++i) out[i] = hashmix(pool[i % kPoolSize], &hc, kMultB);
}

// --- PCG64 ---

Pcg64::Pcg64(std::span<const uint32_t> seed) {
  uint32_t w[8];  // generated as one run, so that the running constant carries across words
  seed_sequence_state(seed, w);
  auto u64 = [&](int k) { return uint64_t(w[2 * k]) | (uint64_t(w[2 * k + 1]) << 32); };
  // pcg64_srandom(initstate = words 0 and 1, initseq = words 2 and 3), from state 0.
  inc_ = (((u128(u64(2)) << 64) | u64(3)) << 1) | 1u;
  step();
  state_ += (u128(u64(0)) << 64) | u64(1);
  step();
}

void Pcg64::step() {
  state_ = state_ * kPcgMult + inc_;
}

uint64_t Pcg64::next64() {
  step();
  const uint64_t x = uint64_t(state_ >> 64) ^ uint64_t(state_);
  const unsigned rot = unsigned(state_ >> 122);
  return (x >> rot) | (x << ((64 - rot) & 63));
}

uint32_t Pcg64::next32() {
  if (has_high_) {
    has_high_ = false;
    return high_;
  }
  const uint64_t v = next64();
  has_high_ = true;
  high_ = uint32_t(v >> 32);
  return uint32_t(v);
}

// --- bounded integers ---

void random_integers_int64(Pcg64& gen, int64_t low, int64_t high, std::span<int64_t> out) {
  DI_REQUIRE(low < high, "integers: low (", low, ") must be below high (", high, ")");
  // Closed range [low, high - 1] as an unsigned width, the way numpy reduces it.
  const uint64_t rng = uint64_t(high - 1) - uint64_t(low);
  auto draw = [&]() -> uint64_t {
    if (rng == 0) return 0;
    if (rng == UINT32_MAX) return gen.next32();
    if (rng < UINT32_MAX)
      return bounded_lemire<uint32_t, uint64_t>(uint32_t(rng), [&] { return gen.next32(); });
    // rng <= 2^64 - 2 for an exclusive int64 range, so Lemire always applies.
    return bounded_lemire<uint64_t, u128>(rng, [&] { return gen.next64(); });
  };
  for (int64_t& v : out) v = int64_t(uint64_t(low) + draw());
}

// --- Engram ---

bool is_prime_u64(uint64_t n) {
  constexpr uint64_t kBases[] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37};
  if (n < 2) return false;
  for (uint64_t p : kBases)
    if (n % p == 0) return n == p;
  // Miller-Rabin with the first 12 prime bases has no strong pseudoprime below 3.3e24, so it
  // is exact on the whole 64-bit range.
  const int s = __builtin_ctzll(n - 1);  // n - 1 = d · 2^s, d odd
  const uint64_t d = (n - 1) >> s;
  for (uint64_t a : kBases) {
    uint64_t x = powmod(a, d, n);
    if (x == 1) continue;
    // a is a witness unless one of x, x^2, .. x^(2^(s-1)) is n - 1.
    for (int i = 1; i < s && x != n - 1; ++i) x = mulmod(x, x, n);
    if (x != n - 1) return false;
  }
  return true;
}

EngramTables make_engram_tables(std::span<const int64_t> layer_ids, int64_t max_ngram_size,
                                int64_t n_heads, int64_t vocab_size,
                                int64_t compressed_vocab_size) {
  DI_REQUIRE(max_ngram_size >= 2, "engram_max_ngram_size = ", max_ngram_size, " must be >= 2");
  DI_REQUIRE(n_heads >= 1, "engram_n_heads = ", n_heads, " must be >= 1");
  DI_REQUIRE(vocab_size >= 0, "engram_vocab_size = ", vocab_size, " must be >= 0");
  DI_REQUIRE(compressed_vocab_size >= 1, "engram_compressed_vocab_size = ", compressed_vocab_size,
             " must be >= 1");
  DI_REQUIRE(max_ngram_size <= kMaxTotalCols && n_heads <= kMaxTotalCols &&
                 u128(max_ngram_size - 1) * uint64_t(n_heads) * layer_ids.size() <= kMaxTotalCols,
             "engram_max_ngram_size = ", max_ngram_size, ", engram_n_heads = ", n_heads, " and ",
             layer_ids.size(), " Engram layers give more than ", kMaxTotalCols, " hash columns");

  EngramTables t;
  t.n_layers = int(layer_ids.size());
  t.ngram_max = int(max_ngram_size);
  t.n_heads = int(n_heads);
  t.n_cols = int((max_ngram_size - 1) * n_heads);
  t.compressed_vocab = compressed_vocab_size;
  t.layer_ids.assign(layer_ids.begin(), layer_ids.end());
  t.multipliers.resize(size_t(t.n_layers) * t.ngram_max);
  t.primes.resize(size_t(t.n_layers) * t.n_cols);
  t.offsets.resize(t.primes.size());
  t.rows.resize(t.n_layers);

  // The reference restarts the search at the vocab size for each (layer, n-gram size) but never
  // uses a prime twice, so in (z, g, h) order the primes are the consecutive primes >= vocab_size.
  int64_t current = vocab_size - 1;
  for (int z = 0; z < t.n_layers; ++z) {
    engram_multipliers(
        layer_ids[z], compressed_vocab_size,
        std::span<int64_t>(t.multipliers).subspan(size_t(z) * t.ngram_max, t.ngram_max));
    int64_t* primes = &t.primes[size_t(z) * t.n_cols];    // [NC]
    int64_t* offsets = &t.offsets[size_t(z) * t.n_cols];  // [NC]
    int64_t sum = 0;
    for (int c = 0; c < t.n_cols; ++c) {
      primes[c] = current = next_prime(current);
      offsets[c] = sum;
      DI_REQUIRE(primes[c] <= kInt64Max - sum, "engram_vocab_size = ", vocab_size,
                 ": the rows of Engram layer ", layer_ids[z], " exceed the int64 range");
      sum += primes[c];
    }
    t.rows[z] = sum;
  }
  return t;
}

void check_engram_num_embeddings(const EngramTables& tables,
                                 std::span<const int64_t> num_embeddings) {
  DI_REQUIRE(num_embeddings.size() == size_t(tables.n_layers), "engram_num_embeddings has ",
             num_embeddings.size(), " entries, expected one per Engram layer (", tables.n_layers,
             ")");
  for (int z = 0; z < tables.n_layers; ++z)
    DI_REQUIRE(num_embeddings[z] >= tables.rows[z], "engram_num_embeddings[", z,
               "] = ", num_embeddings[z], " is below the ", tables.rows[z],
               " rows that the hash primes of Engram layer ", tables.layer_ids[z], " address");
}

void engram_hash_ids(const EngramTables& t, std::span<const int64_t> chunk,
                     std::span<const int64_t> history, int64_t start, int64_t pad,
                     std::span<int64_t> ids) {
  const int64_t n_chunk = int64_t(chunk.size());
  const int64_t n_hist = int64_t(history.size());
  const int ng = t.ngram_max;
  const int nc = t.n_cols;
  DI_REQUIRE(start >= 0, "Engram hash: chunk start position ", start, " must be >= 0");
  DI_REQUIRE(n_hist == std::min<int64_t>(start, ng - 1), "Engram hash: the token history has ",
             n_hist, " ids, expected ", std::min<int64_t>(start, ng - 1), " for a chunk at ",
             start);
  DI_REQUIRE(int64_t(ids.size()) == n_chunk * t.n_layers * nc, "Engram hash: output holds ",
             ids.size(), " ids, expected [", n_chunk, ", ", t.n_layers, ", ", nc, "]");
  DI_REQUIRE(pad >= 0 && pad < t.compressed_vocab, "Engram hash: pad id ", pad, " must be in [0, ",
             t.compressed_vocab, ")");
  for (int64_t i = 0; i < n_hist; ++i) check_id(history[i], t.compressed_vocab, "history", i);
  for (int64_t i = 0; i < n_chunk; ++i) check_id(chunk[i], t.compressed_vocab, "chunk", i);

  for (int64_t p = 0; p < n_chunk; ++p) {
    for (int z = 0; z < t.n_layers; ++z) {
      const int64_t* mu = &t.multipliers[size_t(z) * ng];      // [Ng]
      const int64_t* primes = &t.primes[size_t(z) * nc];       // [NC]
      const int64_t* offsets = &t.offsets[size_t(z) * nc];     // [NC]
      int64_t* out = &ids[(size_t(p) * t.n_layers + z) * nc];  // [NC]
      bool blocked = false;
      int64_t rho = 0;
      for (int shift = 0; shift < ng; ++shift) {
        // q < 0 reads the history; below -n_hist lies before position 0.
        const int64_t q = p - shift;
        const int64_t* id = q >= 0 ? &chunk[q] : -q <= n_hist ? &history[n_hist + q] : nullptr;
        blocked = blocked || !id || *id == kEngramDead;
        rho ^= (blocked ? pad : *id) * mu[shift];
        if (shift == 0) continue;
        const int col0 = (shift - 1) * t.n_heads;
        for (int h = 0; h < t.n_heads; ++h)
          out[col0 + h] = rho % primes[col0 + h] + offsets[col0 + h];
      }
    }
  }
}

int64_t engram_update_history(const EngramTables& t, std::span<int64_t> history, int64_t n_history,
                              std::span<const int64_t> chunk) {
  const int64_t cap = t.ngram_max - 1;
  DI_REQUIRE(int64_t(history.size()) >= cap, "Engram history: buffer of ", history.size(),
             " ids, expected at least ", cap);
  DI_REQUIRE(n_history >= 0 && n_history <= cap, "Engram history: count ", n_history,
             " must be in [0, ", cap, "]");
  const int64_t n_chunk = int64_t(chunk.size());
  const int64_t n_new = std::min(n_history + n_chunk, cap);
  const int64_t from_chunk = std::min(n_chunk, n_new);
  const int64_t keep = n_new - from_chunk;  // old ids that stay, moved to the front
  if (n_history > keep)
    std::copy(history.begin() + (n_history - keep), history.begin() + n_history, history.begin());
  std::copy(chunk.end() - from_chunk, chunk.end(), history.begin() + keep);
  return n_new;
}

}  // namespace deepinfer
