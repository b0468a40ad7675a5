// Image decoding and preprocessing against Pillow: tests/reference/pillow_images.py writes images
// of many sizes, modes and formats and what the reference's preprocessing makes of them with
// Pillow (decoded RGB, the padded RGB, the bf16 patches); every byte must agree.
#include "vision/image.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "core/error.h"
#include "util/base64.h"

namespace deepinfer::vision {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

const VisionLimits kLimits{14, 3, 1024, 295936, 0.0};  // the release's values

// The Pillow side, made once per test binary run in a directory removed at its exit.
struct PillowDir {
  fs::path path;
  PillowDir() : path(fs::temp_directory_path() / ("deepinfer_pillow_" + std::to_string(getpid()))) {
    fs::create_directories(path);
    const std::string cmd = std::string("/usr/bin/python3 ") + DEEPINFER_SOURCE_DIR +
                            "/tests/reference/pillow_images.py " + path.string() +
                            " 14 3 1024 295936";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << " (needs Debian's python3-pil)";
  }
  ~PillowDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};
const fs::path& pillow_dir() {
  static const PillowDir dir;
  return dir.path;
}

struct Case {
  std::string name, file;
  int64_t w, h, plan_w, plan_h, vit_h, vit_w, llm_h, llm_w;
};

std::vector<Case> cases() {
  std::ifstream m(pillow_dir() / "manifest.txt");
  std::vector<Case> v;
  Case c;
  while (m >> c.name >> c.file >> c.w >> c.h >> c.plan_w >> c.plan_h >> c.vit_h >> c.vit_w >>
         c.llm_h >> c.llm_w)
    v.push_back(c);
  return v;
}

// The first differing byte, or -1.
int64_t first_diff(const std::string& want, const void* got, size_t n) {
  if (want.size() != n) return int64_t(std::min(want.size(), n));
  const auto* g = static_cast<const char*>(got);
  for (size_t i = 0; i < n; ++i)
    if (want[i] != g[i]) return int64_t(i);
  return -1;
}

TEST(Image, DecodeAndPreprocessMatchPillow) {
  const std::vector<Case> all = cases();
  ASSERT_GE(all.size(), 30u);
  for (const Case& c : all) {
    SCOPED_TRACE(c.name);
    const fs::path d = pillow_dir();
    const RgbImage img = decode_image(read_file(d / c.file), c.file);
    ASSERT_EQ(img.width, c.w);
    ASSERT_EQ(img.height, c.h);
    ASSERT_EQ(first_diff(read_file(d / (c.name + ".decoded")), img.rgb.data(), img.rgb.size()), -1);
    const ImagePlan pl = plan_image(img.width, img.height, kLimits);
    EXPECT_EQ(pl.width, c.plan_w);
    EXPECT_EQ(pl.height, c.plan_h);
    EXPECT_EQ(pl.vit_h, c.vit_h);
    EXPECT_EQ(pl.vit_w, c.vit_w);
    EXPECT_EQ(pl.llm_h, c.llm_h);
    EXPECT_EQ(pl.llm_w, c.llm_w);
    EXPECT_LE(pl.span_tokens(), kLimits.max_tokens);
    const RgbImage padded = fit_and_pad(img, pl.width, pl.height);
    const int64_t at =
        first_diff(read_file(d / (c.name + ".padded")), padded.rgb.data(), padded.rgb.size());
    ASSERT_EQ(at, -1) << "pixel " << at / 3 % pl.width << "," << at / 3 / pl.width;
    const ImagePatches p = preprocess(img, kLimits);
    EXPECT_EQ(
        first_diff(read_file(d / (c.name + ".patches")), p.patches.data(), p.patches.size() * 2),
        -1);
  }
}

TEST(Image, SpanTypes) {
  ImagePlan pl;
  pl.llm_h = 2;
  pl.llm_w = 3;
  const std::vector<int8_t> want = {0, 1, 1, 1, 2, 1, 1, 1, 2, 3};
  EXPECT_EQ(image_span_types(pl), want);
  EXPECT_EQ(pl.span_tokens(), int64_t(want.size()));
}

TEST(Image, BadBytesNameTheImage) {
  const auto message = [](const std::string& bytes) {
    try {
      decode_image(bytes, "messages[0].content[1]");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("RIFF").find("not a PNG, JPEG, GIF or WebP"), std::string::npos);
  EXPECT_NE(message("BM......").find("messages[0].content[1]: not a PNG, JPEG, GIF or WebP"),
            std::string::npos);
  const std::string gif = read_file(pillow_dir() / "gif_offset.gif");
  const std::string webp = read_file(pillow_dir() / "webp_lossy.webp");
  for (size_t cut : {size_t(6), size_t(13), size_t(40), gif.size() - 3})
    EXPECT_NE(message(gif.substr(0, cut)).find("not a readable GIF"), std::string::npos) << cut;
  for (size_t cut : {size_t(12), size_t(30), webp.size() / 2})
    EXPECT_NE(message(webp.substr(0, cut)).find("not a readable WebP"), std::string::npos) << cut;
  const std::string png = read_file(pillow_dir() / "rgb_37x23.png");
  const std::string jpg = read_file(pillow_dir() / "photo_640x480.jpg");
  for (size_t cut : {size_t(8), size_t(40), png.size() / 2})
    EXPECT_NE(message(png.substr(0, cut)).find("not a readable PNG"), std::string::npos) << cut;
  for (size_t cut : {size_t(3), size_t(100), jpg.size() / 2})
    EXPECT_NE(message(jpg.substr(0, cut)).find("not a readable JPEG"), std::string::npos) << cut;
  std::string bad = png;
  bad[20] ^= 0x55;  // the width, under the header's CRC
  EXPECT_NE(message(bad).find("messages[0].content[1]"), std::string::npos);
  // Too many pixels: refused before decoding.
  try {
    decode_image(png, "big", 100);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at most 100 pixels"), std::string::npos) << e.what();
  }
}

TEST(Image, Sources) {
  const std::string png = read_file(pillow_dir() / "rgb_37x23.png");
  const std::string url = "data:image/png;base64," + test::base64(png);
  EXPECT_EQ(image_source_bytes(url, "x", false), png);
  const fs::path file = pillow_dir() / "rgb_37x23.png";
  EXPECT_EQ(image_source_bytes(file.string(), "x", true), png);
  EXPECT_EQ(image_source_bytes("file://" + file.string(), "x", true), png);
  const auto message = [](const std::string& src, bool files) {
    try {
      image_source_bytes(src, "messages[1].content[0]", files);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(file.string(), false).find("expected a data:"), std::string::npos);
  EXPECT_NE(message("https://example.com/a.png", true).find("not fetched"), std::string::npos);
  EXPECT_NE(message("data:image/png,abc", false).find("base64"), std::string::npos);
  EXPECT_NE(message("data:image/png;base64,ab$c", false).find("not base64"), std::string::npos);
  EXPECT_NE(message("data:image/png;base64,a", false).find("truncated"), std::string::npos);
  EXPECT_NE(message("/no/such/file.png", true).find("cannot read"), std::string::npos);
  EXPECT_NE(message(url, false).find("no error"), std::string::npos);
}

TEST(Image, ResizeKeepsSizeAndRefusesEmpty) {
  RgbImage img;
  img.width = 3;
  img.height = 2;
  img.rgb = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18};
  EXPECT_EQ(resize_bicubic(img, 3, 2).rgb, img.rgb);
  EXPECT_THROW(resize_bicubic(img, 0, 2), Error);
  // A constant image stays constant through any resize (the weights sum to one).
  RgbImage flat{5, 7, std::vector<uint8_t>(5 * 7 * 3, 200)};
  for (auto [w, h] : {std::pair<int64_t, int64_t>{11, 3}, {2, 20}, {1, 1}, {64, 64}}) {
    const RgbImage r = resize_bicubic(flat, w, h);
    EXPECT_EQ(r.rgb, std::vector<uint8_t>(size_t(w * h * 3), 200)) << w << "x" << h;
  }
}

}  // namespace
}  // namespace deepinfer::vision
