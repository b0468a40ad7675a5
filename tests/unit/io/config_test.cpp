// Model configuration: the released flat file, the Hugging Face form, derived layer roles and
// the round trip through to_json.
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "io/config.h"
#include "io/tiny.h"
#include "io_test_util.h"

namespace deepinfer {
namespace {

using namespace testing_io;
using json = nlohmann::json;

const std::string kReleased =
    std::string(DEEPINFER_SOURCE_DIR) + "/tests/data/io/v41_flash_inference_config.json";

// Every field, compared one by one so that a field to_json forgets cannot hide.
void expect_same(const ModelConfig& a, const ModelConfig& b) {
#define SAME(f) EXPECT_EQ(a.f, b.f) << #f
  SAME(vocab_size);
  SAME(dim);
  SAME(moe_inter_dim);
  SAME(n_layers);
  SAME(n_mtp_layers);
  SAME(n_heads);
  SAME(n_routed_experts);
  SAME(n_shared_experts);
  SAME(n_activated_experts);
  SAME(score_func);
  SAME(gate_temp);
  SAME(norm_topk_prob);
  SAME(route_scale);
  SAME(swiglu_limit);
  SAME(q_lora_rank);
  SAME(head_dim);
  SAME(rope_head_dim);
  SAME(norm_eps);
  SAME(o_groups);
  SAME(o_lora_rank);
  SAME(window_size);
  SAME(compress_ratios);
  SAME(kv_source_layers);
  SAME(index_source_layers);
  SAME(compress_rope_theta);
  SAME(rope_theta);
  SAME(original_seq_len);
  SAME(rope_factor);
  SAME(beta_fast);
  SAME(beta_slow);
  SAME(index_n_heads);
  SAME(index_head_dim);
  SAME(index_topk);
  SAME(candidate_source_layer);
  SAME(candidate_topk_blocks);
  SAME(candidate_block_size);
  SAME(hc_mult);
  SAME(hc_sinkhorn_iters);
  SAME(hc_eps);
  SAME(engram_layer_ids);
  SAME(engram_num_embeddings);
  SAME(engram_max_ngram_size);
  SAME(engram_vocab_size);
  SAME(engram_n_heads);
  SAME(engram_head_dim);
  SAME(engram_pad_id);
  SAME(engram_compressed_vocab_size);
  SAME(dtype);
  SAME(expert_dtype);
  SAME(bos_token_id);
  SAME(eos_token_id);
  SAME(pad_token_id);
  SAME(max_position_embeddings);
  SAME(dspark_block_size);
  SAME(dspark_noise_token_id);
  SAME(dspark_target_layer_ids);
  SAME(dspark_markov_rank);
  SAME(dspark_n_routed_experts);
  SAME(dspark_n_activated_experts);
  SAME(vision_n_layers);
  SAME(vision_dim);
  SAME(vision_n_heads);
  SAME(vision_inter_dim);
  SAME(vision_patch_size);
  SAME(vision_downsample_ratio);
  SAME(vision_max_n_token);
  SAME(vision_min_pixels);
  SAME(vision_max_wh_ratio);
  SAME(vision_rope_theta);
  SAME(image_token_id);
#undef SAME
}

std::vector<int> released_ratios() {
  std::vector<int> r = {0, 0};
  r.insert(r.end(), 18, 2);
  r.insert(r.end(), 20, 1);
  r.insert(r.end(), 3, 0);  // DSpark layers
  return r;
}

TEST(Config, ReleasedFlatConfigEveryField) {
  const ModelConfig c = ModelConfig::load(kReleased);
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.dim, 5120);
  EXPECT_EQ(c.moe_inter_dim, 2304);
  EXPECT_EQ(c.n_layers, 40);
  EXPECT_EQ(c.n_mtp_layers, 3);
  EXPECT_EQ(c.n_heads, 64);
  EXPECT_EQ(c.n_routed_experts, 384);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.n_activated_experts, 6);
  EXPECT_EQ(c.score_func, "sqrtsoftplus");
  EXPECT_EQ(c.gate_temp, 1.0);    // not in the file: default
  EXPECT_TRUE(c.norm_topk_prob);  // not in the file: default
  EXPECT_EQ(c.route_scale, 1.5);
  EXPECT_EQ(c.swiglu_limit, 10.0);
  EXPECT_EQ(c.q_lora_rank, 1280);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.rope_head_dim, 64);
  EXPECT_EQ(c.norm_eps, 1e-20);
  EXPECT_EQ(c.o_groups, 8);
  EXPECT_EQ(c.o_lora_rank, 1024);
  EXPECT_EQ(c.window_size, 128);
  EXPECT_EQ(c.compress_ratios, released_ratios());
  EXPECT_EQ(c.kv_source_layers, (std::vector<int>{2, 8, 14, 20}));
  EXPECT_EQ(c.index_source_layers, (std::vector<int>{2, 8, 14, 20, 24, 28, 32, 36}));
  EXPECT_EQ(c.compress_rope_theta, 160000);
  EXPECT_EQ(c.rope_theta, 10000);
  EXPECT_EQ(c.original_seq_len, 65536);
  EXPECT_EQ(c.rope_factor, 16);
  EXPECT_EQ(c.beta_fast, 32);
  EXPECT_EQ(c.beta_slow, 1);
  EXPECT_EQ(c.index_n_heads, 32);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 512);
  EXPECT_EQ(c.candidate_source_layer, 20);
  EXPECT_EQ(c.candidate_topk_blocks, 2048);
  EXPECT_EQ(c.candidate_block_size, 8);
  EXPECT_EQ(c.hc_mult, 4);
  EXPECT_EQ(c.hc_sinkhorn_iters, 20);
  EXPECT_EQ(c.hc_eps, 1e-6);
  EXPECT_EQ(c.engram_layer_ids, (std::vector<int>{1, 14}));
  EXPECT_EQ(c.engram_num_embeddings, (std::vector<int64_t>{384006168, 384016682}));
  EXPECT_EQ(c.engram_max_ngram_size, 4);
  EXPECT_EQ(c.engram_vocab_size, 16000000);
  EXPECT_EQ(c.engram_n_heads, 8);
  EXPECT_EQ(c.engram_head_dim, 256);
  EXPECT_EQ(c.engram_pad_id, 2);
  EXPECT_EQ(c.engram_compressed_vocab_size, 99092);
  EXPECT_EQ(c.dtype, "fp8");
  EXPECT_EQ(c.expert_dtype, "fp4");
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_id, 1);
  EXPECT_EQ(c.pad_token_id, 2);
  EXPECT_EQ(c.max_position_embeddings, 0);  // not in the flat file
  EXPECT_EQ(c.dspark_block_size, 5);
  EXPECT_EQ(c.dspark_noise_token_id, 128799);
  EXPECT_EQ(c.dspark_target_layer_ids, (std::vector<int>{37, 38, 39}));
  EXPECT_EQ(c.dspark_markov_rank, 256);
  EXPECT_EQ(c.dspark_n_routed_experts, 128);
  EXPECT_EQ(c.dspark_n_activated_experts, 3);
  EXPECT_EQ(c.vision_n_layers, 32);
  EXPECT_EQ(c.vision_dim, 1024);
  EXPECT_EQ(c.vision_n_heads, 16);
  EXPECT_EQ(c.vision_inter_dim, 2816);
  EXPECT_EQ(c.vision_patch_size, 14);
  EXPECT_EQ(c.vision_downsample_ratio, 3);
  EXPECT_EQ(c.vision_max_n_token, 1024);
  EXPECT_EQ(c.vision_min_pixels, 295936);
  EXPECT_EQ(c.vision_max_wh_ratio, 0);  // null in the file
  EXPECT_EQ(c.vision_rope_theta, 10000);
  EXPECT_EQ(c.image_token_id, 129264);
  // Derived helpers.
  EXPECT_EQ(c.engram_columns(), 24);
  EXPECT_EQ(c.engram_index(14), 1);
  EXPECT_EQ(c.engram_index(2), -1);
  EXPECT_TRUE(c.is_engram_layer(1));
  EXPECT_FALSE(c.is_engram_layer(0));
  EXPECT_EQ(c.compress_ratio(20), 1);
}

