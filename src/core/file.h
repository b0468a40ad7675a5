// Whole-file reads (configs, tokenizers, checkpoint indexes, images, prompt files).
#pragma once

#include <cstdint>
#include <string>

namespace deepinfer {

// The bytes of the file at `path`; "<what>: cannot read" when it cannot be opened or read.
// Reading stops once more than `max_bytes` are in, so that a caller refusing larger files (their
// result is longer than max_bytes) does not read all of one.
std::string read_file(const std::string& path, const std::string& what,
                      size_t max_bytes = SIZE_MAX);

}  // namespace deepinfer
