// Image decoding and the reference's preprocessing (docs/vision.md): what Pillow does, bit for bit.
#include "vision/image.h"

#include <csetjmp>
#include <cstdio>
#include <cstring>

#include <gif_lib.h>
#include <jpeglib.h>
#include <webp/demux.h>

#include <jerror.h>  // after jpeglib.h
#include <png.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "core/dtype.h"
#include "core/error.h"
#include "core/file.h"

namespace deepinfer::vision {

namespace {

// --- decoding ---

// libpng and libjpeg report errors through a callback that must not return: it records the
// message here and jumps back to the decoder's setjmp, which throws. Everything the decoder owns
// is declared before that point, so the jump skips no destructor.
thread_local char t_error[JMSG_LENGTH_MAX + 64];

void check_size(int64_t w, int64_t h, int64_t max_pixels, const std::string& what) {
  DI_REQUIRE(w > 0 && h > 0 && w * h <= max_pixels, what, ": a ", w, "x", h,
             " image; expected at least one pixel and at most ", max_pixels, " pixels");
}

// Image bytes handed out to a decoder's read callback.
struct MemInput {
  std::string_view bytes;
  size_t at = 0;
  size_t read(void* out, size_t len) {
    const size_t k = std::min(len, bytes.size() - at);
    std::memcpy(out, bytes.data() + at, k);
    at += k;
    return k;
  }
};

void png_fail(png_structp png, png_const_charp msg) {
  std::snprintf(t_error, sizeof t_error, "%s", msg);
  longjmp(png_jmpbuf(png), 1);
}
void png_warn(png_structp, png_const_charp) {}
void png_read_bytes(png_structp png, png_bytep out, png_size_t len) {
  if (static_cast<MemInput*>(png_get_io_ptr(png))->read(out, len) < len)
    png_error(png, "the data ends early");
}

RgbImage decode_png(std::string_view bytes, const std::string& what, int64_t max_pixels) {
  MemInput in{bytes};
  std::vector<uint8_t> pixels;
  std::vector<png_bytep> rows;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, nullptr, png_fail, png_warn);
  DI_REQUIRE(png, what, ": out of memory reading a PNG");
  png_infop info = png_create_info_struct(png);
  const auto destroy = [&info](png_structp p) {
    png_destroy_read_struct(&p, info ? &info : nullptr, nullptr);
  };
  const std::unique_ptr<png_struct, decltype(destroy)> owner(png, destroy);
  if (!info || setjmp(png_jmpbuf(png)) != 0)
    throw Error(str_cat(what, ": not a readable PNG image (", t_error, ")"));
  png_set_read_fn(png, &in, png_read_bytes);
  png_read_info(png, info);
  png_uint_32 w = 0, h = 0;
  int depth = 0, color = 0;
  png_get_IHDR(png, info, &w, &h, &depth, &color, nullptr, nullptr, nullptr);
  check_size(w, h, max_pixels, what);
  // Pillow opens 16-bit gray as 32-bit integers and clips them to 0..255 for RGB; every other
  // 16-bit sample keeps its high byte.
  const bool gray16 = depth == 16 && color == PNG_COLOR_TYPE_GRAY;
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (depth == 16 && !gray16) png_set_strip_16(png);
  if (!gray16) png_set_gray_to_rgb(png);
  png_set_strip_alpha(png);  // dropped, not composited (tRNS included)
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  // Rows of w RGB pixels, or of w 16-bit gray samples.
  const size_t stride = png_get_rowbytes(png, info);
  pixels.resize(stride * h);
  rows.resize(h);
  for (png_uint_32 y = 0; y < h; ++y) rows[y] = pixels.data() + y * stride;
  png_read_image(png, rows.data());
  if (!gray16) return {w, h, std::move(pixels)};
  RgbImage out{w, h, std::vector<uint8_t>(size_t(w) * h * 3)};
  for (size_t i = 0; i < size_t(w) * h; ++i) {
    const int v = pixels[2 * i] << 8 | pixels[2 * i + 1];
    out.rgb[3 * i] = out.rgb[3 * i + 1] = out.rgb[3 * i + 2] = uint8_t(std::min(v, 255));
  }
  return out;
}

struct JpegErrors {
  jpeg_error_mgr mgr;
  jmp_buf jump;
};

void jpeg_fail(j_common_ptr c) {
  (*c->err->format_message)(c, t_error);
  longjmp(reinterpret_cast<JpegErrors*>(c->err)->jump, 1);
}

RgbImage decode_jpeg(std::string_view bytes, const std::string& what, int64_t max_pixels) {
  RgbImage out;
  jpeg_decompress_struct c;
  JpegErrors err;
  c.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_fail;
  err.mgr.output_message = [](j_common_ptr) {};
  // Data that ends early is an error, as in Pillow (libjpeg would warn and fill in grey).
  err.mgr.emit_message = [](j_common_ptr c, int level) {
    if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF) jpeg_fail(c);
  };
  jpeg_create_decompress(&c);
  const std::unique_ptr<jpeg_decompress_struct, decltype(&jpeg_destroy_decompress)> owner(
      &c, jpeg_destroy_decompress);
  if (setjmp(err.jump) != 0)
    throw Error(str_cat(what, ": not a readable JPEG image (", t_error, ")"));
  jpeg_mem_src(&c, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&c, TRUE);
  const int64_t w = c.image_width, h = c.image_height;
  check_size(w, h, max_pixels, what);
  // Pillow decodes with libjpeg's defaults (islow DCT, fancy upsampling); gray is decoded as
  // gray, then replicated (libjpeg's gray -> RGB conversion).
  const J_COLOR_SPACE cs = c.jpeg_color_space;
  DI_REQUIRE(cs == JCS_GRAYSCALE || cs == JCS_YCbCr || cs == JCS_RGB, what,
             ": a CMYK or YCCK JPEG; expected RGB, YCbCr or grayscale");
  c.out_color_space = JCS_RGB;
  jpeg_start_decompress(&c);
  out = {w, h, std::vector<uint8_t>(size_t(w * h * 3))};
  while (c.output_scanline < c.output_height) {
    JSAMPROW row = out.rgb.data() + size_t(c.output_scanline) * size_t(w) * 3;
    jpeg_read_scanlines(&c, &row, 1);
  }
  jpeg_finish_decompress(&c);
  return out;
}

