// Images in: decoding image bytes into RGB pixels as Pillow's open(...).convert("RGB") gives them,
// and the reference's preprocessing of those pixels into ViT patches and the image-token span
// (docs/vision.md). Pure bytes -> pixels -> patches, like the tokenizer is pure text -> ids; the
// tower itself runs in model/.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::vision {

// Row-major R, G, B bytes.
struct RgbImage {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> rgb;
};

// The bytes of an image source: a `data:` URL with base64 content, or (with `allow_files`) a
// file path. Remote URLs are refused (nothing is fetched). Throws Error naming `what`.
std::string image_source_bytes(std::string_view source, const std::string& what, bool allow_files,
                               size_t max_bytes = size_t(64) << 20);

// Decodes PNG, JPEG, GIF or WebP bytes (the first image of the file) into RGB as Pillow does:
// alpha dropped (not composited), palettes mapped, gray replicated, 16-bit samples reduced to
// their high byte (16-bit gray, which Pillow opens as 32-bit integers, clipped to 0..255
// instead), no EXIF rotation. Throws Error naming `what` for anything else (other formats,
// corrupt or truncated data, CMYK JPEGs, more than `max_pixels` pixels).
RgbImage decode_image(std::string_view bytes, const std::string& what,
                      int64_t max_pixels = int64_t(1) << 26);

// The vision fields of the model config that the preprocessing reads.
struct VisionLimits {
  int64_t patch = 14;       // vision_patch_size
  int64_t downsample = 3;   // vision_downsample_ratio (the aligner's k x k)
  int64_t max_tokens = 0;   // vision_max_n_token: span length, delimiters included
  int64_t min_pixels = 0;   // vision_min_pixels: smaller images are scaled up to about this
  double max_wh_ratio = 0;  // vision_max_wh_ratio; 0: none (images are padded, never stretched)
};

// Where an image of width x height goes: a vit_h x vit_w patch grid of height x width pixels, an
// llm_h x llm_w token grid after the aligner.
struct ImagePlan {
  int64_t width = 0, height = 0;
  int64_t vit_h = 0, vit_w = 0, llm_h = 0, llm_w = 0;
  // [IMAGE_START] + ([IMAGE] * llm_w + [IMAGE_NEW_LINE]) * llm_h + [IMAGE_END]
  int64_t span_tokens() const { return llm_h * (llm_w + 1) + 2; }
};
ImagePlan plan_image(int64_t width, int64_t height, const VisionLimits& v);

// Pillow's Image.resize(size, BICUBIC) of an RGB image, bit for bit (two fixed-point passes,
// horizontal first, through 8-bit rows).
RgbImage resize_bicubic(const RgbImage& in, int64_t width, int64_t height);
// Pillow's ImageOps.pad(image, size, color=(127, 127, 127)) (>= 9.3): the largest bicubic fit of
// the same aspect ratio, centred on grey.
RgbImage fit_and_pad(const RgbImage& in, int64_t width, int64_t height);

// The span's token types, position by position.
enum ImageTokenType : int8_t { kImageStart = 0, kImage = 1, kImageNewLine = 2, kImageEnd = 3 };
std::vector<int8_t> image_span_types(const ImagePlan& plan);

// An image ready for the tower: its plan and its patches, bf16 [vit_h * vit_w, 3 * patch^2] in
// row-major grid order, each patch channel-major then row-major (c, y, x), values
// bf16((u / 255 - 0.5) / 0.5).
struct ImagePatches {
  ImagePlan plan;
  std::vector<uint16_t> patches;
};
ImagePatches preprocess(const RgbImage& img, const VisionLimits& v);

}  // namespace deepinfer::vision
