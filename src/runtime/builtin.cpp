#include "runtime/builtin.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "kernels/engram_hash.h"
#include "tokenizer/engram_map.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {

namespace fs = std::filesystem;

std::string cache_dir() {
  if (const char* d = std::getenv("DEEPINFER_CACHE"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return (fs::path(x) / "deepinfer").string();
  if (const char* h = std::getenv("HOME"); h && *h)
    return (fs::path(h) / ".cache" / "deepinfer").string();
  return (fs::temp_directory_path() / "deepinfer-cache").string();
}

uint64_t make_tiny_checkpoint(const std::string& dir, const TinyCheckpoint& spec,
                              bool keep_existing) {
  ModelConfig c =
      spec.random ? random_tiny_config(spec.config_seed) : tiny_preset_config(spec.preset);
  if (spec.vision) {
    c.vision_n_layers = 2;
    c.vision_dim = 64;
    c.vision_n_heads = 4;
    c.vision_inter_dim = 96;
    c.vision_patch_size = 14;
    c.vision_downsample_ratio = 3;
    c.vision_max_n_token = 64;
    c.vision_min_pixels = 56 * 56;
    c.image_token_id = c.vocab_size - 2;
  }
  fs::path tok_json, tok_config;
  if (!spec.tokenizer.empty()) {
    const fs::path t(spec.tokenizer);
    tok_json = fs::is_directory(t) ? t / "tokenizer.json" : t;
    tok_config = tok_json.parent_path() / "tokenizer_config.json";
    DI_REQUIRE(fs::exists(tok_json), spec.tokenizer, ": no tokenizer.json there");
    const auto tok = Tokenizer::load(tok_json.string());
    DI_REQUIRE(tok->vocab_size() <= c.vocab_size, spec.tokenizer, ": ", tok->vocab_size(),
               " tokens do not fit ", spec.label(), "'s vocab of ", c.vocab_size);
    c.engram_compressed_vocab_size = build_engram_token_map(*tok).compressed_vocab_size;
  }
  // Each Engram table has the sum of its layer's hash primes as rows, as the reference sizes
  // them; the primes depend on engram_vocab_size only, not on the compressed vocabulary.
  if (!c.engram_layer_ids.empty()) {
    const std::vector<int64_t> ids(c.engram_layer_ids.begin(), c.engram_layer_ids.end());
    c.engram_num_embeddings =
        make_engram_tables(ids, c.engram_max_ngram_size, c.engram_n_heads, c.engram_vocab_size,
                           c.engram_compressed_vocab_size)
            .rows;
  }
  const fs::path final_dir(dir);
  const fs::path tmp = final_dir.string() + ".tmp" + std::to_string(::getpid());
  fs::remove_all(tmp);
  TinyWriteOptions opt = spec;
  opt.label = spec.label();
  // Small presets get several shards so the index path is exercised (random configs, being
  // smaller, shards split inside layers); big ones 1 GiB shards.
  opt.max_shard_bytes = spec.random              ? (uint64_t(96) << 10)
                        : spec.preset == "small" ? (uint64_t(1) << 30)
                                                 : (uint64_t(4) << 20);
  const uint64_t bytes = write_tiny_checkpoint(tmp.string(), c, opt);
  if (!tok_json.empty()) {
    fs::copy_file(tok_json, tmp / "tokenizer.json");
    if (fs::exists(tok_config)) fs::copy_file(tok_config, tmp / "tokenizer_config.json");
  }
  std::error_code ec;
  if (keep_existing && fs::exists(final_dir / "config.json")) {
    fs::remove_all(tmp);
    return bytes;
  }
  if (fs::exists(final_dir)) fs::remove_all(final_dir, ec);
  fs::rename(tmp, final_dir, ec);
  if (ec) {
    // Another process may have created it at the same time; keep theirs if it is complete.
    fs::remove_all(tmp);
    DI_REQUIRE(fs::exists(final_dir / "config.json"), dir, ": cannot create: ", ec.message());
  }
  return bytes;
}

std::string default_model_dir() {
  const fs::path dir = fs::path(cache_dir()) / "models" / "tiny-seed0";
  if (!fs::exists(dir / "config.json") || !fs::exists(dir / "model.safetensors.index.json")) {
    fs::create_directories(dir.parent_path());
    std::fprintf(stderr, "deepinfer: creating the built-in tiny model in %s\n", dir.c_str());
    make_tiny_checkpoint(dir.string(), TinyCheckpoint{}, /*keep_existing=*/true);
  }
  return dir.string();
}

}  // namespace deepinfer