// WebP as Pillow (with libwebp's animation support) opens every WebP file: the first frame of
// WebPAnimDecoder, RGBA over a transparent canvas, alpha dropped.
RgbImage decode_webp(std::string_view bytes, const std::string& what, int64_t max_pixels) {
  WebPAnimDecoderOptions opt;
  DI_REQUIRE(WebPAnimDecoderOptionsInit(&opt), what, ": libwebp version mismatch");
  opt.color_mode = MODE_RGBA;
  opt.use_threads = 0;
  const WebPData data{reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()};
  const std::unique_ptr<WebPAnimDecoder, decltype(&WebPAnimDecoderDelete)> dec(
      WebPAnimDecoderNew(&data, &opt), WebPAnimDecoderDelete);
  WebPAnimInfo info;
  DI_REQUIRE(dec && WebPAnimDecoderGetInfo(dec.get(), &info), what, ": not a readable WebP image");
  const int64_t w = info.canvas_width, h = info.canvas_height;
  check_size(w, h, max_pixels, what);
  uint8_t* canvas = nullptr;
  int ts = 0;
  DI_REQUIRE(WebPAnimDecoderGetNext(dec.get(), &canvas, &ts), what, ": not a readable WebP image");
  RgbImage out{w, h, std::vector<uint8_t>(size_t(w * h * 3))};
  for (int64_t i = 0; i < w * h; ++i) std::memcpy(&out.rgb[size_t(3 * i)], canvas + 4 * i, 3);
  return out;
}

