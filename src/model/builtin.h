// Synthetic checkpoints from presets, and the built-in tiny model: created on first use in a cache
// directory ($DEEPINFER_CACHE, else $XDG_CACHE_HOME/deepinfer, else ~/.cache/deepinfer), so
// `deepinfer generate` works with no download.
#pragma once

#include <cstdint>
#include <string>

#include "io/config.h"

namespace deepinfer {

std::string cache_dir();
// A preset config with everything derived filled in (Engram table rows).
ModelConfig preset_config(const std::string& preset);
// Writes preset `preset` with `seed` into `dir` (atomically: a temporary directory renamed into
// place). With `tokenizer` (a tokenizer.json, or a directory holding it and tokenizer_config.json)
// the tokenizer files are copied in and engram_compressed_vocab_size is set to the size of its
// Engram token map, so text prompts work. Returns the tensor bytes written.
uint64_t make_tiny_checkpoint(const std::string& dir, const std::string& preset, uint64_t seed,
                              const std::string& tokenizer = "");
// The directory of the built-in model (preset tiny, seed 0), creating it if needed.
std::string default_model_dir();

}  // namespace deepinfer
