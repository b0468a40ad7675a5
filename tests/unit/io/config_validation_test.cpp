// Configs that cannot describe a runnable model: each gives a deepinfer::Error naming the file
// and the offending field.
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "io/config.h"
#include "io_test_util.h"

namespace deepinfer {
namespace {

using namespace testing_io;
using json = nlohmann::json;

json released() {
  static const json j = json::parse(read_text(std::string(DEEPINFER_SOURCE_DIR) +
                                              "/tests/data/io/v41_flash_inference_config.json"));
  return j;
}

struct Bad {
  const char* what;
  std::function<void(json&)> edit;
  std::vector<std::string> expect;  // besides the file label
};

std::string error_after(const std::function<void(json&)>& edit) {
  json j = released();
  edit(j);
  return error_of([&] { ModelConfig::parse(j.dump(), "cfg.json"); });
}

void check_all(const std::vector<Bad>& cases) {
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string msg = error_after(c.edit);
    EXPECT_TRUE(mentions(msg, {"cfg.json"}));
    for (const std::string& part : c.expect) EXPECT_TRUE(mentions(msg, {part}));
  }
}

TEST(ConfigValidation, TheReleasedConfigIsValid) {
  ModelConfig::parse(released().dump(), "cfg.json").validate("again");
}

TEST(ConfigValidation, SharedAttentionStructure) {
  check_all({
      {"compress_ratios one short",
       [](json& j) { j["compress_ratios"].erase(42); },
       {"compress_ratios has 42 entries", "n_layers + n_mtp_layers = 43"}},
      {"compress_ratios negative",
       [](json& j) { j["compress_ratios"][5] = -2; },
       {"compress_ratios[5]"}},
      {"a DSpark layer compressed",
       [](json& j) { j["compress_ratios"][41] = 1; },
       {"compress_ratios[41]", "DSpark"}},
      {"KV source out of range",
       [](json& j) { j["kv_source_layers"][3] = 40; },
       {"kv_source_layers[3] = 40", "[0, 40)"}},
      {"index source out of range",
       [](json& j) { j["index_source_layers"][0] = -1; },
       {"index_source_layers[0] = -1"}},
      {"KV sources out of order",
       [](json& j) {
         j["kv_source_layers"] = {8, 2, 14, 20};
       },
       {"kv_source_layers", "strictly increasing"}},
      {"KV source at a window-only layer",
       [](json& j) {
         j["kv_source_layers"] = {1, 2, 8, 14, 20};
       },
       {"kv_source_layers", "layer 1", "compress ratio is 0"}},
      {"index source at a window-only layer",
       [](json& j) { j["index_source_layers"] = {0, 2, 8, 14, 20, 24, 28, 32, 36}; },
       {"index_source_layers", "layer 0", "compress ratio is 0"}},
      // Layers 2..7 compress (r = 2) but the first KV source is layer 8.
      {"consumer without a KV source before it",
       [](json& j) {
         j["kv_source_layers"] = {8, 14, 20};
         j["index_source_layers"] = {8, 14, 20, 24, 28, 32, 36};
       },
       {"layer 2", "kv_source_layers"}},
      // Layer 20 (r = 1) would read the ratio-2 KV of layer 14.
      {"consumer whose KV source has another ratio",
       [](json& j) {
         j["kv_source_layers"] = {2, 8, 14};
         j["index_source_layers"] = {2, 8, 14, 24, 28, 32, 36};
         j["candidate_source_layer"] = -1;
       },
       {"layer 20", "ratio 1", "layer 14", "ratio is 2", "kv_source_layers"}},
      // Layer 8 compresses KV but runs no indexer, so it owns no index keys; layer 10 would be a
      // non-owner index source scoring those missing keys.
      {"non-owner index source whose KV source owns no keys",
       [](json& j) { j["index_source_layers"] = {2, 10, 14, 20, 24, 28, 32, 36}; },
       {"layer 8", "index_source_layers", "index keys"}},
      {"candidate rule (Ck - 1) * Cb + 1 < K",
       [](json& j) { j["candidate_topk_blocks"] = 2; },
       {"candidate_topk_blocks", "candidate_block_size", "= 9", "index_topk = 512"}},
      {"candidate rule exactly at the limit fails one below",
       [](json& j) {
         j["candidate_topk_blocks"] = 64;  // 63 * 8 + 1 = 505 < 512
       },
       {"= 505", "index_topk = 512"}},
      {"candidate source not an index source",
       [](json& j) { j["candidate_source_layer"] = 21; },
       {"candidate_source_layer = 21", "not an index source"}},
      {"candidate source out of range",
       [](json& j) { j["candidate_source_layer"] = 40; },
       {"candidate_source_layer = 40"}},
      {"candidate blocks of size 0",
       [](json& j) { j["candidate_block_size"] = 0; },
       {"candidate_block_size"}},
      {"candidate consumer at another ratio",
       [](json& j) {
         j["candidate_source_layer"] = 14;  // r = 2; index sources 20.. are r = 1
       },
       {"candidate", "layer 20", "ratio"}},
  });
  // A candidate rule that holds with equality is fine: 64 blocks of 8 give 63 * 8 + 1 = 505, so
  // K = 505 passes.
  json j = released();
  j["candidate_topk_blocks"] = 64;
  j["index_topk"] = 505;
  EXPECT_EQ(ModelConfig::parse(j.dump(), "cfg.json").index_topk, 505);
}

// What the reference accepts loads: o_lora_rank that is not a multiple of 32 when the groups'
// total is, dtype "bf16", expert_dtype null (flat form, written back as null).
TEST(ConfigValidation, ReferenceAcceptedForms) {
  json j = released();
  j["o_lora_rank"] = 1004;  // 8 * 1004 = 8032 = 251 * 32
  j["dtype"] = "bf16";
  j["expert_dtype"] = nullptr;
  const ModelConfig c = ModelConfig::parse(j.dump(), "cfg.json");
  EXPECT_EQ(c.o_lora_rank, 1004);
  EXPECT_EQ(c.dtype, "bf16");
  EXPECT_EQ(c.expert_dtype, "");
  const json back = json::parse(c.to_json());
  EXPECT_TRUE(back.at("expert_dtype").is_null());
  EXPECT_EQ(ModelConfig::parse(c.to_json(), "again").expert_dtype, "");
}

TEST(ConfigValidation, Dimensions) {
  check_all({
      {"dim", [](json& j) { j["dim"] = 5100; }, {"dim = 5100", "multiple of 32"}},
      {"q_lora_rank", [](json& j) { j["q_lora_rank"] = 1000; }, {"q_lora_rank = 1000", "32"}},
      {"moe_inter_dim", [](json& j) { j["moe_inter_dim"] = 2300; }, {"moe_inter_dim = 2300", "32"}},
      // wo_b's input (o_groups * o_lora_rank) is quantized in blocks of 32, o_lora_rank alone is
      // not: 8 groups of 1000 = 8000 is rejected, 8 groups of 1004 = 8032 accepted (below).
      {"o_groups * o_lora_rank",
       [](json& j) { j["o_lora_rank"] = 1002; },
       {"o_groups * o_lora_rank = 8 * 1002 = 8016", "multiple of 32"}},
      {"head_dim", [](json& j) { j["head_dim"] = 500; }, {"head_dim = 500", "32"}},
      {"index_head_dim",
       [](json& j) { j["index_head_dim"] = 100; },
       {"index_head_dim = 100", "32"}},
      {"engram_head_dim",
       [](json& j) { j["engram_head_dim"] = 100; },
       {"engram_head_dim = 100", "multiple of 32"}},
      {"o_groups not dividing n_heads * head_dim",
       [](json& j) { j["o_groups"] = 7; },
       {"o_groups = 7", "must divide n_heads * head_dim = 32768"}},
      {"o_groups zero", [](json& j) { j["o_groups"] = 0; }, {"o_groups", "> 0"}},
      {"rope_head_dim odd", [](json& j) { j["rope_head_dim"] = 63; }, {"rope_head_dim = 63"}},
      {"rope_head_dim past head_dim",
       [](json& j) { j["rope_head_dim"] = 1024; },
       {"rope_head_dim = 1024"}},
      {"index_head_dim below rope_head_dim",
       [](json& j) {
         j["index_head_dim"] = 32;
         j["rope_head_dim"] = 64;
       },
       {"index_head_dim (32)", "rope_head_dim (64)"}},
      {"vocab_size zero", [](json& j) { j["vocab_size"] = 0; }, {"vocab_size", "> 0"}},
      {"window_size zero", [](json& j) { j["window_size"] = 0; }, {"window_size", "> 0"}},
      {"more activated than routed experts",
       [](json& j) { j["n_activated_experts"] = 385; },
       {"n_activated_experts (385)", "n_routed_experts (384)"}},
      {"two shared experts", [](json& j) { j["n_shared_experts"] = 2; }, {"n_shared_experts"}},
      {"Engram rows per layer",
       [](json& j) { j["engram_num_embeddings"] = {384006168}; },
       {"engram_num_embeddings has 1 entries"}},
      {"Engram layer out of range",
       [](json& j) {
         j["engram_layer_ids"] = {1, 40};
       },
       {"engram_layer_ids[1] = 40"}},
      {"Engram pad id past the vocabulary",
       [](json& j) { j["engram_pad_id"] = 129280; },
       {"engram_pad_id = 129280"}},
      {"Engram n-grams of one",
       [](json& j) { j["engram_max_ngram_size"] = 1; },
       {"engram_max_ngram_size"}},
      {"YaRN without a factor", [](json& j) { j["rope_factor"] = 0; }, {"rope_factor"}},
      {"layer count overflowing int when DSpark layers are added",
       [](json& j) {
         j["n_layers"] = 2147483647;
         j["n_mtp_layers"] = 1;
       },
       {"compress_ratios has 43 entries", "2147483648"}},
  });
}

TEST(ConfigValidation, RequiredFieldsTypesAndFormats) {
  std::vector<Bad> cases;
  for (const char* field :
       {"vocab_size", "dim", "moe_inter_dim", "n_layers", "n_heads", "n_routed_experts",
        "n_activated_experts", "q_lora_rank", "head_dim", "rope_head_dim", "o_groups",
        "o_lora_rank", "window_size", "compress_ratios"}) {
    cases.push_back({field,
                     [field](json& j) { j.erase(field); },
                     {std::string("missing required field '") + field + "'"}});
  }
  // A value of the wrong type names the field, the type wanted and the value found.
  auto set = [](const char* key, json v) { return [key, v](json& j) { j[key] = v; }; };
  cases.push_back(
      {"string for an integer", set("dim", "5120"), {"dim", "expected an integer", "\"5120\""}});
  cases.push_back(
      {"fraction for an integer", set("dim", 5120.5), {"dim", "expected an integer", "5120.5"}});
  cases.push_back({"huge float for an integer", set("dim", 1e300), {"dim", "expected an integer"}});
  cases.push_back({"integer past int64",
                   set("dim", json::parse("18446744073709551615")),
                   {"dim", "expected an integer"}});
  cases.push_back(
      {"integer past int32", set("n_layers", 4294967296LL), {"n_layers", "expected an integer"}});
  cases.push_back(
      {"number for a boolean", set("norm_topk_prob", 1), {"norm_topk_prob", "expected a boolean"}});
  cases.push_back(
      {"number for a string", set("score_func", 3), {"score_func", "expected a string"}});
  cases.push_back(
      {"string for a number", set("rope_theta", "1e4"), {"rope_theta", "expected a number"}});
  cases.push_back(
      {"scalar for a list", set("compress_ratios", 2), {"compress_ratios", "a list of integers"}});
  cases.push_back({"list with a string",
                   set("kv_source_layers", json::parse(R"([2, "8"])")),
                   {"kv_source_layers", "a list of integers"}});
  cases.push_back({"list with a fraction",
                   set("engram_num_embeddings", json::parse("[1.5, 2]")),
                   {"engram_num_embeddings", "a list of integers"}});
  cases.push_back({"list entry past int32",
                   set("engram_layer_ids", json::parse("[1, 4294967297]")),
                   {"engram_layer_ids", "a list of integers"}});
  cases.push_back({"object for an integer",
                   set("dim", json::object({{"a", 1}})),
                   {"dim", "expected an integer"}});
  // Formats this engine does not run.
  cases.push_back(
      {"dense dtype", set("dtype", "fp16"), {"dtype = 'fp16' must be \"fp8\" or \"bf16\""}});
  cases.push_back({"expert dtype",
                   set("expert_dtype", "fp8"),
                   {"expert_dtype = 'fp8' must be \"fp4\" or null"}});
  cases.push_back({"router scoring", set("score_func", "softmax"), {"score_func 'softmax'"}});
  check_all(cases);

  // A float holding an integer is accepted (some writers emit 4.0).
  json j = released();
  j["hc_mult"] = 4.0;
  EXPECT_EQ(ModelConfig::parse(j.dump(), "cfg.json").hc_mult, 4);
}

TEST(ConfigValidation, NotAConfig) {
  EXPECT_TRUE(mentions(error_of([] { ModelConfig::parse("{\"dim\": ", "cfg.json"); }),
                       {"cfg.json", "not valid JSON"}));
  EXPECT_TRUE(mentions(error_of([] { ModelConfig::parse("[1]", "cfg.json"); }),
                       {"cfg.json", "expected a JSON object"}));
  // Describing a wrongly typed value must not recurse through a million nested arrays.
  const std::string nested = std::string(1000000, '[') + std::string(1000000, ']');
  EXPECT_TRUE(mentions(error_of([&] {
                         json j = released();
                         std::string text = j.dump();
                         text.insert(1, "\"gate_temp\": " + nested + ", ");
                         ModelConfig::parse(text, "cfg.json");
                       }),
                       {"cfg.json", "gate_temp", "expected a number"}));
}

}  // namespace
}  // namespace deepinfer