int gif_read(GifFileType* g, GifByteType* out, int len) {
  return int(static_cast<MemInput*>(g->UserData)->read(out, size_t(len)));
}

// GIF as Pillow opens it: the first frame's palette indices on a canvas of the logical screen
// (grown to hold the frame), filled with the frame's transparent index (or 0), mapped through
// the local palette, else the global one; an index past the palette (or with none) is grey
// (i, i, i), as in Pillow's initial palette ramp.
RgbImage decode_gif(std::string_view bytes, const std::string& what, int64_t max_pixels) {
  MemInput in{bytes};
  int err = 0;
  const auto close = [](GifFileType* g) { DGifCloseFile(g, nullptr); };
  const std::unique_ptr<GifFileType, decltype(close)> file(DGifOpen(&in, gif_read, &err), close);
  DI_REQUIRE(file, what, ": not a readable GIF image (", GifErrorString(err), ")");
  GifFileType* g = file.get();
  int transparent = -1;
  int64_t w = g->SWidth, h = g->SHeight;
  std::vector<uint8_t> idx;
  GifRecordType rec;
  while (DGifGetRecordType(g, &rec) == GIF_OK && rec != TERMINATE_RECORD_TYPE) {
    if (rec == EXTENSION_RECORD_TYPE) {
      int code = 0;
      GifByteType* ext = nullptr;
      if (DGifGetExtension(g, &code, &ext) != GIF_OK) break;
      if (code == GRAPHICS_EXT_FUNC_CODE && ext && ext[0] >= 4 && (ext[1] & 1))
        transparent = ext[4];
      while (ext && DGifGetExtensionNext(g, &ext) == GIF_OK) {
      }
      if (ext) break;  // an error inside the extension
      continue;
    }
    if (rec != IMAGE_DESC_RECORD_TYPE || DGifGetImageDesc(g) != GIF_OK) break;
    const GifImageDesc& d = g->Image;
    w = std::max<int64_t>(w, d.Left + d.Width);
    h = std::max<int64_t>(h, d.Top + d.Height);
    check_size(w, h, max_pixels, what);
    if (d.Width <= 0 || d.Height <= 0) break;
    idx.assign(size_t(w * h), uint8_t(transparent >= 0 ? transparent : 0));
    bool lines = true;
    // Interlaced frames store rows in four passes (every 8th from 0, every 8th from 4, every
    // 4th from 2, every 2nd from 1).
    const int first[4] = {0, 4, 2, 1}, step[4] = {8, 8, 4, 2};
    for (int pass = 0; pass < (d.Interlace ? 4 : 1) && lines; ++pass)
      for (int y = d.Interlace ? first[pass] : 0; y < d.Height && lines;
           y += d.Interlace ? step[pass] : 1)
        lines = DGifGetLine(g, &idx[size_t((d.Top + y) * w + d.Left)], d.Width) == GIF_OK;
    if (!lines) break;
    const ColorMapObject* cm = d.ColorMap ? d.ColorMap : g->SColorMap;
    RgbImage out{w, h, std::vector<uint8_t>(size_t(w * h * 3))};
    for (size_t i = 0; i < idx.size(); ++i) {
      const uint8_t v = idx[i];
      const GifColorType c = cm && v < cm->ColorCount ? cm->Colors[v] : GifColorType{v, v, v};
      std::memcpy(&out.rgb[3 * i], &c, 3);  // Red, Green, Blue bytes
    }
    return out;
  }
  throw Error(str_cat(what, ": not a readable GIF image (",
                      g->Error ? GifErrorString(g->Error) : "no image in the file", ")"));
}

// --- Pillow's bicubic resampling (Resample.c, 8 bits per sample) ---

constexpr int kPrecision = 22;  // fixed-point bits of a coefficient

