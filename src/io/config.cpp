#include "io/config.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <variant>

#include "core/error.h"
#include "core/file.h"
#include "io/show_json.h"

namespace deepinfer {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

using FieldPtr = std::variant<int ModelConfig::*, int64_t ModelConfig::*, double ModelConfig::*,
                              bool ModelConfig::*, std::string ModelConfig::*,
                              std::vector<int> ModelConfig::*, std::vector<int64_t> ModelConfig::*>;

struct Field {
  const char* ref;  // flat reference key
  const char* hf;   // key (or dotted path) in the Hugging Face text_config
  FieldPtr ptr;
  bool required = false;
};

// Every field of ModelConfig with its two spellings (V41_SPEC.md §1.1).
const Field kFields[] = {
#define DEEPINFER_CONFIG_FIELD(type, name, init, hf_key, required) \
  {#name, hf_key, &ModelConfig::name, required},
    DEEPINFER_CONFIG_FIELDS(DEEPINFER_CONFIG_FIELD)
#undef DEEPINFER_CONFIG_FIELD
};

// Finds a dotted path ("rope_scaling.factor") in an object; nullptr if absent or null.
const json* lookup(const json& obj, const std::string& path) {
  const size_t dot = path.find('.');
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(path.substr(0, dot));
  if (it == obj.end() || it->is_null()) return nullptr;
  return dot == std::string::npos ? &*it : lookup(*it, path.substr(dot + 1));
}

// What a field of each FieldPtr alternative expects, for errors.
const char* const kTypeNames[] = {"an integer",        "an integer", "a number",
                                  "a boolean",         "a string",   "a list of integers",
                                  "a list of integers"};

void assign(ModelConfig& c, const Field& f, const json& v, const std::string& where) {
  auto bad = [&] {
    throw Error(str_cat(where, ": expected ", kTypeNames[f.ptr.index()], ", got ", show_json(v)));
  };
  // An integer, or a float with an integral value, within I's range.
  auto as_int = [&]<typename I>(const json& x, I) {
    // Unsigned values past int64 would wrap; floats past it would make the cast undefined.
    if (x.is_number_unsigned() && x.get<uint64_t>() > uint64_t(INT64_MAX)) bad();
    const double d = x.is_number_float() ? x.get<double>() : 0.5;
    if (!x.is_number_integer() && !(d >= -0x1p63 && d < 0x1p63 && d == std::trunc(d))) bad();
    const int64_t n = x.is_number_integer() ? x.get<int64_t>() : int64_t(d);
    if (n < std::numeric_limits<I>::min() || n > std::numeric_limits<I>::max()) bad();
    return I(n);
  };
  std::visit(
      [&](auto ptr) {
        using T = std::remove_reference_t<decltype(c.*ptr)>;
        if constexpr (std::is_same_v<T, int> || std::is_same_v<T, int64_t>) {
          c.*ptr = as_int(v, T());
        } else if constexpr (std::is_same_v<T, double> || std::is_same_v<T, bool> ||
                             std::is_same_v<T, std::string>) {
          if (!(std::is_same_v<T, double> ? v.is_number()
                : std::is_same_v<T, bool> ? v.is_boolean()
                                          : v.is_string()))
            bad();
          c.*ptr = v.get<T>();
        } else {
          if (!v.is_array()) bad();
          T out;
          for (const auto& x : v) out.push_back(as_int(x, typename T::value_type()));
          c.*ptr = std::move(out);
        }
      },
      f.ptr);
}

// --- validation helpers ---

// The value of the integer field with reference key `ref`.
int64_t int_field(const ModelConfig& c, const char* ref) {
  for (const Field& f : kFields) {
    if (std::strcmp(f.ref, ref) != 0) continue;
    if (auto p = std::get_if<int ModelConfig::*>(&f.ptr)) return c.**p;
    return c.*std::get<int64_t ModelConfig::*>(f.ptr);
  }
  DI_CHECK(false, "no config field ", ref);
}

}  // namespace

ModelConfig ModelConfig::parse(const std::string& text, const std::string& label, bool validate) {
  const json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  DI_REQUIRE(!root.is_discarded(), label, ": not valid JSON");
  DI_REQUIRE(root.is_object(), label, ": expected a JSON object");
  ModelConfig c;
  const json* tc = lookup(root, "text_config");
  const bool hf = tc != nullptr;
  DI_REQUIRE(!hf || tc->is_object(), label, ": 'text_config' must be an object");
  const json& src = hf ? *tc : root;
  for (const Field& f : kFields) {
    const json* v = nullptr;
    std::string where;
    if (hf && *f.hf) {
      // Hugging Face names first; top-level keys (token ids) and reference names as fallbacks.
      for (const json* obj : {&src, &root})
        for (const char* k : {f.hf, f.ref})
          if (!v && (v = lookup(*obj, k)))
            where = str_cat(label, ": ", obj == &src ? "text_config." : "", k);
    } else if (!hf) {
      v = lookup(src, f.ref);
      where = str_cat(label, ": ", f.ref);
    }
    DI_REQUIRE(v || !f.required, label, ": missing required field '", hf ? f.hf : f.ref, "'",
               hf ? " in text_config" : "");
    if (v) assign(c, f, *v, where);
  }
  if (!hf) {
    // The reference's `expert_dtype: null`: experts stored in the model's dtype.
    const auto it = root.find("expert_dtype");
    if (it != root.end() && it->is_null()) c.expert_dtype = "";
  } else {
    // Storage formats come from quantization_config in the Hugging Face form.
    const json* q = lookup(src, "quantization_config");
    if (!q) q = lookup(root, "quantization_config");
    if (!q) {
      c.dtype = "bf16";
      c.expert_dtype = "";
    } else {
      DI_REQUIRE(q->is_object(), label, ": quantization_config must be an object");
      const json* m = lookup(*q, "quant_method");
      DI_REQUIRE(m && m->is_string(), label, ": quantization_config.quant_method missing");
      c.dtype = m->get<std::string>();
      const json* e = lookup(*q, "expert_dtype");
      c.expert_dtype = e && e->is_string() ? e->get<std::string>() : "";
      if (c.expert_dtype == c.dtype) c.expert_dtype = "";  // experts in the model's dtype
      if (const json* b = lookup(*q, "weight_block_size"))
        DI_REQUIRE(*b == json::array({32, 32}), label,
                   ": quantization_config.weight_block_size must be [32, 32], got ", show_json(*b));
      if (const json* s = lookup(*q, "scale_fmt"))
        DI_REQUIRE(*s == "ue8m0", label, ": quantization_config.scale_fmt must be \"ue8m0\", got ",
                   show_json(*s));
    }
    if (!lookup(src, "rope_scaling") && !lookup(src, "original_seq_len")) c.original_seq_len = 0;
  }
  if (validate) c.validate(label);
  return c;
}

ModelConfig ModelConfig::load(const std::string& path) {
  std::string file = path;
  std::error_code ec;  // an odd path (too long, no permission) is reported below as unreadable
  DI_REQUIRE(fs::exists(path, ec) || ec, path,
             ": does not exist (expected a checkpoint directory or its config.json)");
  if (fs::is_directory(path, ec)) file = (fs::path(path) / "config.json").string();
  return parse(read_file(file, file), file);
}

std::string ModelConfig::to_json() const {
  nlohmann::ordered_json j;
  for (const Field& f : kFields) std::visit([&](auto ptr) { j[f.ref] = this->*ptr; }, f.ptr);
  if (expert_dtype.empty()) j["expert_dtype"] = nullptr;
  return j.dump(2) + "\n";
}

int ModelConfig::engram_index(int layer) const {
  const auto it = std::ranges::find(engram_layer_ids, layer);
  return it == engram_layer_ids.end() ? -1 : int(it - engram_layer_ids.begin());
}

// --- validation ---

std::vector<LayerRole> layer_roles(const ModelConfig& c, const std::string& label) {
  std::vector<LayerRole> roles(size_t(c.n_layers));
  auto contains = [](const std::vector<int>& v, int x) { return std::ranges::count(v, x) > 0; };
  int last_kv = -1, last_index = -1;
  for (int l = 0; l < c.n_layers; ++l) {
    LayerRole& r = roles[size_t(l)];
    r.ratio = c.compress_ratios[size_t(l)];
    if (r.ratio == 0) continue;
    r.kv_source = contains(c.kv_source_layers, l);
    r.index_source = contains(c.index_source_layers, l);
    if (r.kv_source) last_kv = l;
    DI_REQUIRE(last_kv >= 0, label, ": layer ", l, " has compress ratio ", r.ratio,
               " but kv_source_layers lists no layer at or before it");
    DI_REQUIRE(roles[size_t(last_kv)].ratio == r.ratio, label, ": layer ", l, " (ratio ", r.ratio,
               ") would read the compressed KV of layer ", last_kv,
               ", the latest of kv_source_layers at or before it, whose ratio is ",
               roles[size_t(last_kv)].ratio);
    // A KV source without an indexer owns no index keys, so nothing could select its rows.
    DI_REQUIRE(!r.kv_source || r.index_source, label, ": kv_source_layers lists layer ", l,
               " but index_source_layers does not: no layer would own index keys for its "
               "compressed rows (every KV source must also be an index source)");
    r.kv_from = last_kv;
    if (r.index_source) {
      last_index = l;
      r.key_owner = r.kv_source;
      r.keys_from = last_kv;
      DI_REQUIRE(roles[size_t(last_kv)].key_owner, label, ": index_source_layers lists layer ", l,
                 ", which would read the index keys of KV source layer ", last_kv,
                 ", which is not an index source (it owns no index keys)");
      r.candidate_source = (l == c.candidate_source_layer);
      if (c.candidate_source_layer >= 0 && l > c.candidate_source_layer) {
        r.candidate_consumer = true;
        DI_REQUIRE(roles[size_t(c.candidate_source_layer)].ratio == r.ratio, label,
                   ": candidate consumer layer ", l, " has ratio ", r.ratio,
                   " but the candidate source (candidate_source_layer = ", c.candidate_source_layer,
                   ") has ratio ", roles[size_t(c.candidate_source_layer)].ratio);
      }
    }
    DI_REQUIRE(last_index >= 0, label, ": layer ", l, " has compress ratio ", r.ratio,
               " but index_source_layers lists no layer at or before it to select its "
               "compressed rows");
    DI_REQUIRE(roles[size_t(last_index)].kv_from == last_kv, label, ": layer ", l,
               " would use the top-k list of layer ", last_index, " (index_source_layers)",
               ", which selects rows of a different KV source (", roles[size_t(last_index)].kv_from,
               " vs ", last_kv, ")");
    r.topk_from = last_index;
  }
  if (c.candidate_source_layer >= 0)
    DI_REQUIRE(roles[size_t(c.candidate_source_layer)].index_source, label,
               ": candidate_source_layer = ", c.candidate_source_layer,
               " is not an index source layer");
  return roles;
}

void ModelConfig::validate(const std::string& label) const {
  auto positive = [&](std::initializer_list<const char*> names) {
    for (const char* name : names)
      DI_REQUIRE(int_field(*this, name) > 0, label, ": ", name, " must be > 0, got ",
                 int_field(*this, name));
  };
  auto multiple = [&](const char* name, int64_t m, const char* why) {
    const int64_t v = int_field(*this, name);
    DI_REQUIRE(v % m == 0, label, ": ", name, " = ", v, " must be a multiple of ", m, " (", why,
               ")");
  };
  auto token_id = [&](const char* name) {
    const int64_t v = int_field(*this, name);
    DI_REQUIRE(v >= 0 && v < vocab_size, label, ": ", name, " = ", v,
               " must be a token id in [0, vocab_size)");
  };
  auto layer_list = [&](const char* name, const std::vector<int>& v) {
    for (size_t i = 0; i < v.size(); ++i) {
      DI_REQUIRE(v[i] >= 0 && v[i] < n_layers, label, ": ", name, "[", i, "] = ", v[i],
                 " is not a backbone layer id in [0, ", n_layers, ")");
      DI_REQUIRE(i == 0 || v[i] > v[i - 1], label, ": ", name, " must be strictly increasing, got ",
                 v[i - 1], " then ", v[i]);
    }
  };
  positive({"vocab_size", "dim", "n_layers", "n_heads", "moe_inter_dim", "q_lora_rank", "head_dim",
            "o_lora_rank", "o_groups", "window_size", "hc_mult", "hc_sinkhorn_iters",
            "n_routed_experts", "n_activated_experts"});
  DI_REQUIRE(n_mtp_layers >= 0, label, ": n_mtp_layers must be >= 0");
  DI_REQUIRE(dtype == "fp8" || dtype == "bf16", label, ": dtype = '", dtype,
             "' must be \"fp8\" or \"bf16\"");
  DI_REQUIRE(expert_dtype == "fp4" || expert_dtype.empty(), label, ": expert_dtype = '",
             expert_dtype, "' must be \"fp4\" or null (experts stored as dtype)");
  DI_REQUIRE(score_func == "sqrtsoftplus", label, ": score_func '", score_func,
             "' is not supported (V4.1 uses sqrtsoftplus)");
  DI_REQUIRE(gate_temp > 0, label, ": gate_temp must be > 0");
  DI_REQUIRE(n_shared_experts == 1, label, ": n_shared_experts must be 1, got ", n_shared_experts);
  DI_REQUIRE(n_activated_experts <= n_routed_experts, label, ": n_activated_experts (",
             n_activated_experts, ") exceeds n_routed_experts (", n_routed_experts, ")");
  for (const char* name : {"dim", "q_lora_rank", "moe_inter_dim"})
    multiple(name, 32, "quantized linear inputs are blocks of 32");
  // wo_b's input: the groups' outputs side by side, quantized in blocks across group boundaries.
  DI_REQUIRE(int64_t(o_groups) * o_lora_rank % 32 == 0, label,
             ": o_groups * o_lora_rank = ", o_groups, " * ", o_lora_rank, " = ",
             int64_t(o_groups) * o_lora_rank,
             " must be a multiple of 32 (wo_b's quantized input is blocks of 32)");
  multiple("head_dim", 32, "fp8 window KV blocks of 32");
  DI_REQUIRE(rope_head_dim > 0 && rope_head_dim % 2 == 0 && rope_head_dim <= head_dim, label,
             ": rope_head_dim = ", rope_head_dim, " must be even and in (0, head_dim = ", head_dim,
             "]");
  // The attention output [H * Dh] splits into o_groups groups, each wo_a's input; the kernels read
  // a linear's input in blocks of 32, which G | H always gives (Dh is a multiple of 32).
  DI_REQUIRE(int64_t(n_heads) * head_dim % o_groups == 0, label, ": o_groups = ", o_groups,
             " must divide n_heads * head_dim = ", int64_t(n_heads) * head_dim);
  DI_REQUIRE(int64_t(n_heads) * head_dim / o_groups % 32 == 0, label,
             ": n_heads * head_dim / o_groups = ", int64_t(n_heads) * head_dim / o_groups,
             " (wo_a's input width) must be a multiple of 32");
  DI_REQUIRE(norm_eps >= 0 && hc_eps >= 0, label, ": norm_eps and hc_eps must be >= 0");
  DI_REQUIRE(swiglu_limit >= 0, label, ": swiglu_limit must be >= 0");
  DI_REQUIRE(rope_theta > 0 && compress_rope_theta > 0, label, ": rope thetas must be > 0");
  DI_REQUIRE(original_seq_len >= 0, label, ": original_seq_len must be >= 0");
  if (original_seq_len > 0)
    DI_REQUIRE(rope_factor > 0 && beta_fast > 0 && beta_slow > 0, label,
               ": YaRN needs rope_factor, beta_fast and beta_slow > 0");

  const size_t n_all = size_t(n_layers) + size_t(n_mtp_layers);  // no int overflow
  DI_REQUIRE(compress_ratios.size() == n_all, label, ": compress_ratios has ",
             compress_ratios.size(), " entries, expected n_layers + n_mtp_layers = ", n_all);
  for (size_t l = 0; l < n_all; ++l) {
    DI_REQUIRE(compress_ratios[l] >= 0, label, ": compress_ratios[", l, "] must be >= 0");
    DI_REQUIRE(l < size_t(n_layers) || compress_ratios[l] == 0, label, ": compress_ratios[", l,
               "] (a DSpark layer) must be 0");
  }
  for (const auto& [name, list] : {std::pair{"kv_source_layers", &kv_source_layers},
                                   std::pair{"index_source_layers", &index_source_layers}}) {
    layer_list(name, *list);
    for (int l : *list)
      DI_REQUIRE(compress_ratios[size_t(l)] > 0, label, ": ", name, " lists layer ", l,
                 " whose compress ratio is 0");
  }
  if (std::ranges::any_of(compress_ratios, [](int r) { return r > 0; })) {
    positive({"index_n_heads", "index_topk"});
    multiple("index_head_dim", 32, "fp4 index blocks of 32");
    DI_REQUIRE(index_head_dim >= rope_head_dim, label, ": index_head_dim (", index_head_dim,
               ") must be >= rope_head_dim (", rope_head_dim, ")");
    multiple("head_dim", 16, "fp4 compressed-KV blocks of 16");
  }
  if (candidate_source_layer >= 0) {
    DI_REQUIRE(candidate_source_layer < n_layers, label,
               ": candidate_source_layer = ", candidate_source_layer, " is not a backbone layer");
    positive({"candidate_block_size", "candidate_topk_blocks"});
    DI_REQUIRE(int64_t(candidate_topk_blocks - 1) * candidate_block_size + 1 >= index_topk, label,
               ": (candidate_topk_blocks - 1) * candidate_block_size + 1 = ",
               int64_t(candidate_topk_blocks - 1) * candidate_block_size + 1,
               " must be >= index_topk = ", index_topk, " (otherwise masked rows can be selected)");
  }
  if (has_dspark()) {
    token_id("dspark_noise_token_id");
    DI_REQUIRE(!dspark_target_layer_ids.empty(), label,
               ": dspark_target_layer_ids must list the backbone layers the draft head reads");
    layer_list("dspark_target_layer_ids", dspark_target_layer_ids);
    positive({"dspark_markov_rank"});
    multiple("dspark_markov_rank", 32, "the Markov head's linear reads its input in blocks of 32");
    DI_REQUIRE(dspark_n_routed_experts >= 0 && dspark_n_activated_experts >= 0 &&
                   dspark_topk() <= dspark_experts(),
               label, ": dspark_num_experts_per_tok (", dspark_topk(),
               ") must be in [1, dspark_n_routed_experts = ", dspark_experts(), "]");
  }
  if (has_vision()) {
    positive({"vision_dim", "vision_n_heads", "vision_inter_dim", "vision_patch_size",
              "vision_downsample_ratio", "vision_max_n_token"});
    DI_REQUIRE(vision_dim % (4 * vision_n_heads) == 0, label, ": vision_dim (", vision_dim,
               ") must be a multiple of 4 x vision_n_heads (", vision_n_heads,
               "): each head's 2D rotary halves");
    DI_REQUIRE(vision_max_n_token >= 4, label, ": vision_max_n_token = ", vision_max_n_token,
               " must hold a span of at least one image token (4)");
    token_id("image_token_id");
  }
  // Roles check the sharing structure (who reads whose KV, keys and top-k).
  (void)layer_roles(*this, label);

  // Engram.
  if (!engram_layer_ids.empty()) {
    layer_list("engram_layer_ids", engram_layer_ids);
    DI_REQUIRE(engram_num_embeddings.size() == engram_layer_ids.size(), label,
               ": engram_num_embeddings has ", engram_num_embeddings.size(),
               " entries, expected one per Engram layer (", engram_layer_ids.size(), ")");
    for (int64_t n : engram_num_embeddings)
      DI_REQUIRE(n > 0, label, ": engram_num_embeddings[] must be > 0, got ", n);
    DI_REQUIRE(engram_max_ngram_size >= 2, label, ": engram_max_ngram_size must be >= 2, got ",
               engram_max_ngram_size);
    positive({"engram_n_heads", "engram_vocab_size", "engram_compressed_vocab_size"});
    DI_REQUIRE(engram_head_dim > 0 && engram_head_dim % 32 == 0, label,
               ": engram_head_dim = ", engram_head_dim,
               " must be a positive multiple of 32 (fp8 table blocks)");
    token_id("engram_pad_id");
  }
}

}  // namespace deepinfer