TEST(Config, LoadsFromADirectoryAndNamesMissingFiles) {
  ScratchDir dir;
  write_text(dir / "config.json", read_text(kReleased));
  expect_same(ModelConfig::load(dir.path().string()), ModelConfig::load(kReleased));
  EXPECT_TRUE(mentions(error_of([&] { ModelConfig::load(dir / "nope.json"); }),
                       {dir / "nope.json", "does not exist"}));
  const std::string long_path = "/tmp/" + std::string(5000, 'x');
  EXPECT_TRUE(mentions(error_of([&] { ModelConfig::load(long_path); }), {"cannot read"}));
  ScratchDir empty;
  EXPECT_TRUE(mentions(error_of([&] { ModelConfig::load(empty.path().string()); }),
                       {empty / "config.json", "cannot read"}));
}

// The Hugging Face form of the released model: the text model under text_config with the
// renamed keys of V41_SPEC.md §1.1, YaRN under rope_scaling, formats in quantization_config,
// token ids and the vision tower at the top level.
const char* kHfConfig = R"({
  "architectures": ["DeepseekV41ForCausalLM"],
  "model_type": "deepseek_v41",
  "dtype": "bfloat16",
  "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2,
  "image_token_id": 129264,
  "tie_word_embeddings": false,
  "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                          "weight_block_size": [32, 32], "scale_fmt": "ue8m0",
                          "expert_dtype": "fp4"},
  "vision_config": {"num_hidden_layers": 32, "hidden_size": 1024, "num_attention_heads": 16,
                    "intermediate_size": 2816, "patch_size": 14, "downsample_ratio": 3,
                    "max_n_token": 1024, "min_pixels": 295936, "max_wh_ratio": null,
                    "rope_theta": 10000},
  "text_config": {
    "vocab_size": 129280, "hidden_size": 5120, "moe_intermediate_size": 2304,
    "num_hidden_layers": 40, "num_nextn_predict_layers": 3, "num_attention_heads": 64,
    "num_key_value_heads": 1, "n_routed_experts": 384, "n_shared_experts": 1,
    "num_experts_per_tok": 6, "scoring_func": "sqrtsoftplus", "norm_topk_prob": true,
    "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "q_lora_rank": 1280, "head_dim": 512,
    "qk_rope_head_dim": 64, "rms_norm_eps": 1e-20, "o_groups": 8, "o_lora_rank": 1024,
    "sliding_window": 128,
    "compress_ratios": [0,0,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,
                        1,1,1,1,0,0,0],
    "kv_source_layer_ids": [2, 8, 14, 20],
    "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
    "compress_rope_theta": 160000, "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    "index_n_heads": 32, "index_head_dim": 128, "index_topk": 512,
    "candidate_source_layer_id": 20, "candidate_topk_blocks": 2048, "candidate_block_size": 8,
    "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
    "engram_layer_ids": [1, 14], "engram_num_embeddings": [384006168, 384016682],
    "engram_max_ngram_size": 4, "engram_vocab_size": 16000000, "engram_n_heads": 8,
    "engram_head_dim": 256, "engram_pad_token_id": 2, "engram_compressed_vocab_size": 99092,
    "max_position_embeddings": 1048576,
    "dspark_block_size": 5, "dspark_noise_token_id": 128799,
    "dspark_target_layer_ids": [37, 38, 39], "dspark_markov_rank": 256,
    "dspark_n_routed_experts": 128, "dspark_num_experts_per_tok": 3
  }
})";