double bicubic(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// Per output index of one axis: the first input it reads, how many, and their fixed-point
// weights (ksize apart).
struct Taps {
  int64_t ksize = 0;
  std::vector<int64_t> first, count;
  std::vector<int32_t> k;
};

Taps taps(int64_t in_size, int64_t out_size) {
  Taps t;
  const double scale = double(float(in_size)) / double(out_size);
  const double fs = std::max(scale, 1.0), support = 2.0 * fs, ss = 1.0 / fs;
  t.ksize = int64_t(std::ceil(support)) * 2 + 1;
  t.k.assign(size_t(out_size * t.ksize), 0);
  std::vector<double> w(size_t(t.ksize));
  for (int64_t o = 0; o < out_size; ++o) {
    const double center = (double(o) + 0.5) * scale;
    const int64_t lo = std::max<int64_t>(0, int64_t(int(center - support + 0.5)));
    const int64_t n = std::min<int64_t>(in_size, int64_t(int(center + support + 0.5))) - lo;
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i)
      sum += w[size_t(i)] = bicubic((double(i + lo) - center + 0.5) * ss);
    for (int64_t i = 0; i < n; ++i) {
      const double v = sum != 0.0 ? w[size_t(i)] / sum : w[size_t(i)];
      t.k[size_t(o * t.ksize + i)] =
          int32_t(v < 0 ? -0.5 + v * (1 << kPrecision) : 0.5 + v * (1 << kPrecision));
    }
    t.first.push_back(lo);
    t.count.push_back(n);
  }
  return t;
}

// One tap sum: `n` samples `step` bytes apart, clipped to 8 bits.
uint8_t tap_sum(const uint8_t* s, int64_t step, const int32_t* k, int64_t n) {
  int32_t acc = 1 << (kPrecision - 1);
  for (int64_t i = 0; i < n; ++i) acc += int32_t(s[i * step]) * k[i];
  return acc <= 0 ? 0 : acc >= (255 << kPrecision) ? 255 : uint8_t(acc >> kPrecision);
}

}  // namespace

std::string image_source_bytes(std::string_view src, const std::string& what, bool allow_files,
                               size_t max_bytes) {
  if (src.starts_with("data:")) {
    const size_t comma = src.find(',');
    DI_REQUIRE(comma != std::string_view::npos && src.substr(0, comma).ends_with(";base64"), what,
               ": a data URL must be data:<type>;base64,<data>");
    int8_t value[256];
    std::fill(value, value + 256, int8_t(-1));
    const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) value[uint8_t(alphabet[i])] = int8_t(i);
    std::string out;
    uint32_t acc = 0;
    int bits = 0;
    size_t pad = 0;
    for (size_t i = comma + 1; i < src.size(); ++i) {
      const char ch = src[i];
      if (ch == '=') {
        ++pad;
        continue;
      }
      DI_REQUIRE(pad == 0 && value[uint8_t(ch)] >= 0, what,
                 ": the data URL's content is not base64 (", "character ", i - comma - 1, ")");
      acc = (acc << 6) | uint32_t(value[uint8_t(ch)]);
      bits += 6;
      if (bits >= 8) {
        bits -= 8;
        out.push_back(char((acc >> bits) & 0xff));
      }
      DI_REQUIRE(out.size() <= max_bytes, what, ": an image of more than ", max_bytes, " bytes");
    }
    DI_REQUIRE(pad <= 2 && (bits < 6), what, ": the data URL's base64 content is truncated");
    return out;
  }
  DI_REQUIRE(!src.starts_with("http://") && !src.starts_with("https://"), what,
             ": remote image URLs are not fetched; send the image as a data: URL");
  DI_REQUIRE(allow_files, what, ": expected a data:<type>;base64,<data> URL");
  const std::string path(src.starts_with("file://") ? src.substr(7) : src);
  std::string out = read_file(path, str_cat(what, ": the image file '", path, "'"), max_bytes);
  DI_REQUIRE(out.size() <= max_bytes, what, ": an image of more than ", max_bytes, " bytes");
  return out;
}

