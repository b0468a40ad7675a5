// Synthetic checkpoints from presets, and the built-in tiny model: created on first use in a cache
// directory ($DEEPINFER_CACHE, else $XDG_CACHE_HOME/deepinfer, else ~/.cache/deepinfer), so
// `deepinfer generate` works with no download.
#pragma once

#include <cstdint>
#include <string>

#include "io/config.h"
#include "io/tiny.h"

namespace deepinfer {

std::string cache_dir();

// The weights' seed and layout as for write_tiny_checkpoint; max_shard_bytes is chosen from the
// preset.
struct TinyCheckpoint : TinyWriteOptions {
  std::string preset = "tiny";
  bool random = false;  // draw the config with random_config(config_seed) instead of the preset
  uint64_t config_seed = 0;
  // A tokenizer.json, or a directory holding it and tokenizer_config.json: copied in, and
  // engram_compressed_vocab_size set to the size of its Engram token map, so text prompts work.
  std::string tokenizer;
  // Add a small vision tower (2 ViT blocks of 64, 4 heads, patch 14, 3x3 aligner, at most 64
  // image tokens; the image token is vocab_size - 2) to the preset.
  bool vision = false;

  // Where the config comes from, as messages name it: "preset NAME" or "random config SEED".
  std::string label() const {
    return random ? "random config " + std::to_string(config_seed) : "preset " + preset;
  }
};
// Writes the checkpoint into `dir` (atomically: a temporary directory renamed into place).
// Returns the tensor bytes written. An existing checkpoint in `dir` is replaced, or, with
// keep_existing (caches that several processes fill at once), kept: another process may be
// reading it, so the new copy is discarded.
uint64_t make_tiny_checkpoint(const std::string& dir, const TinyCheckpoint& spec,
                              bool keep_existing = false);
// The directory of the built-in model (preset tiny, seed 0), creating it if needed.
std::string default_model_dir();

}  // namespace deepinfer
