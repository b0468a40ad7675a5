// Byte counts of the released model, worked out by hand from the tensor inventory of
// V41_SPEC.md §2.2 and the cache formats of §12.1, against weight_footprint and kv_footprint.
#include <gtest/gtest.h>

#include "io/checkpoint.h"
#include "io_test_util.h"
#include "kv/kv_cache.h"

namespace deepinfer {
namespace {

using namespace testing_io;

const std::string kReleased =
    std::string(DEEPINFER_SOURCE_DIR) + "/tests/data/io/v41_flash_inference_config.json";

// Released dims: D 5120, H 64, Dh 512, Q 1280, G 8, Ro 1024, F 2304, E 384 (top 6), V 129280,
// M 4, Hi 32, Di 128, Engram Dm 256 with NC = 3 * 8 = 24 columns.
constexpr uint64_t kD = 5120, kH = 64, kDh = 512, kQ = 1280, kG = 8, kRo = 1024, kF = 2304;
constexpr uint64_t kE = 384, kV = 129280, kM = 4, kHi = 32, kDi = 128, kDm = 256, kNC = 24;

// fp8 [o, i] with one e8m0 per 32 x 32 tile; fp4 [o, i] packed with one e8m0 per 32 inputs.
constexpr uint64_t fp8(uint64_t o, uint64_t i) {
  return o * i + ((o + 31) / 32) * ((i + 31) / 32);
}
constexpr uint64_t fp4(uint64_t o, uint64_t i) {
  return o * i / 2 + o * (i / 32);
}

// What every one of the 40 layers holds besides its routed experts.
constexpr uint64_t kLayerDense =
    2 * kD * 2                                        // attn_norm, ffn_norm (bf16)
    + 2 * ((2 + kM) * kM * kM * kD * 4                // hc_{attn,ffn}_fn [24, 20480] f32
           + (2 + kM) * kM * 4 + 3 * 4)               // hc base [24], scale [3]
    + fp8(kQ, kD) + kQ * 2                            // wq_a, q_norm
    + fp8(kH * kDh, kQ)                               // wq_b
    + fp8(kDh, kD) + kDh * 2 + kH * 4                 // wkv, kv_norm, attn_sink
    + fp8(kG * kRo, kH* kDh / kG) + fp8(kD, kG* kRo)  // wo_a, wo_b
    + kE * kD * 2 + kE * 4                            // gate (bf16), gate.bias (f32)
    + 3 * fp8(kF, kD);                                // shared expert w1, w2, w3
static_assert(kLayerDense == 170053592);
constexpr uint64_t kLayerExperts = kE * (2 * fp4(kF, kD) + fp4(kD, kF));  // 7 219 445 760
constexpr uint64_t kCompressor2 = 2 * kDh * kD * 2 + kDh * 2;     // wkv + wgate + norm (r = 2)
constexpr uint64_t kCompressor1 = kDh * kD * 2 + kDh * 2;         // no wgate at r = 1
constexpr uint64_t kIndexer = fp8(kHi * kDi, kQ) + kHi * kD * 2;  // wq_b, weights_proj
constexpr uint64_t kKeyOwner = kDi * kDh * 2 + kDi * 2;           // wk, k_norm
constexpr uint64_t kEngramRow = kDm + kDm / 32;                   // fp8 row + its scales
constexpr uint64_t kEngramRest = fp8((kM + 1) * kD, kNC* kDm) + 2 * kM * kD * 2;  // wkv, q, k
constexpr uint64_t kEmbed = kV * kD * 2, kHead = kV * kD * 2, kNorm = kD * 2;

TEST(Footprint, ReleasedWeights) {
  const WeightFootprint f = weight_footprint(ModelConfig::load(kReleased));
  // KV sources 2, 8, 14 (r = 2) and 20 (r = 1); index sources 2, 8, ..., 36 of which the four KV
  // sources own keys; Engram tables of 384 006 168 and 384 016 682 rows at layers 1 and 14.
  const uint64_t shared_attn = 3 * kCompressor2 + kCompressor1 + 8 * kIndexer + 4 * kKeyOwner;
  const uint64_t total = 40 * (kLayerDense + kLayerExperts) + shared_attn +
                         (384006168ull + 384016682ull) * kEngramRow + 2 * kEngramRest + kEmbed +
                         kHead + kNorm;
  EXPECT_EQ(total, 501382549968ull);
  EXPECT_EQ(f.total - f.draft_head - f.vision, total);  // the DSpark stages and vision on top
  // The vision tower (bf16: 32 blocks of 1024, SwiGLU 2816, patch 14, 3x3 aligner to 5120, the
  // span delimiters) and bias_vl (f32, every layer).
  constexpr uint64_t kDv = 1024, kFv = 2816,
                     kBlock = 2 * kDv * 2 + (3 * kDv * kDv + 3 * kDv) * 2 + (kDv * kDv + kDv) * 2 +
                              2 * kFv * kDv * 2 + kDv * kFv * 2;
  EXPECT_EQ(f.vision, (kDv * 588 + kDv) * 2 + 32 * kBlock + kDv * 2 + (kD * kDv * 9 + kD) * 2 +
                          (kD * kD + kD) * 2 + 3 * kD * 2 + 40 * kE * 4);
  EXPECT_EQ(f.head, kHead);
  // Per decoded token: one embedding row, every dense weight, 6 of 384 experts per layer and the
  // 24 Engram rows each Engram layer hashes to.
  EXPECT_EQ(f.experts_per_token, 40 * kLayerExperts * 6 / 384);  // 4 512 153 600
  const uint64_t dense = kD * 2 + 40 * kLayerDense + shared_attn +
                         2 * (kNC * kEngramRow + kEngramRest) + kNorm + kHead;
  EXPECT_EQ(dense, 8522882880ull);
  EXPECT_EQ(f.dense_per_token, dense);
  EXPECT_EQ(f.per_token, dense + 40 * kLayerExperts * 6 / 384);  // 13 035 036 480
}

TEST(Footprint, ReleasedKvCache) {
  const KvFootprint k = kv_footprint(ModelConfig::load(kReleased));
  // A compressed-KV row is 512 fp4 values (256 bytes) + 32 e4m3 scales = 288 bytes; an index
  // key row is 128 fp4 values (64 bytes) + 4 e8m0 scales = 68 bytes. Layers 2, 8 and 14 (r = 2)
  // add one row of each per 2 tokens, (288 + 68) / 2 = 178 bytes per token each; layer 20
  // (r = 1) adds 356. Total 3 * 178 + 356 = 890 bytes per token.
  EXPECT_EQ(k.bytes_per_token, 890.0);
  EXPECT_EQ(compressed_kv_row_bytes(512), 288);
  EXPECT_EQ(index_key_row_bytes(128), 68);
  // Window rings: 40 layers x 128 slots x (512 e4m3 + 16 e8m0) bytes.
  EXPECT_EQ(k.window_bytes, 40 * 128 * 528);
  // Compressor carries at the three r = 2 sources: fp32 k and g rows for 2 positions of 512.
  EXPECT_EQ(k.carry_bytes, 3 * 2 * 2 * 512 * 4);
  // Engram history: Ng - 1 = 3 token ids of 8 bytes.
  EXPECT_EQ(k.engram_history_bytes, 24);
  EXPECT_EQ(k.fixed_bytes_per_seq(), 40 * 128 * 528 + 3 * 2 * 2 * 512 * 4 + 24);
}

TEST(Footprint, TensorSpecBytes) {
  EXPECT_EQ(tensor_spec_bytes({"x", SlotKind::QLinear, WeightFormat::Fp8Block, {33, 65}}),
            33u * 65 + 2 * 3);
  EXPECT_EQ(tensor_spec_bytes({"x", SlotKind::QLinear, WeightFormat::Fp4Row, {4, 64}}),
            4u * 32 + 4 * 2);
  EXPECT_EQ(tensor_spec_bytes({"x", SlotKind::QLinear, WeightFormat::Fp8Row, {10, 256}}),
            10u * 256 + 10 * 8);
  EXPECT_EQ(tensor_spec_bytes({"x", SlotKind::QLinear, WeightFormat::BF16, {3, 5}}), 30u);
  EXPECT_EQ(tensor_spec_bytes({"x", SlotKind::QLinear, WeightFormat::F32, {7}}), 28u);
  EXPECT_EQ(scale_name("layers.0.attn.wq_a.weight"), "layers.0.attn.wq_a.scale");
  EXPECT_EQ(scale_name("odd"), "odd.scale");
}

}  // namespace
}  // namespace deepinfer
