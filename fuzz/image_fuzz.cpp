// libFuzzer target: image bytes through decode_image and the preprocessing (vision/image.h).
// Bad input must end in deepinfer::Error; anything else (another exception, a crash, a sanitizer
// report, patches of the wrong size or a span over its budget) is a finding.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "core/error.h"
#include "vision/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer::vision;
  RgbImage img;
  try {
    img = decode_image(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz input",
                       int64_t(1) << 16);
  } catch (const deepinfer::Error&) {
    return 0;
  }
  if (img.rgb.size() != size_t(img.width * img.height * 3)) std::abort();
  // Small limits, so that the resize stays quick: patches of 4, at most 40 tokens.
  // An image too elongated for its fit (a side of 0 pixels) is refused with an Error too.
  const VisionLimits lim{4, 2, 40, 256, 0.0};
  ImagePatches p;
  try {
    p = preprocess(img, lim);
  } catch (const deepinfer::Error&) {
    return 0;
  }
  if (p.patches.size() != size_t(p.plan.vit_h * p.plan.vit_w * 3 * 16) ||
      p.plan.span_tokens() > lim.max_tokens)
    std::abort();
  return 0;
}
