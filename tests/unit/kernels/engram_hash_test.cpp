// Engram hashing and the numpy RNG port behind its multipliers. Expected values come from the
// spec's Appendix A (checked there against numpy and an independent re-implementation) and from
// fixtures written by numpy itself (tests/data/engram/gen_fixtures.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/engram_hash.h"

namespace deepinfer {
namespace {

using I64 = std::vector<int64_t>;

std::string fixture_path(const char* name) {
  return std::string(DEEPINFER_SOURCE_DIR) + "/tests/data/engram/" + name;
}

// Little-endian 32-bit words of a decimal number of any size (words = words * 10 + digit).
std::vector<uint32_t> decimal_to_words(const std::string& dec) {
  std::vector<uint32_t> words = {0};
  for (char c : dec) {
    uint64_t carry = uint64_t(c - '0');
    for (uint32_t& w : words) {
      const uint64_t v = uint64_t(w) * 10 + carry;
      w = uint32_t(v);
      carry = v >> 32;
    }
    if (carry != 0) words.push_back(uint32_t(carry));
  }
  return words;
}

u128 hex128(uint64_t hi, uint64_t lo) {
  return (u128(hi) << 64) | lo;
}

// numpy.random.default_rng(seed).integers(low, high, size=out.size(), dtype=np.int64), with the
// seed given as its little-endian 32-bit words.
void default_rng_integers_int64(std::span<const uint32_t> seed, int64_t low, int64_t high,
                                std::span<int64_t> out) {
  Pcg64 gen{seed};
  random_integers_int64(gen, low, high, out);
}

// Hash ids of `tokens` fed in consecutive chunks of `chunk` tokens, carrying the history.
I64 hash_in_chunks(const EngramTables& t, const I64& tokens, int64_t pad, size_t chunk) {
  const size_t per_token = size_t(t.n_layers) * t.n_cols;
  I64 ids(tokens.size() * per_token, -7);
  I64 history(t.ngram_max - 1, -9);
  int64_t n_hist = 0;
  for (size_t s = 0; s < tokens.size(); s += chunk) {
    const size_t n = std::min(chunk, tokens.size() - s);
    const std::span<const int64_t> part(tokens.data() + s, n);
    engram_hash_ids(t, part, std::span<const int64_t>(history.data(), n_hist), int64_t(s), pad,
                    std::span<int64_t>(ids.data() + s * per_token, n * per_token));
    n_hist = engram_update_history(t, history, n_hist, part);
  }
  return ids;
}

// --- Appendix A.1: SeedSequence, PCG64, multipliers ---

// The hashed pool and the PCG state are checked through what they produce: the generated state
// words and the draws (seed 0 through the numpy fixtures below).
TEST(NumpyRng, SeedSequenceAndPcg64MatchAppendixA1) {
  // numpy's generate_state(4, np.uint64) is the 32-bit words in pairs, low half first.
  const uint64_t st[4] = {0x77d32a348ad70d07u, 0x993ed609b84a4fa5u, 0xd5f972dec8698e49u,
                          0x7d79ebaebcf148deu};
  uint32_t st32[8];
  seed_sequence_state(seed_words(10007), st32);
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(st32[2 * k], uint32_t(st[k]));
    EXPECT_EQ(st32[2 * k + 1], uint32_t(st[k] >> 32));
  }

  Pcg64 g1(seed_words(10007));
  EXPECT_EQ(g1.next64(), 0xd2c3f84026661e33u);
  EXPECT_EQ(g1.next64(), 0x0d4fb6969eb57435u);
  EXPECT_EQ(g1.next64(), 0x62e6e1c58c3bd72bu);