TEST(Config, HuggingFaceFormGivesTheSameModel) {
  const ModelConfig hf = ModelConfig::parse(kHfConfig, "hf.json");
  ModelConfig flat = ModelConfig::load(kReleased);
  EXPECT_EQ(hf.max_position_embeddings, 1048576);
  flat.max_position_embeddings = 1048576;  // only the HF file states it
  expect_same(hf, flat);
  EXPECT_EQ(hf.dim, 5120);
  EXPECT_EQ(hf.window_size, 128);
  EXPECT_EQ(hf.original_seq_len, 65536);
  EXPECT_EQ(hf.rope_factor, 16);
  EXPECT_EQ(hf.dspark_n_activated_experts, 3);
  EXPECT_EQ(hf.vision_inter_dim, 2816);
  EXPECT_EQ(hf.dtype, "fp8");
  EXPECT_EQ(hf.expert_dtype, "fp4");

  // Without rope_scaling YaRN is off.
  json j = json::parse(kHfConfig);
  j["text_config"].erase("rope_scaling");
  EXPECT_EQ(ModelConfig::parse(j.dump(), "hf.json").original_seq_len, 0);
}

TEST(Config, HuggingFaceQuantizationConfigIsChecked) {
  auto parse_with = [](const std::function<void(json&)>& edit) {
    json j = json::parse(kHfConfig);
    edit(j);
    return error_of([&] { ModelConfig::parse(j.dump(), "hf.json"); });
  };
  {  // no quantization_config: every linear stored bf16, as the reference's dtype "bf16"
    json j = json::parse(kHfConfig);
    j.erase("quantization_config");
    const ModelConfig c = ModelConfig::parse(j.dump(), "hf.json");
    EXPECT_EQ(c.dtype, "bf16");
    EXPECT_EQ(c.expert_dtype, "");
    j = json::parse(kHfConfig);
    j["quantization_config"]["expert_dtype"] = "fp8";  // experts in the model's fp8
    EXPECT_EQ(ModelConfig::parse(j.dump(), "hf.json").expert_dtype, "");
  }
  EXPECT_TRUE(mentions(parse_with([](json& j) {
                         j["quantization_config"]["weight_block_size"] = {128, 128};
                       }),
                       {"hf.json", "weight_block_size", "[128, 128]"}));
  EXPECT_TRUE(mentions(parse_with([](json& j) { j["quantization_config"]["scale_fmt"] = "fp32"; }),
                       {"hf.json", "scale_fmt"}));
  EXPECT_TRUE(mentions(parse_with([](json& j) { j["quantization_config"].erase("quant_method"); }),
                       {"hf.json", "quant_method"}));
  EXPECT_TRUE(
      mentions(parse_with([](json& j) { j["quantization_config"]["expert_dtype"] = "int4"; }),
               {"hf.json", "expert_dtype = 'int4' must be \"fp4\" or null"}));
  EXPECT_TRUE(mentions(parse_with([](json& j) { j["text_config"].erase("hidden_size"); }),
                       {"hf.json", "missing required field 'hidden_size' in text_config"}));
  EXPECT_TRUE(mentions(parse_with([](json& j) { j["text_config"]["sliding_window"] = "128"; }),
                       {"hf.json", "text_config.sliding_window", "expected an integer"}));
  EXPECT_TRUE(mentions(parse_with([](json& j) { j["text_config"] = 5; }),
                       {"hf.json", "'text_config' must be an object"}));
}

