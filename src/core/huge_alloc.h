// Long-lived, read-mostly buffers (repacked weights, benchmark buffers) on transparent huge
// pages where the kernel allows them: a decode step streams gigabytes of weights, and with 4 KiB
// pages every 4 KiB of it costs a TLB miss (about 5-10 % of the read bandwidth on the machines
// measured; docs/benchmarks.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace deepinfer {

// `bytes` bytes, 64-byte aligned, released when the last copy of the pointer goes. Small
// requests share 2 MiB-aligned chunks (so that a model's many small experts sit on huge pages
// too); a chunk is freed when every buffer carved from it is. Throws on exhaustion.
std::shared_ptr<uint8_t> huge_alloc(size_t bytes);

}  // namespace deepinfer