  EXPECT_EQ(Pcg64(seed_words(140098)).next64(), 0xba3ecc29cf07c111u);
}

TEST(NumpyRng, Next32ServesLowThenHighHalf) {
  Pcg64 a(seed_words(42)), b(seed_words(42));
  for (int i = 0; i < 5; ++i) {
    const uint64_t v = a.next64();
    EXPECT_EQ(b.next32(), uint32_t(v));
    EXPECT_EQ(b.next32(), uint32_t(v >> 32));
  }
}

TEST(NumpyRng, SeedWords) {
  EXPECT_EQ(seed_words(u128(0)), (std::vector<uint32_t>{0}));
  EXPECT_EQ(seed_words(u128(0xffffffffu)), (std::vector<uint32_t>{0xffffffffu}));
  EXPECT_EQ(seed_words(u128(1) << 32), (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(seed_words(hex128(5, 0)), (std::vector<uint32_t>{0, 0, 5}));
  EXPECT_EQ(decimal_to_words("18446744073709551616"), (std::vector<uint32_t>{0, 0, 1}));
}

TEST(EngramTables, MultipliersMatchAppendixA1) {
  // Per layer, max_ngram_size multipliers.
  EXPECT_EQ(make_engram_tables(I64{1, 14}, 4, 1, 2, 99092).multipliers,
            (I64{76632096046245, 4839876093313, 35959672319349, 73987337458391,  // layer 1
                 67716810739261, 51510806800915, 30921347202721, 82619226485591}));
  EXPECT_EQ(make_engram_tables(I64{0, 1}, 4, 1, 2, 256).multipliers,
            (I64{22948963341361471, 9720090748611819, 1476226777048821, 595470825660793,
                 29662608052400909, 1873410163432121, 13919202536988139, 28638879857136817}));
  // The released bound is 46 539 438 283 891: the same stream drawn directly gives (mu - 1) / 2.
  I64 v(4);
  default_rng_integers_int64(seed_words(u128(10007)), 0, 46539438283891, v);
  EXPECT_EQ(v, (I64{(76632096046245 - 1) / 2, (4839876093313 - 1) / 2, (35959672319349 - 1) / 2,
                    (73987337458391 - 1) / 2}));
}

// --- Appendix A.2: released primes and table sizes ---

TEST(EngramTables, ReleasedPrimesMatchAppendixA2) {
  const int64_t layers[] = {1, 14};
  const EngramTables t = make_engram_tables(layers, 4, 8, 16000000, 99092);
  ASSERT_EQ(t.n_layers, 2);
  ASSERT_EQ(t.n_cols, 24);
  const I64 expect_primes = {
      16000057, 16000079, 16000081, 16000097, 16000121, 16000129, 16000133, 16000183,  // L1 2-gram
      16000189, 16000207, 16000211, 16000253, 16000277, 16000289, 16000307, 16000321,  // 3-gram
      16000339, 16000381, 16000393, 16000399, 16000403, 16000409, 16000447, 16000463,  // 4-gram
      16000477, 16000487, 16000499, 16000507, 16000511, 16000573, 16000609, 16000627,  // L14
      16000667, 16000669, 16000693, 16000697, 16000711, 16000729, 16000759, 16000769,
      16000781, 16000799, 16000813, 16000819, 16000841, 16000877, 16000879, 16000889};
  EXPECT_EQ(t.primes, expect_primes);
  // engram_num_embeddings of the released inference_config.json.
  const I64 num_embeddings = {384006168, 384016682};
  EXPECT_EQ(t.rows, num_embeddings);
  EXPECT_EQ(t.offsets[0], 0);
  EXPECT_EQ(t.offsets[1], 16000057);
  EXPECT_EQ(t.offsets[24], 0);
  EXPECT_EQ(t.offsets[47], 384016682 - 16000889);
  EXPECT_EQ(t.offsets[23], 384006168 - 16000463);
  EXPECT_NO_THROW(check_engram_num_embeddings(t, num_embeddings));
  EXPECT_NO_THROW(check_engram_num_embeddings(t, I64{384006168, 400000000}));
  EXPECT_THROW(check_engram_num_embeddings(t, I64{384006168, 384016681}), Error);
  EXPECT_THROW(check_engram_num_embeddings(t, I64{384006168}), Error);
}

TEST(EngramTables, PrimalityIsExactOn64Bits) {
  // Sieve up to 200 000.
  const int n = 200000;
  std::vector<bool> composite(n, false);
  composite[0] = composite[1] = true;
  for (int i = 2; i * i < n; ++i)
    if (!composite[i])
      for (int j = i * i; j < n; j += i) composite[j] = true;
  for (int i = 0; i < n; ++i) ASSERT_EQ(is_prime_u64(uint64_t(i)), !composite[i]) << i;
  EXPECT_TRUE(is_prime_u64((uint64_t(1) << 61) - 1));
  EXPECT_TRUE(is_prime_u64(18446744073709551557u));  // largest prime below 2^64
  EXPECT_TRUE(is_prime_u64(9223372036854775783u));   // largest prime below 2^63
  EXPECT_FALSE(is_prime_u64(18446744073709551615u));
  EXPECT_FALSE(is_prime_u64(18446744030759878681u));  // 4294967291^2
  EXPECT_FALSE(is_prime_u64(3215031751u));            // strong pseudoprime to bases 2, 3, 5, 7
  EXPECT_FALSE(is_prime_u64(3825123056546413051u));   // strong pseudoprime to bases 2..23
  EXPECT_FALSE(is_prime_u64(341550071728321u));       // strong pseudoprime to bases 2..17
  EXPECT_FALSE(is_prime_u64(uint64_t(4294967291u) * 4294967279u));
}

// --- Appendix A.3: tiny hash example ---

TEST(EngramHash, TinyExampleMatchesAppendixA3) {
  const int64_t layers[] = {1};
  const EngramTables t = make_engram_tables(layers, 3, 2, 100, 512);
  EXPECT_EQ(t.primes, (I64{101, 103, 107, 109}));
  EXPECT_EQ(t.offsets, (I64{0, 101, 204, 311}));
  EXPECT_EQ(t.multipliers, (I64{14831304026200453, 936705081716061, 6959601268494069}));
  const I64 tokens = {5, 300, 7, 511};
  const I64 expect = {67, 142, 214, 321, 76, 196, 224, 313, 10, 201, 216, 327, 76, 199, 270, 404};

  I64 ids(16);
  engram_hash_ids(t, tokens, {}, 0, 2, ids);
  EXPECT_EQ(ids, expect);

  // Chunks [5, 300] then [7, 511] (s = 2) through the history.
  I64 history(2);
  I64 first(8), second(8);
  engram_hash_ids(t, std::span(tokens).first(2), {}, 0, 2, first);
  int64_t n_hist = engram_update_history(t, history, 0, std::span(tokens).first(2));
  ASSERT_EQ(n_hist, 2);
  EXPECT_EQ(history, (I64{5, 300}));
  engram_hash_ids(t, std::span(tokens).subspan(2), std::span(history).first(n_hist), 2, 2, second);
  first.insert(first.end(), second.begin(), second.end());
  EXPECT_EQ(first, expect);
  EXPECT_EQ(hash_in_chunks(t, tokens, 2, 1), expect);
  EXPECT_EQ(hash_in_chunks(t, tokens, 2, 3), expect);
}

TEST(EngramHash, HistoryKeepsLastIds) {
  const int64_t layers[] = {1};
  const EngramTables t = make_engram_tables(layers, 4, 1, 10, 100);
  I64 history(3, -9);
  int64_t n = engram_update_history(t, history, 0, I64{});
  EXPECT_EQ(n, 0);
  n = engram_update_history(t, history, n, I64{4});
  EXPECT_EQ(n, 1);
  EXPECT_EQ(history[0], 4);
  n = engram_update_history(t, history, n, I64{5});
  EXPECT_EQ(n, 2);
  EXPECT_EQ(std::vector(history.begin(), history.begin() + 2), (I64{4, 5}));
  n = engram_update_history(t, history, n, I64{6, -1});
  EXPECT_EQ(n, 3);
  EXPECT_EQ(history, (I64{5, 6, -1}));
  n = engram_update_history(t, history, n, I64{7});
  EXPECT_EQ(history, (I64{6, -1, 7}));
  n = engram_update_history(t, history, n, I64{8, 9, 10, 11, 12});
  EXPECT_EQ(n, 3);
  EXPECT_EQ(history, (I64{10, 11, 12}));
  EXPECT_THROW(engram_update_history(t, std::span(history).first(2), 0, I64{1}), Error);
  EXPECT_THROW(engram_update_history(t, history, 4, I64{1}), Error);
}

TEST(EngramHash, BadInputThrows) {
  const int64_t layers[] = {1};
  const EngramTables t = make_engram_tables(layers, 3, 2, 100, 512);
  I64 ids(8);
  const I64 hist2 = {5, 6};
  EXPECT_THROW(engram_hash_ids(t, I64{512, 1}, {}, 0, 2, ids), Error);
  EXPECT_THROW(engram_hash_ids(t, I64{-2, 1}, {}, 0, 2, ids), Error);
  EXPECT_THROW(engram_hash_ids(t, I64{1, 1}, {}, 0, 512, ids), Error);
  EXPECT_THROW(engram_hash_ids(t, I64{1, 1}, {}, 0, kEngramDead, ids), Error);
  EXPECT_THROW(engram_hash_ids(t, I64{1, 1}, {}, 5, 2, ids), Error);  // history missing
  EXPECT_THROW(engram_hash_ids(t, I64{1, 1}, hist2, 1, 2, ids), Error);
  EXPECT_THROW(engram_hash_ids(t, I64{1, 1}, I64{1, 600}, 9, 2, ids), Error);
  EXPECT_THROW(engram_hash_ids(t, I64{1}, {}, 0, 2, ids), Error);  // output too big
  EXPECT_THROW(engram_hash_ids(t, I64{1, 1}, {}, -1, 2, ids), Error);
  EXPECT_NO_THROW(engram_hash_ids(t, I64{1, kEngramDead}, hist2, 7, 2, ids));

  EXPECT_THROW(make_engram_tables(layers, 1, 2, 100, 512), Error);
  EXPECT_THROW(make_engram_tables(layers, 3, 0, 100, 512), Error);
  EXPECT_THROW(make_engram_tables(layers, 3, 2, -1, 512), Error);
  EXPECT_THROW(make_engram_tables(layers, 3, 2, 100, 0), Error);
  EXPECT_THROW(make_engram_tables(layers, 3, int64_t(1) << 40, 100, 512), Error);
  EXPECT_THROW(make_engram_tables(I64{-1}, 3, 2, 100, 512), Error);
  EXPECT_THROW(make_engram_tables(layers, 3, 2, INT64_MAX - 10, 512), Error);
  try {
    make_engram_tables(layers, 3, 2, 100, 0);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("engram_compressed_vocab_size"), std::string::npos);
  }
  I64 out(2);
  EXPECT_THROW(default_rng_integers_int64(seed_words(u128(1)), 5, 5, out), Error);
  uint32_t st[4];
  EXPECT_THROW(seed_sequence_state(std::vector<uint32_t>{}, st), Error);
}

// --- numpy fixtures ---

TEST(NumpyRng, IntegersMatchNumpyFixture) {
  std::ifstream in(fixture_path("numpy_integers.txt"));
  ASSERT_TRUE(in) << fixture_path("numpy_integers.txt");
  std::string line;
  int n_rng = 0, n_stream = 0, n_big_seed = 0, n_32bit = 0;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string kind, seed;
    ls >> kind;
    if (kind == "rng") {
      int64_t low, high, n;
      ls >> seed >> low >> high >> n;
      I64 expect(n);
      for (auto& v : expect) ls >> v;
      ASSERT_FALSE(ls.fail()) << line;
      const std::vector<uint32_t> words = decimal_to_words(seed);
      I64 got(n);
      default_rng_integers_int64(words, low, high, got);
      EXPECT_EQ(got, expect) << line;
      ++n_rng;
      n_big_seed += words.size() > 4;
      n_32bit += uint64_t(high - 1) - uint64_t(low) < (uint64_t(1) << 32);
    } else if (kind == "stream") {
      int n_draws;
      ls >> seed >> n_draws;
      Pcg64 gen{decimal_to_words(seed)};
      for (int d = 0; d < n_draws; ++d) {
        ASSERT_TRUE(std::getline(in, line));
        std::istringstream ds(line);
        std::string draw;
        int64_t low, high, n;
        ds >> draw >> low >> high >> n;
        ASSERT_EQ(draw, "draw");
        I64 expect(n), got(n);
        for (auto& v : expect) ds >> v;
        ASSERT_FALSE(ds.fail()) << line;
        random_integers_int64(gen, low, high, got);
        EXPECT_EQ(got, expect) << "seed " << seed << ": " << line;
      }
      ++n_stream;
    }
  }
  EXPECT_GE(n_rng, 250);
  EXPECT_GE(n_big_seed, 20);
  EXPECT_GE(n_32bit, 100);
  EXPECT_EQ(n_stream, 3);
}

struct HashCase {
  std::string name;
  int64_t ng = 0, hh = 0, vocab = 0, vc = 0, pad = 0, t = 0;
  I64 layers, mult, primes, offsets, tokens, ids;  // ids [T, L_E, NC]
};

std::vector<HashCase> read_hash_cases() {
  std::ifstream in(fixture_path("hash_cases.txt"));
  std::vector<HashCase> cases;
  std::string line;
  auto read_rest = [](std::istringstream& ls, I64* out) {
    int64_t v;
    while (ls >> v) out->push_back(v);
  };
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string kind;
    ls >> kind;
    int64_t idx;
    if (kind == "case") {
      HashCase c;
      int64_t n_layers;
      ls >> c.name >> c.ng >> c.hh >> c.vocab >> c.vc >> c.pad >> c.t >> n_layers;
      read_rest(ls, &c.layers);
      cases.push_back(c);
    } else if (kind == "mult") {
      ls >> idx;
      read_rest(ls, &cases.back().mult);
    } else if (kind == "prime") {
      ls >> idx;
      read_rest(ls, &cases.back().primes);
    } else if (kind == "offset") {
      ls >> idx;
      read_rest(ls, &cases.back().offsets);
    } else if (kind == "tokens") {
      read_rest(ls, &cases.back().tokens);
    } else if (kind == "ids") {
      ls >> idx >> idx;
      read_rest(ls, &cases.back().ids);
    }
  }
  return cases;
}