// The table of V41_SPEC.md §1.2, written out layer by layer.
TEST(Config, ReleasedLayerRolesMatchTheSpecTable) {
  const auto roles = layer_roles(ModelConfig::load(kReleased));
  ASSERT_EQ(roles.size(), 40u);
  for (int l = 0; l < 40; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const LayerRole& r = roles[size_t(l)];
    LayerRole want;
    if (l >= 2 && l < 20) {
      const int src = 2 + (l - 2) / 6 * 6;  // 2, 8, 14
      want.ratio = 2;
      want.kv_source = want.index_source = want.key_owner = (l == src);
      want.kv_from = want.topk_from = src;
      want.keys_from = l == src ? src : -1;
    } else if (l >= 20 && l < 24) {
      want.ratio = 1;
      want.kv_source = want.index_source = want.key_owner = want.candidate_source = (l == 20);
      want.kv_from = want.topk_from = 20;
      want.keys_from = l == 20 ? 20 : -1;
    } else if (l >= 24) {
      const int idx = l / 4 * 4;  // 24, 28, 32, 36
      want.ratio = 1;
      want.index_source = want.candidate_consumer = (l == idx);
      want.kv_from = 20;
      want.keys_from = l == idx ? 20 : -1;
      want.topk_from = idx;
    }
    EXPECT_EQ(r.ratio, want.ratio);
    EXPECT_EQ(r.kv_source, want.kv_source);
    EXPECT_EQ(r.index_source, want.index_source);
    EXPECT_EQ(r.key_owner, want.key_owner);
    EXPECT_EQ(r.candidate_source, want.candidate_source);
    EXPECT_EQ(r.candidate_consumer, want.candidate_consumer);
    EXPECT_EQ(r.kv_from, want.kv_from);
    EXPECT_EQ(r.keys_from, want.keys_from);
    EXPECT_EQ(r.topk_from, want.topk_from);
  }
}

TEST(Config, RoundTripThroughToJson) {
  // Every field away from its default, so a field that to_json drops would show.
  json j = json::parse(read_text(kReleased));
  j["gate_temp"] = 0.5;
  j["norm_topk_prob"] = false;
  j["max_position_embeddings"] = 1048576;
  j["bos_token_id"] = 5;
  j["eos_token_id"] = 6;
  j["pad_token_id"] = 7;
  j["vision_max_wh_ratio"] = 2.5;
  j["norm_eps"] = 1.25e-7;
  const ModelConfig a = ModelConfig::parse(j.dump(), "edited");
  EXPECT_EQ(a.gate_temp, 0.5);
  EXPECT_FALSE(a.norm_topk_prob);
  EXPECT_EQ(a.vision_max_wh_ratio, 2.5);
  const ModelConfig b = ModelConfig::parse(a.to_json(), "round trip");
  expect_same(a, b);
  EXPECT_EQ(a.to_json(), b.to_json());

  for (const std::string& name : tiny_preset_names()) {
    SCOPED_TRACE(name);
    const ModelConfig p = preset_with_engram_rows(name);
    p.validate(name);
    expect_same(p, ModelConfig::parse(p.to_json(), name));
  }
  EXPECT_TRUE(mentions(error_of([] { tiny_preset_config("huge"); }), {"'huge'", "tiny-b"}));
}

// The fuzz seeds are valid configs, so the fuzzer starts from inputs that reach validation.
TEST(Config, FuzzSeedsAreValid) {
  const fs::path seeds = fs::path(DEEPINFER_SOURCE_DIR) / "tests/data/io/fuzz-corpus/config";
  int n = 0;
  for (const auto& e : fs::directory_iterator(seeds)) {
    const ModelConfig c = ModelConfig::load(e.path().string());
    if (e.path().filename() == "released-hf.json") expect_same(c, ModelConfig::load(kReleased));
    ++n;
  }
  EXPECT_GE(n, 4);
}

}  // namespace
}  // namespace deepinfer
