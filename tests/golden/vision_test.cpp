// The vision tower (model/vision.cpp) against the numpy reference (tests/reference/v41ref/
// vision.py) on a make-tiny checkpoint with a tower: in fp32 numerics the aligner's rows agree
// bit for bit; in bf16 within a bf16 rounding of the reference's scale.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <random>

#include <unistd.h>

#include "core/dtype.h"
#include "engine/engine.h"
#include "io/npy.h"
#include "model_harness.h"
#include "npy_reader.h"

namespace deepinfer::testing {
namespace {

namespace fs = std::filesystem;

// Patches of bf16 values in [-1, 1], as normalised pixels are.
std::vector<uint16_t> random_patches(int64_t n, int64_t width, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint16_t> p(size_t(n * width));
  for (auto& v : p) v = f32_to_bf16(u(rng));
  return p;
}

std::vector<double> reference(const std::string& model, const std::vector<uint16_t>& patches,
                              int64_t vit_h, int64_t vit_w, int64_t width, const char* dtype) {
  const std::string tag = std::to_string(::getpid()) + "-" + dtype;
  const fs::path in = fs::temp_directory_path() / ("deepinfer-vision-in-" + tag + ".npy");
  const fs::path out = fs::temp_directory_path() / ("deepinfer-vision-out-" + tag + ".npy");
  std::vector<float> x(patches.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_f32(patches[i]);
  npy_write(in.string(), x.data(), {vit_h * vit_w, width});
  run_command(std::string("cd ") + DEEPINFER_SOURCE_DIR +
              "/tests/reference && /usr/bin/python3 -m v41ref.vision --model " + preset_dir(model) +
              " --patches " + in.string() + " --grid " + std::to_string(vit_h) + " " +
              std::to_string(vit_w) + " --dtype " + dtype + " --out " + out.string());
  auto r = npy_read(out.string()).as<double>();
  fs::remove(in);
  fs::remove(out);
  return r;
}

void compare(Numerics numerics, const char* dtype) {
  const std::string preset = "tiny+vision";
  LoadedModel m = load_model(preset, numerics);
  ASSERT_TRUE(m.model->has_vision());
  const ModelConfig& c = m.model->config();
  const int64_t width = 3 * c.vision_patch_size * c.vision_patch_size;
  // Grids whose sides are and are not multiples of the aligner's 3 (zero padding), one row.
  for (auto [h, w] : {std::pair<int64_t, int64_t>{4, 5}, {3, 6}, {1, 7}}) {
    SCOPED_TRACE(std::to_string(h) + "x" + std::to_string(w));
    const auto patches = random_patches(h * w, width, uint64_t(h * 100 + w));
    std::vector<float> got;
    m.model->encode_image(patches.data(), h, w, got);
    const auto want = reference(preset, patches, h, w, width, dtype);
    const int64_t rows = ((h + 2) / 3) * ((w + 2) / 3);
    ASSERT_EQ(int64_t(got.size()), rows * c.dim);
    ASSERT_EQ(want.size(), got.size());
    double scale = 0, worst = 0;
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      scale = std::max(scale, std::fabs(want[i]));
      worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
      differ += double(got[i]) != want[i];
    }
    if (numerics == Numerics::Fp32)
      EXPECT_EQ(differ, 0u) << "worst " << worst << " of " << scale;
    else
      EXPECT_LE(worst, scale * 0x1p-7) << differ << " of " << got.size() << " differ";
  }
}

TEST(Vision, TowerMatchesReferenceFp32) {
  compare(Numerics::Fp32, "fp32");
}
TEST(Vision, TowerMatchesReferenceBf16) {
  compare(Numerics::Bf16, "bf16");
}

TEST(Vision, TextModelWithoutTowerRefusesImages) {
  LoadedModel m = load_model("tiny", Numerics::Bf16);
  EXPECT_FALSE(m.model->has_vision());
  std::vector<float> out;
  const std::vector<uint16_t> p(3 * 14 * 14, 0);
  EXPECT_THROW(m.model->encode_image(p.data(), 1, 1, out), Error);
}

// A prompt with text around an image span written out as the engine writes it: the span's rows
// take the tower's rows (llm_h x llm_w) and the delimiters.
struct SpanPrompt {
  std::vector<int32_t> tokens;
  std::vector<const float*> embeds;  // per token: its embedding, null for text
};
SpanPrompt span_prompt(Model& m, const std::vector<int32_t>& before, const std::vector<float>& rows,
                       int64_t llm_h, int64_t llm_w, const std::vector<int32_t>& after) {
  const int64_t D = m.config().dim;
  SpanPrompt p{before, std::vector<const float*>(before.size(), nullptr)};
  auto span = [&](const float* e) {
    p.tokens.push_back(int32_t(m.config().image_token_id));
    p.embeds.push_back(e);
  };
  span(m.image_delimiter(0));
  for (int64_t y = 0; y < llm_h; ++y) {
    for (int64_t x = 0; x < llm_w; ++x) span(&rows[size_t((y * llm_w + x) * D)]);
    span(m.image_delimiter(2));
  }
  span(m.image_delimiter(3));
  p.tokens.insert(p.tokens.end(), after.begin(), after.end());
  p.embeds.resize(p.tokens.size(), nullptr);
  return p;
}

// The reference on a span prompt in fp32 (run_reference.py `extra` flags): its arrays.
std::map<std::string, NpyArray> reference_with_image(const std::string& preset, int64_t D,
                                                     const SpanPrompt& p,
                                                     const std::string& extra) {
  const int64_t T = int64_t(p.tokens.size());
  std::vector<float> dense(size_t(T * D), 0.0f);
  std::string ids, at;
  for (int64_t i = 0; i < T; ++i) {
    if (const float* e = p.embeds[size_t(i)]) {
      std::copy(e, e + D, &dense[size_t(i * D)]);
      at += (at.empty() ? "" : ",") + std::to_string(i);
    }
    ids += (i ? "," : "") + std::to_string(p.tokens[size_t(i)]);
  }
  const std::string tag = std::to_string(::getpid()) + "-" + std::to_string(T);
  const fs::path e = fs::temp_directory_path() / ("deepinfer-image-" + tag + ".npy");
  const fs::path out = fs::temp_directory_path() / ("deepinfer-image-" + tag + ".npz");
  npy_write(e.string(), dense.data(), {T, D});
  run_command(std::string("/usr/bin/python3 ") + DEEPINFER_SOURCE_DIR +
              "/tests/reference/run_reference.py --quiet --model " + preset_dir(preset) +
              " --prompt-ids " + ids + " --dtype fp32 --image-embeds " + e.string() +
              " --image-rows " + at + " " + extra + " --out " + out.string());
  auto arrays = npz_read(out.string());
  fs::remove(e);
  fs::remove(out);
  return arrays;
}

// A prompt with an image span in the middle: the span's rows take the tower's rows and the
// delimiters, route with bias_vl and are dead to Engram. Logits equal the reference's in fp32,
// fed whole, in chunks that cut the span, and token by token.
TEST(Vision, ImagePromptMatchesReferenceFp32) {
  const std::string preset = "tiny+vision";
  LoadedModel m = load_model(preset, Numerics::Fp32);
  const ModelConfig& c = m.model->config();
  const int64_t D = c.dim, V = c.vocab_size, vit_h = 5, vit_w = 7, llm_h = 2, llm_w = 3;
  const auto patches = random_patches(vit_h * vit_w, 3 * 14 * 14, 9);
  std::vector<float> rows;
  m.model->encode_image(patches.data(), vit_h, vit_w, rows);
  ASSERT_EQ(int64_t(rows.size()), llm_h * llm_w * D);
  // [IMAGE_START] + ([IMAGE] * 3 + [IMAGE_NEW_LINE]) * 2 + [IMAGE_END] between text.
  const SpanPrompt p = span_prompt(*m.model, random_tokens(5, V - 2, 31), rows, llm_h, llm_w,
                                   random_tokens(5, V - 2, 32));
  const std::vector<int32_t>& tokens = p.tokens;
  const int64_t T = int64_t(tokens.size()), span_end = 5 + 10;
  const auto want = reference_with_image(preset, D, p, "").at("logits").as<double>();
  ASSERT_EQ(int64_t(want.size()), T * V);

  std::vector<int64_t> one_by_one(size_t(T), 1);
  for (const std::vector<int64_t>& chunks :
       {std::vector<int64_t>{T}, std::vector<int64_t>{3, 9, T - 12}, one_by_one}) {
    const auto got = run_chunks(*m.model, tokens, chunks, p.embeds);
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i)
      worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
    EXPECT_LE(worst, 1e-3) << chunks.size() << " chunks";
  }
  // The image matters: the same tokens as text give other logits after the span.
  const auto text = run_chunks(*m.model, tokens, {T});
  double moved = 0;
  for (int64_t i = span_end * V; i < T * V; ++i)
    moved = std::max(moved, std::fabs(double(text[size_t(i)]) - want[size_t(i)]));
  EXPECT_GT(moved, 1e-2);
}

// An image request through the engine: its placeholder becomes the image's span, the tower runs,
// and greedy decoding gives the reference's tokens, alone and batched with text requests in
// chunks of 7 prompt rows (the span cut across steps), prefix caching on, and in a pool too small
// for all of them (preemption: the image request recomputes its span).
TEST(Vision, EngineImageRequestMatchesReference) {
  const std::string preset = "tiny+vision";
  LoadedModel m = load_model(preset, Numerics::Fp32);
  const ModelConfig& c = m.model->config();
  const int64_t D = c.dim, V = c.vocab_size, vit_h = 4, vit_w = 8;  // llm grid 2 x 3
  Request img;
  img.id = 1;
  img.prompt_ids = random_tokens(4, V - 2, 41);
  img.prompt_ids.push_back(int32_t(c.image_token_id));
  for (int32_t t : random_tokens(3, V - 2, 42)) img.prompt_ids.push_back(t);
  img.images.push_back({random_patches(vit_h * vit_w, 3 * 14 * 14, 43), vit_h, vit_w});
  img.params.max_tokens = 6;
  img.params.temperature = 0;
  img.params.ignore_eos = true;

  // The reference's prompt: the span written out, with the tower's rows and the delimiters.
  std::vector<float> rows;
  m.model->encode_image(img.images[0].patches.data(), vit_h, vit_w, rows);
  const SpanPrompt p = span_prompt(
      *m.model, std::vector<int32_t>(img.prompt_ids.begin(), img.prompt_ids.begin() + 4), rows, 2,
      3, std::vector<int32_t>(img.prompt_ids.begin() + 5, img.prompt_ids.end()));
  const auto want = reference_with_image(preset, D, p, "--greedy 6").at("greedy_ids").as<int64_t>();

  Request text;
  text.id = 2;
  text.prompt_ids = random_tokens(11, V - 2, 44);
  text.params = img.params;
  text.params.max_tokens = 20;  // 31 tokens: with the image request, more than 5 blocks of 8
  Request text2 = text;
  text2.id = 3;
  text2.prompt_ids = random_tokens(11, V - 2, 45);
  for (int mode = 0; mode < 3; ++mode) {  // alone, batched, batched in a small pool
    SCOPED_TRACE(mode);
    EngineConfig cfg;
    cfg.sched.max_num_seqs = 4;
    cfg.sched.max_num_prefill_tokens = 7;
    cfg.sched.max_num_batched_tokens = 11;
    cfg.sched.block_tokens = mode == 2 ? 8 : 16;
    if (mode == 2) cfg.num_kv_blocks = 5;  // 23 + 31 + 31 tokens want 11 blocks of 8
    Engine eng(*m.model, cfg);
    // Last in, first preempted: in the small pool the image request gives its blocks back.
    if (mode > 0) {
      ASSERT_EQ(eng.add_request(text), "");
      ASSERT_EQ(eng.add_request(text2), "");
    }
    ASSERT_EQ(eng.add_request(img), "");
    std::map<RequestId, std::vector<int32_t>> got;
    for (int guard = 0; eng.has_unfinished() && guard < 1000; ++guard) {
      eng.step();
      for (auto& o : eng.take_finished()) got[o.id] = o.output_ids;
    }
    ASSERT_EQ(got[1].size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_EQ(got[1][i], int32_t(want[i])) << "token " << i;
    if (mode == 2) EXPECT_GT(eng.stats().preemptions, 0);
    EXPECT_EQ(eng.kv_blocks_used(), 0);
  }

  // The prefix cache: the same ids with another image share only the text before the span; the
  // same image again takes its span's blocks from the cache; each gives its own reference tokens.
  {
    Request other = img;
    other.id = 7;
    other.images[0].patches = random_patches(vit_h * vit_w, 3 * 14 * 14, 46);
    std::vector<float> rows2;
    m.model->encode_image(other.images[0].patches.data(), vit_h, vit_w, rows2);
    const SpanPrompt p2 = span_prompt(
        *m.model, std::vector<int32_t>(img.prompt_ids.begin(), img.prompt_ids.begin() + 4), rows2,
        2, 3, std::vector<int32_t>(img.prompt_ids.begin() + 5, img.prompt_ids.end()));
    const auto want2 =
        reference_with_image(preset, D, p2, "--greedy 6").at("greedy_ids").as<int64_t>();
    EngineConfig cfg;
    cfg.sched.block_tokens = 8;
    Engine eng(*m.model, cfg);
    auto run = [&](Request r, RequestId id) {
      r.id = id;
      EXPECT_EQ(eng.add_request(r), "");
      std::vector<int32_t> out;
      while (eng.has_unfinished()) {
        eng.step();
        for (auto& o : eng.take_finished()) out = o.output_ids;
      }
      return out;
    };
    const auto as_ids = [](const std::vector<int64_t>& v) {
      return std::vector<int32_t>(v.begin(), v.end());
    };
    EXPECT_EQ(run(img, 10), as_ids(want));
    const int64_t hits0 = eng.stats().prefix_hit_tokens;
    EXPECT_EQ(run(other, 11), as_ids(want2));
    EXPECT_EQ(eng.stats().prefix_hit_tokens, hits0) << "another image shares no span block";
    EXPECT_EQ(run(img, 12), as_ids(want));
    EXPECT_GE(eng.stats().prefix_hit_tokens, hits0 + 16) << "the same image's span is cached";
  }

  // Refusals name what is wrong.
  Engine eng(*m.model, EngineConfig{});
  Request two = img;
  two.id = 3;
  two.images.push_back(two.images[0]);
  EXPECT_NE(eng.add_request(two).find("1 image placeholder(s)"), std::string::npos);
  Request bad = img;
  bad.id = 4;
  bad.images[0].vit_w = 9;
  EXPECT_NE(eng.add_request(bad).find("patch values"), std::string::npos);
  LoadedModel plain = load_model("tiny", Numerics::Fp32);
  Engine text_only(*plain.model, EngineConfig{});
  EXPECT_NE(text_only.add_request(img).find("no vision tower"), std::string::npos);
}

}  // namespace
}  // namespace deepinfer::testing

