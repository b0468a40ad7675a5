#include "io/checkpoint.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "core/error.h"

namespace deepinfer {

std::string scale_name(const std::string& weight_name) {
  if (weight_name.size() > 7 && weight_name.ends_with(".weight"))
    return weight_name.substr(0, weight_name.size() - 7) + ".scale";
  return weight_name + ".scale";
}

namespace {

// --- loading helpers ---

// The vision tower's tensors and the image tokens' router biases.
bool is_vision_part(const std::string& name) {
  for (const char* p : {"vision.", "aligner.", "image_start", "image_end", "image_newline"})
    if (name.starts_with(p)) return true;
  const std::string vl = ".ffn.gate.bias_vl";
  return name.size() > vl.size() && name.ends_with(vl);
}

// The slot kinds whose weights may be stored quantized, with a `.scale` tensor.
bool takes_scale(SlotKind k) {
  return k == SlotKind::QLinear || k == SlotKind::Bf16Linear || k == SlotKind::Fp8Table;
}

std::string describe(const TensorInfo& t) {
  return str_cat(dtype_name(t.dtype), " ", t.shape.str());
}

// The stored forms a slot kind accepts, for refusals.
std::string accepted_forms(SlotKind k, const Shape& shape) {
  const std::string s = shape.str();
  if (k == SlotKind::Fp32 || k == SlotKind::Fp32Linear)
    return str_cat("F32 ", s, " (or BF16/F16, widened exactly)");
  if (k == SlotKind::Bf16) return str_cat("BF16 ", s, " (or F32/F16, rounded to bf16)");
  if (k == SlotKind::Fp8Table)
    return str_cat("F8_E4M3 ", s, " with F8_E8M0 scales [", shape[0], ", ", shape[1] / 32, "]");
  const int64_t o = shape[0], i = shape[1];
  const std::string fp8 =
      str_cat("F8_E4M3 ", s, " with F8_E8M0 scales [", (o + 31) / 32, ", ", (i + 31) / 32, "]");
  if (k == SlotKind::Bf16Linear)
    return str_cat("BF16 ", s, " (or F32/F16, rounded to bf16) without a scale, or ", fp8);
  return str_cat(fp8, ", packed fp4 as I8 [", o, ", ", i / 2, "] (or F4 ", s,
                 ") with F8_E8M0 scales [", o, ", ", i / 32, "], or BF16/F32/F16 ", s,
                 " without a scale");
}

}  // namespace

// --- schema ---

// The schema of config_; each tensor is bound into its slot (sized here) when `bind_slots`.
std::vector<TensorSpec> Checkpoint::schema(int expert_begin, int expert_end, bool with_dspark,
                                           bool with_vision, bool bind_slots) {
  const ModelConfig& c = config_;
  if (expert_end < 0) expert_end = c.n_routed_experts;
  const auto roles = layer_roles(c);
  const int64_t D = c.dim, M = c.hc_mult, H = c.n_heads, Dh = c.head_dim, Q = c.q_lora_rank;
  const int64_t G = c.o_groups, Ro = c.o_lora_rank, F = c.moe_inter_dim;
  const int64_t n_mix = (2 + M) * M;
  using WF = WeightFormat;
  using SK = SlotKind;
  // The release's storage of the model's default-dtype linears and of the routed experts.
  const WF dense = c.dtype == "fp8" ? WF::Fp8Block : WF::BF16;
  const WF expert = c.expert_dtype == "fp4" ? WF::Fp4Row : dense;
  std::vector<TensorSpec> s;
  auto add = [&](std::string name, SK k, WF f, Shape shape, Weight& slot) {
    s.push_back({std::move(name), k, f, shape});
    if (bind_slots) slot = bind(s.back());
  };
  add("embed.weight", SK::Bf16, WF::BF16, {c.vocab_size, D}, embed);
  // One block: backbone layer `l` (prefix "layers.<l>.") or DSpark stage (prefix "mtp.<k>.",
  // window-only role, no Engram: z = -1), with the routed experts [e_begin, e_end) of n_experts.
  auto add_layer = [&](const std::string& p, const LayerRole& r, LayerWeights& L, int n_experts,
                       int e_begin, int e_end, int z, bool vl) {
    L.experts.resize(size_t(e_end - e_begin));
    add(p + "attn_norm.weight", SK::Bf16, WF::BF16, {D}, L.attn_norm);
    add(p + "ffn_norm.weight", SK::Bf16, WF::BF16, {D}, L.ffn_norm);
    add(p + "hc_attn_fn", SK::Fp32Linear, WF::F32, {n_mix, M * D}, L.hc_attn_fn);
    add(p + "hc_attn_base", SK::Fp32, WF::F32, {n_mix}, L.hc_attn_base);
    add(p + "hc_attn_scale", SK::Fp32, WF::F32, {3}, L.hc_attn_scale);
    add(p + "hc_ffn_fn", SK::Fp32Linear, WF::F32, {n_mix, M * D}, L.hc_ffn_fn);
    add(p + "hc_ffn_base", SK::Fp32, WF::F32, {n_mix}, L.hc_ffn_base);
    add(p + "hc_ffn_scale", SK::Fp32, WF::F32, {3}, L.hc_ffn_scale);
    const std::string a = p + "attn.";
    add(a + "wq_a.weight", SK::QLinear, dense, {Q, D}, L.wq_a);
    add(a + "q_norm.weight", SK::Bf16, WF::BF16, {Q}, L.q_norm);
    add(a + "wq_b.weight", SK::QLinear, dense, {H * Dh, Q}, L.wq_b);
    add(a + "wkv.weight", SK::QLinear, dense, {Dh, D}, L.wkv);
    add(a + "kv_norm.weight", SK::Bf16, WF::BF16, {Dh}, L.kv_norm);
    add(a + "attn_sink", SK::Fp32, WF::F32, {H}, L.attn_sink);
    add(a + "wo_a.weight", SK::Bf16Linear, dense, {G * Ro, H * Dh / G}, L.wo_a);
    add(a + "wo_b.weight", SK::QLinear, dense, {D, G * Ro}, L.wo_b);
    if (r.kv_source) {
      const SK cmp = r.ratio > 1 ? SK::Fp32Linear : SK::Bf16Linear;
      add(a + "compressor.wkv.weight", cmp, WF::BF16, {Dh, D}, L.cmp_wkv);
      if (r.ratio > 1) add(a + "compressor.wgate.weight", cmp, WF::BF16, {Dh, D}, L.cmp_wgate);
      add(a + "compressor.norm.weight", SK::Bf16, WF::BF16, {Dh}, L.cmp_norm);
    }
    if (r.index_source) {
      add(a + "indexer.wq_b.weight", SK::QLinear, dense, {c.index_n_heads * c.index_head_dim, Q},
          L.idx_wq_b);
      add(a + "indexer.weights_proj.weight", SK::Bf16Linear, WF::BF16, {c.index_n_heads, D},
          L.idx_weights_proj);
      if (r.key_owner) {
        add(a + "indexer.wk.weight", SK::Bf16Linear, WF::BF16, {c.index_head_dim, Dh}, L.idx_wk);
        add(a + "indexer.k_norm.weight", SK::Bf16, WF::BF16, {c.index_head_dim}, L.idx_k_norm);
      }
    }
    const std::string f = p + "ffn.";
    add(f + "gate.weight", SK::Bf16, WF::BF16, {n_experts, D}, L.gate);
    add(f + "gate.bias", SK::Fp32, WF::F32, {n_experts}, L.gate_bias);
    if (vl) add(f + "gate.bias_vl", SK::Fp32, WF::F32, {n_experts}, L.gate_bias_vl);
    auto add_expert = [&](const std::string& x, WF format, ExpertWeights& e) {
      add(x + "w1.weight", SK::QLinear, format, {F, D}, e.w1);
      add(x + "w2.weight", SK::QLinear, format, {D, F}, e.w2);
      add(x + "w3.weight", SK::QLinear, format, {F, D}, e.w3);
    };
    for (int e = e_begin; e < e_end; ++e)
      add_expert(f + "experts." + std::to_string(e) + ".", expert, L.experts[size_t(e - e_begin)]);
    add_expert(f + "shared_experts.", dense, L.shared);
    if (z >= 0) {
      const std::string e = p + "engram.";
      add(e + "embed.weight", SK::Fp8Table, WF::Fp8Row,
          {c.engram_num_embeddings[size_t(z)], c.engram_head_dim}, L.engram_table);
      add(e + "wkv.weight", SK::QLinear, dense,
          {(M + 1) * D, c.engram_columns() * c.engram_head_dim}, L.engram_wkv);
      add(e + "q_weight", SK::Bf16, WF::BF16, {M, D}, L.engram_q);
      add(e + "k_weight", SK::Bf16, WF::BF16, {M, D}, L.engram_k);
    }
  };
  layers.resize(size_t(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l)
    add_layer("layers." + std::to_string(l) + ".", roles[size_t(l)], layers[size_t(l)],
              c.n_routed_experts, expert_begin, expert_end, c.engram_index(l),
              with_vision && c.has_vision());
  add("norm.weight", SK::Bf16, WF::BF16, {D}, norm);
  add("head.weight", SK::Fp32Linear, WF::BF16, {c.vocab_size, D}, head);
  if (with_dspark && c.has_dspark()) {
    // The draft head (V41_SPEC.md §10.4): window-only stages with every one of their experts on
    // every rank, main_proj/main_norm in stage 0, the heads in the last stage.
    DsparkWeights& dw = dspark;
    dw.stages.resize(size_t(c.n_mtp_layers));
    const int64_t R = c.dspark_markov_rank;
    for (int k = 0; k < c.n_mtp_layers; ++k) {
      const std::string p = "mtp." + std::to_string(k) + ".";
      add_layer(p, LayerRole{}, dw.stages[size_t(k)], c.dspark_experts(), 0, c.dspark_experts(), -1,
                false);
      if (k == 0) {
        add(p + "main_proj.weight", SK::QLinear, dense,
            {D, int64_t(c.dspark_target_layer_ids.size()) * D}, dw.main_proj);
        add(p + "main_norm.weight", SK::Bf16, WF::BF16, {D}, dw.main_norm);
      }
      if (k == c.n_mtp_layers - 1) {
        add(p + "norm.weight", SK::Bf16, WF::BF16, {D}, dw.norm);
        add(p + "markov_head.embed.weight", SK::Bf16, WF::BF16, {c.vocab_size, R}, dw.markov_embed);
        add(p + "markov_head.head.weight", SK::Fp32Linear, WF::BF16, {c.vocab_size, R},
            dw.markov_head);
        add(p + "confidence_head.proj.weight", SK::Fp32Linear, WF::BF16, {1, D + R}, dw.confidence);
      }
    }
  }
  if (with_vision && c.has_vision()) {
    const int64_t Dv = c.vision_dim, Fv = c.vision_inter_dim, p = c.vision_patch_size;
    const int64_t r = c.vision_downsample_ratio;
    VisionWeights& v = vision;
    v.blocks.resize(size_t(c.vision_n_layers));
    add("vision.patch_embed.proj.weight", SK::Bf16, WF::BF16, {Dv, 3 * p * p}, v.patch_embed);
    add("vision.patch_embed.proj.bias", SK::Bf16, WF::BF16, {Dv}, v.patch_embed_bias);
    for (int i = 0; i < c.vision_n_layers; ++i) {
      const std::string b = "vision.blocks." + std::to_string(i) + ".";
      VisionBlockWeights& B = v.blocks[size_t(i)];
      add(b + "norm1.weight", SK::Bf16, WF::BF16, {Dv}, B.norm1);
      add(b + "attn.wqkv.weight", SK::Bf16, WF::BF16, {3 * Dv, Dv}, B.wqkv);
      add(b + "attn.wqkv.bias", SK::Bf16, WF::BF16, {3 * Dv}, B.wqkv_bias);
      add(b + "attn.wo.weight", SK::Bf16, WF::BF16, {Dv, Dv}, B.wo);
      add(b + "attn.wo.bias", SK::Bf16, WF::BF16, {Dv}, B.wo_bias);
      add(b + "norm2.weight", SK::Bf16, WF::BF16, {Dv}, B.norm2);
      add(b + "mlp.w1.weight", SK::Bf16, WF::BF16, {2 * Fv, Dv}, B.w1);
      add(b + "mlp.w2.weight", SK::Bf16, WF::BF16, {Dv, Fv}, B.w2);
    }
    add("vision.norm.weight", SK::Bf16, WF::BF16, {Dv}, v.norm);
    add("aligner.w1.weight", SK::Bf16, WF::BF16, {D, Dv * r * r}, v.aligner_w1);
    add("aligner.w1.bias", SK::Bf16, WF::BF16, {D}, v.aligner_b1);
    add("aligner.w2.weight", SK::Bf16, WF::BF16, {D, D}, v.aligner_w2);
    add("aligner.w2.bias", SK::Bf16, WF::BF16, {D}, v.aligner_b2);
    add("image_start", SK::Bf16, WF::BF16, {D}, v.image_start);
    add("image_end", SK::Bf16, WF::BF16, {D}, v.image_end);
    add("image_newline", SK::Bf16, WF::BF16, {D}, v.image_newline);
  }
  return s;
}

std::vector<TensorSpec> checkpoint_schema(const ModelConfig& c, int expert_begin, int expert_end,
                                          bool dspark, bool vision) {
  Checkpoint scratch;  // its slots are left unbound
  scratch.config_ = c;
  return scratch.schema(expert_begin, expert_end, dspark, vision, false);
}

uint64_t tensor_spec_bytes(const TensorSpec& s) {
  Weight w;
  w.format = s.format;
  w.shape = s.shape;
  w.data = &w;  // any non-null pointer: nbytes() only needs the format and shape
  return w.nbytes();
}

WeightFootprint weight_footprint(const ModelConfig& c) {
  WeightFootprint f;
  const double expert_share = double(c.n_activated_experts) / double(c.n_routed_experts);
  for (const TensorSpec& s : checkpoint_schema(c)) {
    const uint64_t b = tensor_spec_bytes(s);
    f.total += b;
    const std::string& n = s.name;
    if (n.starts_with("mtp.")) {
      f.draft_head += b;
    } else if (is_vision_part(n)) {
      f.vision += b;  // read per image, not per token
    } else if (n == "embed.weight") {
      f.dense_per_token += b / uint64_t(c.vocab_size);
    } else if (n.find(".ffn.experts.") != std::string::npos) {
      f.experts_per_token += uint64_t(double(b) * expert_share);
    } else if (n.find(".engram.embed.") != std::string::npos) {
      f.dense_per_token += uint64_t(c.engram_columns()) * (b / uint64_t(s.shape[0]));
    } else {
      if (n == "head.weight") f.head = b;
      f.dense_per_token += b;
    }
  }
  f.per_token = f.dense_per_token + f.experts_per_token;
  return f;
}

// --- loading ---

std::string loaded_form(SlotKind kind, const Weight& w) {
  const bool f32 = w.format == WeightFormat::F32, fp8 = w.format == WeightFormat::Fp8Block;
  switch (kind) {
    case SlotKind::QLinear:
      if (fp8) return "fp8 e4m3 + e8m0 32x32 -> act_quant + fp8 QLin";
      if (w.format == WeightFormat::Fp4Row) return "fp4 e2m1 + e8m0 per 32 -> act_quant + fp4 QLin";
      return str_cat(f32 ? "f32" : "bf16", " values -> plain linear (input not quantized)");
    case SlotKind::Bf16Linear:
      return fp8 ? "fp8 dequantized (exact) -> plain bf16 linear" : "bf16 -> plain bf16 linear";
    case SlotKind::Fp32Linear:
      return f32 ? "f32 -> fp32 linear" : "bf16 widened -> fp32 linear";
    case SlotKind::Fp32:
      return "f32";
    case SlotKind::Bf16:
      return "bf16";
    case SlotKind::Fp8Table:
      return "fp8 e4m3 rows + e8m0 per 32 (table)";
  }
  return "?";
}

// A float tensor's values as `want`: F32, or BF16 rounded to nearest even (as the reference's
// load does).
std::vector<uint8_t> converted(const TensorInfo& t, DType want) {
  const size_t n = size_t(t.shape.numel()), size = want == DType::F32 ? 4 : 2;
  std::vector<uint8_t> out(n * size);
  const size_t in = t.dtype == DType::F32 ? 4 : 2;
  for (size_t i = 0; i < n; ++i) {
    float v;
    uint16_t h;
    std::memcpy(in == 4 ? static_cast<void*>(&v) : &h, t.data + in * i, in);
    if (in == 2) v = t.dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    if (size == 2) h = f32_to_bf16(v);
    std::memcpy(out.data() + size * i, size == 4 ? static_cast<const void*>(&v) : &h, size);
  }
  return out;
}

const uint8_t* Checkpoint::own(std::vector<uint8_t> bytes) {
  converted_bytes += bytes.size();
  return owned_.emplace_back(std::move(bytes)).data();
}

// One slot of the table in checkpoint.h: the stored dtype decides the format and whether the
// input is quantized.
Weight Checkpoint::bind(const TensorSpec& spec) {
  const TensorInfo* t = store_->find(spec.name);
  DI_CHECK(t, spec.name);  // load() checked that every schema tensor is present
  Weight w;
  w.name = spec.name;
  w.shape = spec.shape;
  const SlotKind k = spec.kind;
  const TensorInfo* st = takes_scale(k) ? store_->find(scale_name(spec.name)) : nullptr;
  const bool fp8 = t->dtype == DType::E4M3 && t->shape == spec.shape;
  const bool fp4 = spec.shape.ndim == 2 && ((t->dtype == DType::E2M1 && t->shape == spec.shape) ||
                                            ((t->dtype == DType::I8 || t->dtype == DType::U8) &&
                                             t->shape == Shape{spec.shape[0], spec.shape[1] / 2}));
  const bool flt = (t->dtype == DType::F32 || t->dtype == DType::BF16 || t->dtype == DType::F16) &&
                   t->shape == spec.shape;
  // The scales: E8M0/U8, or F32 holding exact powers of two (converted to e8m0).
  auto scales = [&](WeightFormat f) {
    const Shape ss = f == WeightFormat::Fp8Block ? Shape{(w.rows() + 31) / 32, (w.cols() + 31) / 32}
                                                 : Shape{w.rows(), w.cols() / 32};
    DI_REQUIRE(st, dir_, ": missing tensor '", scale_name(spec.name), "' (F8_E8M0 scales ",
               ss.str(), " of the ", describe(*t), " weight '", spec.name, "')");
    DI_REQUIRE(st->shape == ss, dir_, ": tensor '", st->name, "' is ", describe(*st),
               ", expected shape ", ss.str());
    w.format = f;
    w.data = t->data;
    w.scale = st->data;
    w.scale_cols = ss[1];
    if (st->dtype == DType::E8M0 || st->dtype == DType::U8) return;
    DI_REQUIRE(st->dtype == DType::F32, dir_, ": tensor '", st->name, "' is ", describe(*st),
               ", expected F8_E8M0 scales (or F32 powers of two)");
    std::vector<uint8_t> e8m0(size_t(ss.numel()));
    for (size_t i = 0; i < e8m0.size(); ++i) {
      float v;
      std::memcpy(&v, st->data + 4 * i, 4);
      e8m0[i] = f32_to_e8m0(v);
      DI_REQUIRE(v > 0 && e8m0_to_f32(e8m0[i]) == v, dir_, ": tensor '", st->name, "' element ", i,
                 " = ", v, " is not a power of two (scales must be e8m0-representable)");
    }
    w.scale = own(std::move(e8m0));
  };
  if (flt && st)
    throw Error(str_cat(dir_, ": tensor '", scale_name(spec.name), "' scales '", spec.name,
                        "', which is stored ", describe(*t),
                        ": only fp8/fp4 weights carry scales (expected ",
                        accepted_forms(spec.kind, spec.shape), ")"));
  if (fp8 && takes_scale(k)) {
    // In a Bf16Linear, e4m3 x 2^k is exact in bf16: no input quantization.
    scales(k == SlotKind::Fp8Table ? WeightFormat::Fp8Row : WeightFormat::Fp8Block);
    w.quant_input = k == SlotKind::QLinear;
  } else if (fp4 && k == SlotKind::QLinear) {
    scales(WeightFormat::Fp4Row);
    w.quant_input = true;
  } else if (flt && k != SlotKind::Fp8Table) {
    // Stored bf16 stays bf16 where the slot computes on the stored values (QLinear: the
    // reference's F.linear) or widens exactly (Fp32Linear).
    const bool keep_bf16 =
        t->dtype == DType::BF16 && (k == SlotKind::QLinear || k == SlotKind::Fp32Linear);
    const bool bf16 = k == SlotKind::Bf16 || k == SlotKind::Bf16Linear || keep_bf16;
    const DType want = bf16 ? DType::BF16 : DType::F32;  // other float dtypes are converted
    w.format = bf16 ? WeightFormat::BF16 : WeightFormat::F32;
    w.data = t->dtype == want ? t->data : own(converted(*t, want));
  } else {
    throw Error(str_cat(dir_, ": tensor '", spec.name, "' is ", describe(*t), ", expected ",
                        accepted_forms(k, spec.shape)));
  }
  bound_bytes += w.nbytes();
  forms.emplace_back(spec.name, str_cat(dtype_name(t->dtype), " -> ", loaded_form(k, w)));
  return w;
}

std::unique_ptr<Checkpoint> Checkpoint::load(const std::string& dir, int expert_begin,
                                             int expert_end) {
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->dir_ = dir;
  ck->config_ = ModelConfig::load(dir);
  const ModelConfig& c = ck->config_;
  ck->store_ = TensorStore::open_dir(dir);
  ck->expert_begin = expert_begin;
  ck->expert_end = expert_end < 0 ? c.n_routed_experts : expert_end;
  DI_REQUIRE(0 <= ck->expert_begin && ck->expert_begin <= ck->expert_end &&
                 ck->expert_end <= c.n_routed_experts,
             dir, ": expert range [", ck->expert_begin, ", ", ck->expert_end, ") is outside [0, ",
             c.n_routed_experts, ")");

  // Every tensor in the files must be part of the schema (all experts) or a known unused part.
  // The draft head is loaded when the files hold any of it (then all of it is required).
  // The vision tower too is loaded when the files hold any of it.
  const std::vector<std::string> names = ck->store_->names();
  auto holds = [&](const char* prefix) {
    return std::ranges::any_of(names, [&](const std::string& n) { return n.starts_with(prefix); });
  };
  ck->has_dspark = holds("mtp.") && c.has_dspark();
  ck->has_vision = holds("vision.") && c.has_vision();
  const std::vector<TensorSpec> all = checkpoint_schema(c, 0, -1, ck->has_dspark, ck->has_vision);
  std::set<std::string> known;
  for (const auto& s : all) {
    known.insert(s.name);
    if (takes_scale(s.kind)) known.insert(scale_name(s.name));
  }
  std::vector<std::string> unexpected;
  for (const std::string& name : names) {
    if (known.count(name)) continue;
    // With the draft head loaded, an mtp.* tensor outside its schema is a mistake, except the
    // stages' aliases of the shared embedding and head (V41_SPEC.md §2.1).
    const size_t dot = name.find('.', 4);  // after the stage number
    const std::string rest = dot == std::string::npos ? "" : name.substr(dot);
    const bool alias = rest == ".embed.weight" || rest == ".head.weight";
    if (name.starts_with("mtp.") ? !ck->has_dspark || alias : is_vision_part(name))
      ck->skipped_tensors.push_back(name);
    else
      unexpected.push_back(name);
  }
  if (!unexpected.empty()) {
    std::string list;
    for (size_t i = 0; i < unexpected.size() && i < 8; ++i) list += "\n  " + unexpected[i];
    if (unexpected.size() > 8) list += str_cat("\n  ... and ", unexpected.size() - 8, " more");
    throw Error(str_cat(dir, ": ", unexpected.size(),
                        " tensor(s) are not part of the V4.1 model this config describes:", list));
  }
  // Presence of every expert (also those another rank serves) is checked from the headers.
  for (const auto& s : all)
    DI_REQUIRE(ck->store_->find(s.name), dir, ": missing tensor '", s.name, "' (",
               accepted_forms(s.kind, s.shape), ")");

  // Bind in schema order, each tensor into its slot.
  ck->schema(ck->expert_begin, ck->expert_end, ck->has_dspark, ck->has_vision, true);
  return ck;
}

void Checkpoint::release_resident(const Weight& w) const {
#ifdef MADV_PAGEOUT  // Linux 5.4; older kernels ignore unknown advice anyway
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(w.data);
  const uintptr_t lo = (begin + page - 1) & ~(page - 1);  // whole pages inside the values only
  const uintptr_t hi = (begin + uintptr_t(w.value_bytes())) & ~(page - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_PAGEOUT);
#else
  (void)w;
#endif
}

}  // namespace deepinfer