RgbImage decode_image(std::string_view bytes, const std::string& what, int64_t max_pixels) {
  if (bytes.starts_with("\x89PNG\r\n\x1a\n")) return decode_png(bytes, what, max_pixels);
  if (bytes.starts_with("\xff\xd8\xff")) return decode_jpeg(bytes, what, max_pixels);
  if (bytes.starts_with("GIF87a") || bytes.starts_with("GIF89a"))
    return decode_gif(bytes, what, max_pixels);
  if (bytes.size() >= 12 && bytes.starts_with("RIFF") && bytes.substr(8, 4) == "WEBP")
    return decode_webp(bytes, what, max_pixels);
  throw Error(str_cat(what, ": not a PNG, JPEG, GIF or WebP image (", bytes.size(), " bytes)"));
}

ImagePlan plan_image(int64_t width, int64_t height, const VisionLimits& v) {
  DI_REQUIRE(width > 0 && height > 0 && v.patch > 0 && v.downsample > 0 && v.max_tokens > 3,
             "plan_image: bad arguments");
  const int64_t p = v.patch, r = v.downsample, cell = p * r, N = v.max_tokens;
  // In doubles with Python's semantics, as the reference plans (docs/vision.md).
  double W = double(width), H = double(height);
  if (v.max_wh_ratio > 0 && W > H * v.max_wh_ratio) W = H * v.max_wh_ratio;
  if (W * H > 0 && W * H < double(v.min_pixels)) {
    const double s = std::pow(double(v.min_pixels) / (W * H), 0.5);
    W = std::trunc(W * s);
    H = std::trunc(H * s);
  }
  ImagePlan pl;
  pl.width = int64_t(std::ceil(W / double(p))) * p;
  pl.height = int64_t(std::ceil(H / double(p))) * p;
  const auto grid = [&] {
    pl.llm_h = (pl.height / p + r - 1) / r;
    pl.llm_w = (pl.width / p + r - 1) / r;
  };
  grid();
  if (pl.span_tokens() > N) {  // the largest aspect-preserving size that fits
    const double q = H / W, mw = std::sqrt(double(N - 2) / q + 0.25) - 0.5, mh = mw * q;
    if (mw < 1.0) {
      pl.height = (N - 2) / 2 * cell;
      pl.width = cell;
    } else if (mh < 1.0) {
      pl.height = cell;
      pl.width = (N - 3) * cell;
    } else {
      const double beta = std::min(double(int64_t(std::floor(mw)) * cell) / W,
                                   double(int64_t(std::floor(mh)) * cell) / H);
      pl.height = int64_t(std::floor(H * beta / double(p))) * p;
      pl.width = int64_t(std::floor(W * beta / double(p))) * p;
    }
    grid();
    DI_REQUIRE(pl.span_tokens() <= N && pl.width > 0 && pl.height > 0, "a ", width, "x", height,
               " image does not fit in ", N, " image tokens");
  }
  pl.vit_h = pl.height / p;
  pl.vit_w = pl.width / p;
  return pl;
}