namespace deepinfer::testing {
namespace {

// The tower runs a stage per step (the patch embedding, each block, the aligner), beside the
// other requests: a decoding text request gets a token at every one of those steps, and the image
// request is scheduled once its image is through. A request aborted while in the tower finishes
// as aborted.
TEST(Vision, EngineRunsTheTowerInStagesBesideOtherRequests) {
  LoadedModel m = load_model("tiny+vision", Numerics::Bf16);
  const ModelConfig& c = m.model->config();
  Request text;
  text.id = 1;
  text.prompt_ids = random_tokens(6, c.vocab_size - 2, 51);
  text.params.max_tokens = 40;
  text.params.temperature = 0;
  text.params.ignore_eos = true;
  Request img = text;
  img.id = 2;
  img.prompt_ids = {5, int32_t(c.image_token_id), 7};
  img.params.max_tokens = 3;
  img.images.push_back({random_patches(16, 3 * 14 * 14, 52), 4, 4});
  Engine eng(*m.model, EngineConfig{});
  ASSERT_EQ(eng.add_request(text), "");
  eng.step();  // the text request's prefill
  ASSERT_EQ(eng.add_request(img), "");
  EXPECT_EQ(eng.add_request(img).find("already in use") != std::string::npos, true);
  const int stages = c.vision_n_layers + 2;
  for (int i = 0; i + 1 < stages; ++i) {
    const std::vector<TokenEvent> ev = eng.step();
    ASSERT_EQ(ev.size(), 1u) << "step " << i;
    EXPECT_EQ(ev[0].id, RequestId(1)) << "step " << i;
  }
  // The last stage's step schedules the image request too: its prefill gives its first token.
  const std::vector<TokenEvent> ev = eng.step();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(eng.num_running(), 2u);
  std::map<RequestId, RequestOutput> done;
  while (eng.has_unfinished()) {
    eng.step();
    for (auto& o : eng.take_finished()) done[o.id] = std::move(o);
  }
  EXPECT_EQ(done[2].output_ids.size(), 3u);
  EXPECT_EQ(done[1].output_ids.size(), 40u);

  Request late = img;
  late.id = 3;
  ASSERT_EQ(eng.add_request(late), "");
  eng.step();  // one stage
  EXPECT_TRUE(eng.abort(3));
  EXPECT_FALSE(eng.has_unfinished());
  const std::vector<RequestOutput> out = eng.take_finished();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].finish, FinishReason::Abort);
}

}  // namespace
}  // namespace deepinfer::testing
