// Heap allocations per engine step, counted by replacing the global operator new in this binary:
// a decode step (and a prefill chunk of a fixed size) must not allocate per layer, per row or per
// expert. The figure is (allocations over a long run - over a short run) / extra steps, so one-off
// growth (the first steps sizing their buffers) does not count. Fails when a per-step allocation
// creeps back into the forward pass, the sampler, the scheduler or the engine loop.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>

#include "engine/engine.h"
#include "golden/model_harness.h"

namespace {
std::atomic<int64_t> g_allocs{0};
}  // namespace

void* operator new(std::size_t n) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  return ::operator new(n);
}
void* operator new(std::size_t n, std::align_val_t a) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  const std::size_t al = std::size_t(a);
  if (void* p = std::aligned_alloc(al, (n + al - 1) / al * al)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return ::operator new(n, a);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}

namespace deepinfer::testing {
namespace {

// Allocations per step in steady state: `batch` sequences with `prompt` tokens each, fed in
// chunks of `chunk` prompt rows per step (0: whole prompts), counted after `warm` steps.
double allocations_per_step(Model& m, int batch, int64_t prompt, int64_t chunk, int64_t warm,
                            int64_t steps) {
  auto count = [&](int64_t n) {
    EngineConfig cfg;
    cfg.sched.max_num_seqs = batch;
    cfg.sched.block_tokens = 16;
    if (chunk > 0) {
      cfg.sched.max_num_prefill_tokens = chunk;
      cfg.sched.max_num_batched_tokens = chunk + batch;
    }
    Engine e(m, cfg);
    for (int i = 0; i < batch; ++i) {
      Request r;
      r.id = RequestId(i);
      r.prompt_ids = random_tokens(prompt, m.config().vocab_size, 11 + uint64_t(i));
      r.params.max_tokens = 2048;
      r.params.ignore_eos = true;
      r.params.temperature = 0.8f;  // the sampling path, not only argmax
      r.params.seed = uint64_t(i);
      EXPECT_EQ(e.add_request(r), "");
    }
    for (int64_t s = 0; s < warm; ++s) e.step();
    const int64_t before = g_allocs.load();
    for (int64_t s = 0; s < n; ++s) e.step();
    return g_allocs.load() - before;
  };
  const int64_t shorter = count(steps), longer = count(3 * steps);
  return double(longer - shorter) / double(2 * steps);
}

TEST(StepAllocations, DecodeAtBatch1And8) {
  LoadedModel m = load_model("tiny", Numerics::Bf16);
  const double b1 = allocations_per_step(*m.model, 1, 8, 0, 4, 16);
  const double b8 = allocations_per_step(*m.model, 8, 8, 0, 4, 16);
  std::printf("heap allocations per decode step: batch 1 %.1f, batch 8 %.1f\n", b1, b8);
  EXPECT_LE(b1, 16);
  EXPECT_LE(b8, 32);
}

TEST(StepAllocations, PrefillChunksOfOneSize) {
  LoadedModel m = load_model("tiny", Numerics::Bf16);
  // One sequence of 1000 prompt tokens in chunks of 16: every step is the same shape.
  const double p = allocations_per_step(*m.model, 1, 1000, 16, 4, 16);
  std::printf("heap allocations per 16-row prefill chunk: %.1f\n", p);
  EXPECT_LE(p, 16);
}

}  // namespace
}  // namespace deepinfer::testing
