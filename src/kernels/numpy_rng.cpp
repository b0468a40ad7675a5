#include "kernels/numpy_rng.h"

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
  const uint64_t off = uint64_t(low);
  for (int64_t& v : out) {
    uint64_t r;
    if (rng == 0) {
      r = 0;
    } else if (rng == UINT32_MAX) {
      r = gen.next32();
    } else if (rng < UINT32_MAX) {
      r = bounded_lemire<uint32_t, uint64_t>(uint32_t(rng), [&] { return gen.next32(); });
    } else {  // rng <= 2^64 - 2 for an exclusive int64 range, so Lemire always applies
      r = bounded_lemire<uint64_t, u128>(rng, [&] { return gen.next64(); });
    }
    v = int64_t(off + r);
  }
}

}  // namespace deepinfer