TEST(EngramHash, MatchesNumpyFixtureForEveryChunking) {
  const std::vector<HashCase> cases = read_hash_cases();
  ASSERT_EQ(cases.size(), 3u);
  for (const HashCase& c : cases) {
    SCOPED_TRACE(c.name);
    const EngramTables t = make_engram_tables(c.layers, c.ng, c.hh, c.vocab, c.vc);
    EXPECT_EQ(t.multipliers, c.mult);
    EXPECT_EQ(t.primes, c.primes);
    EXPECT_EQ(t.offsets, c.offsets);
    ASSERT_EQ(int64_t(c.tokens.size()), c.t);
    ASSERT_EQ(c.ids.size(), size_t(c.t) * t.n_layers * t.n_cols);
    EXPECT_GE(std::count(c.tokens.begin(), c.tokens.end(), kEngramDead), 3);
    for (int64_t k = 1; k <= c.t; ++k) {
      EXPECT_EQ(hash_in_chunks(t, c.tokens, c.pad, size_t(k)), c.ids) << "chunk size " << k;
    }
    // Irregular chunk boundaries.
    std::mt19937 rng(7);
    for (int trial = 0; trial < 20; ++trial) {
      const size_t per_token = size_t(t.n_layers) * t.n_cols;
      I64 ids(c.ids.size()), history(t.ngram_max - 1);
      int64_t n_hist = 0;
      for (int64_t s = 0; s < c.t;) {
        const int64_t n = std::min<int64_t>(1 + rng() % 7, c.t - s);
        const std::span<const int64_t> part(c.tokens.data() + s, n);
        engram_hash_ids(t, part, std::span<const int64_t>(history.data(), n_hist), s, c.pad,
                        std::span<int64_t>(ids.data() + s * per_token, n * per_token));
        n_hist = engram_update_history(t, history, n_hist, part);
        s += n;
      }
      EXPECT_EQ(ids, c.ids) << "trial " << trial;
    }
    for (size_t i = 0; i < c.ids.size(); ++i) {
      const int z = int(i / t.n_cols) % t.n_layers;
      ASSERT_GE(c.ids[i], 0);
      ASSERT_LT(c.ids[i], t.rows[z]);
    }
  }
}

}  // namespace
}  // namespace deepinfer