RgbImage resize_bicubic(const RgbImage& in, int64_t width, int64_t height) {
  DI_REQUIRE(width > 0 && height > 0, "an image of ", in.width, "x", in.height,
             " pixels resized to ", width, "x", height, ": too elongated");
  if (width == in.width && height == in.height) return in;
  const Taps th = taps(in.width, width), tv = taps(in.height, height);
  // Horizontal pass first, over the input rows the vertical pass reads, into 8-bit rows.
  const int64_t y0 = tv.first[0], y1 = tv.first.back() + tv.count.back();
  RgbImage mid;
  const RgbImage* src = &in;
  if (width != in.width) {
    mid = {width, y1 - y0, std::vector<uint8_t>(size_t(width * (y1 - y0) * 3))};
    for (int64_t y = 0; y < mid.height; ++y)
      for (int64_t x = 0; x < width; ++x)
        for (int c = 0; c < 3; ++c)
          mid.rgb[size_t((y * width + x) * 3 + c)] =
              tap_sum(&in.rgb[size_t(((y + y0) * in.width + th.first[size_t(x)]) * 3 + c)], 3,
                      &th.k[size_t(x * th.ksize)], th.count[size_t(x)]);
    src = &mid;
  }
  if (height == in.height) return mid;
  const int64_t off = src == &mid ? y0 : 0;
  RgbImage out{width, height, std::vector<uint8_t>(size_t(width * height * 3))};
  const int64_t row = width * 3;
  for (int64_t y = 0; y < height; ++y)
    for (int64_t i = 0; i < row; ++i)
      out.rgb[size_t(y * row + i)] =
          tap_sum(&src->rgb[size_t((tv.first[size_t(y)] - off) * row + i)], row,
                  &tv.k[size_t(y * tv.ksize)], tv.count[size_t(y)]);
  return out;
}

RgbImage fit_and_pad(const RgbImage& in, int64_t width, int64_t height) {
  const double ratio = double(in.width) / double(in.height), dest = double(width) / double(height);
  int64_t w = width, h = height;
  if (ratio > dest)
    h = int64_t(std::nearbyint(double(in.height) / double(in.width) * double(width)));
  else if (ratio < dest)
    w = int64_t(std::nearbyint(double(in.width) / double(in.height) * double(height)));
  RgbImage fit = resize_bicubic(in, w, h);
  if (w == width && h == height) return fit;
  RgbImage out{width, height, std::vector<uint8_t>(size_t(width * height * 3), 127)};
  const int64_t x0 = w != width ? int64_t(std::nearbyint(double(width - w) * 0.5)) : 0;
  const int64_t y0 = w != width ? 0 : int64_t(std::nearbyint(double(height - h) * 0.5));
  for (int64_t y = 0; y < h; ++y)
    std::memcpy(&out.rgb[size_t(((y + y0) * width + x0) * 3)], &fit.rgb[size_t(y * w * 3)],
                size_t(w * 3));
  return out;
}

std::vector<int8_t> image_span_types(const ImagePlan& plan) {
  std::vector<int8_t> t{kImageStart};
  for (int64_t y = 0; y < plan.llm_h; ++y) {
    t.insert(t.end(), size_t(plan.llm_w), kImage);
    t.push_back(kImageNewLine);
  }
  t.push_back(kImageEnd);
  return t;
}

ImagePatches preprocess(const RgbImage& img, const VisionLimits& v) {
  ImagePatches out;
  out.plan = plan_image(img.width, img.height, v);
  const ImagePlan& pl = out.plan;
  const bool stretch =
      v.max_wh_ratio > 0 && double(img.width) >= v.max_wh_ratio * double(img.height);
  const RgbImage px =
      stretch ? resize_bicubic(img, pl.width, pl.height) : fit_and_pad(img, pl.width, pl.height);
  // bf16((u / 255 - 0.5) / 0.5), each step an fp32 operation, as the reference computes it.
  uint16_t lut[256];
  for (int u = 0; u < 256; ++u) lut[u] = f32_to_bf16((float(u) / 255.0f - 0.5f) / 0.5f);
  const int64_t p = v.patch;
  out.patches.resize(size_t(pl.vit_h * pl.vit_w * 3 * p * p));
  uint16_t* o = out.patches.data();
  for (int64_t ph = 0; ph < pl.vit_h; ++ph)
    for (int64_t pw = 0; pw < pl.vit_w; ++pw)
      for (int c = 0; c < 3; ++c)
        for (int64_t y = 0; y < p; ++y)
          for (int64_t x = 0; x < p; ++x)
            *o++ = lut[px.rgb[size_t(((ph * p + y) * pl.width + pw * p + x) * 3 + c)]];
  return out;
}

}  // namespace deepinfer::vision
