// The vision tower (model/vision.cpp) against the numpy reference (tests/reference/v41ref/
// vision.py) on a make-tiny checkpoint with a tower: in fp32 numerics the aligner's rows agree
// bit for bit; in bf16 within a bf16 rounding of the reference's scale.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include <unistd.h>

#include "core/dtype.h"
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
  npy_write_f32(in.string(), x.data(), {vit_h * vit_w, width});
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

}  // namespace
}  // namespace deepinfer::testing
