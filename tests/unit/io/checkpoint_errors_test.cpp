// Checkpoints that differ from the schema: missing, misshapen, mistyped and unexpected tensors
// are errors naming the tensor; DSpark and vision tensors are skipped; the conversions the
// reference performs at load (norms to bf16, F32 power-of-two scales to e8m0, F4 experts) work.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "core/dtype.h"
#include "io/checkpoint.h"
#include "io/tiny.h"
#include "io_test_util.h"

namespace deepinfer {
namespace {

using namespace testing_io;

// The tiny preset with a 512-token vocabulary: every feature, a few hundred KiB.
const std::string& micro_dir() {
  static ScratchDir dir;
  static const std::string path = [] {
    const std::string p = dir / "micro";
    write_tiny_checkpoint(p, micro_config(), TinyWriteOptions{});
    return p;
  }();
  return path;
}

struct Stored {
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
};

// Copies the micro checkpoint into a fresh directory as one model.safetensors, letting `edit`
// change or drop (return false) each tensor and appending `extra` tensors.
class Rewritten {
 public:
  explicit Rewritten(const std::function<bool(const std::string&, Stored&)>& edit,
                     const std::vector<std::pair<std::string, Stored>>& extra = {}) {
    auto src = TensorStore::open_dir(micro_dir());
    SafetensorsWriter w;
    for (const std::string& name : src->names()) {
      const TensorInfo& t = src->get(name);
      Stored s{t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes)};
      if (edit(name, s)) w.add(name, s.dtype, s.shape, std::move(s.bytes));
    }
    for (const auto& [name, s] : extra) w.add(name, s.dtype, s.shape, s.bytes);
    w.write(dir_ / "model.safetensors");
    write_text(dir_ / "config.json", read_text(micro_dir() + "/config.json"));
  }
  std::string dir() const { return dir_.path().string(); }
  std::string load_error(int expert_end = -1) const {
    return error_of([&] { Checkpoint::load(dir(), 0, expert_end); });
  }

 private:
  ScratchDir dir_;
};

auto drop(const std::string& victim) {
  return [victim](const std::string& name, Stored&) { return name != victim; };
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TEST(CheckpointErrors, TheUneditedCopyLoads) {
  Rewritten copy([](const std::string&, Stored&) { return true; });
  auto ck = Checkpoint::load(copy.dir());
  EXPECT_EQ(ck->converted_bytes, 0u);
  EXPECT_EQ(ck->store().size(), TensorStore::open_dir(micro_dir())->size());
}

TEST(CheckpointErrors, MissingTensorsAndScales) {
  EXPECT_TRUE(mentions(Rewritten(drop("layers.3.attn.wkv.weight")).load_error(),
                       {"missing tensor 'layers.3.attn.wkv.weight'", "[64, 64]"}));
  EXPECT_TRUE(mentions(Rewritten(drop("head.weight")).load_error(), {"'head.weight'"}));
  EXPECT_TRUE(
      mentions(Rewritten(drop("layers.1.attn.wq_b.scale")).load_error(),
               {"missing tensor 'layers.1.attn.wq_b.scale'", "'layers.1.attn.wq_b.weight'"}));
  EXPECT_TRUE(mentions(Rewritten(drop("layers.4.engram.embed.scale")).load_error(),
                       {"'layers.4.engram.embed.scale'"}));
  // Every expert must be in the files, also those another rank serves.
  EXPECT_TRUE(
      mentions(Rewritten(drop("layers.0.ffn.experts.7.w2.weight")).load_error(/*expert_end=*/4),
               {"missing tensor 'layers.0.ffn.experts.7.w2.weight'"}));
}

TEST(CheckpointErrors, WrongShapesAndDtypes) {
  Rewritten sink([](const std::string& n, Stored& s) {
    if (n == "layers.0.attn.attn_sink") s = {DType::F32, {5}, std::vector<uint8_t>(20)};
    return true;
  });
  EXPECT_TRUE(mentions(sink.load_error(),
                       {sink.dir(), "'layers.0.attn.attn_sink'", "F32 [5]", "expected F32 [4]"}));
  Rewritten hc_as_int([](const std::string& n, Stored& s) {
    if (n == "layers.2.hc_attn_fn") s.dtype = DType::I32;
    return true;
  });
  EXPECT_TRUE(mentions(hc_as_int.load_error(), {"'layers.2.hc_attn_fn'", "I32", "expected F32"}));
  Rewritten fp8_as_bf16([](const std::string& n, Stored& s) {
    if (n == "layers.0.attn.wq_a.weight") {
      s.dtype = DType::BF16;
      s.bytes.resize(s.bytes.size() * 2);
    }
    return true;
  });
  EXPECT_TRUE(mentions(fp8_as_bf16.load_error(),
                       {"'layers.0.attn.wq_a.weight'", "BF16 [64, 64]", "expected F8_E4M3"}));
  Rewritten transposed([](const std::string& n, Stored& s) {
    if (n == "layers.0.attn.wq_b.weight") s.shape = {s.shape[1], s.shape[0]};
    return true;
  });
  EXPECT_TRUE(mentions(transposed.load_error(), {"'layers.0.attn.wq_b.weight'", "F8_E4M3 [64, 256]",
                                                 "expected F8_E4M3 [256, 64]"}));
  Rewritten scale_shape([](const std::string& n, Stored& s) {
    if (n == "layers.0.attn.wq_a.scale") s.shape = {1, 4};  // [2, 2] holds the same bytes
    return true;
  });
  EXPECT_TRUE(mentions(scale_shape.load_error(),
                       {"'layers.0.attn.wq_a.scale'", "[1, 4]", "expected shape [2, 2]"}));
  Rewritten scale_as_bf16([](const std::string& n, Stored& s) {
    if (n == "layers.0.attn.wq_a.scale") {
      s.dtype = DType::BF16;
      s.bytes.resize(8);
    }
    return true;
  });
  EXPECT_TRUE(mentions(scale_as_bf16.load_error(), {"'layers.0.attn.wq_a.scale'", "F8_E8M0"}));
  // Packed fp4 as I8 must have [rows, cols / 2]; F4 must have the logical shape.
  Rewritten i8_unpacked([](const std::string& n, Stored& s) {
    if (n == "layers.0.ffn.experts.0.w1.weight") {
      s.shape = {32, 64};
      s.bytes.resize(s.bytes.size() * 2);
    }
    return true;
  });
  EXPECT_TRUE(mentions(i8_unpacked.load_error(),
                       {"'layers.0.ffn.experts.0.w1.weight'", "I8 [32, 64]", "I8 [32, 32]"}));
  Rewritten f4_packed_shape([](const std::string& n, Stored& s) {
    if (n == "layers.0.ffn.experts.0.w1.weight") {
      s.dtype = DType::E2M1;
      s.shape = {32, 16};
      s.bytes.resize(256);
    }
    return true;
  });
  EXPECT_TRUE(mentions(f4_packed_shape.load_error(),
                       {"'layers.0.ffn.experts.0.w1.weight'", "F4 [32, 16]", "F4 [32, 64]"}));
}

TEST(CheckpointErrors, UnexpectedTensorsAreErrorsKnownPartsAreSkipped) {
  const Stored small{DType::F32, {2}, std::vector<uint8_t>(8)};
  Rewritten extra([](const std::string&, Stored&) { return true; },
                  {{"layers.0.attn.extra", small}, {"rogue", small}});
  EXPECT_TRUE(
      mentions(extra.load_error(), {extra.dir(), "2 tensor(s)", "layers.0.attn.extra", "rogue"}));

  // Vision, the image-token router bias, the draft stages' aliases of the shared embedding and
  // head: present in the release, not run here.
  const std::vector<std::string> skipped = {"aligner.proj.weight",       "image_newline",
                                            "layers.0.ffn.gate.bias_vl", "mtp.0.embed.weight",
                                            "mtp.1.head.weight",         "vision.y"};
  std::vector<std::pair<std::string, Stored>> extras;
  for (const auto& n : skipped) extras.push_back({n, small});
  Rewritten known([](const std::string&, Stored&) { return true; }, extras);
  auto ck = Checkpoint::load(known.dir());
  EXPECT_EQ(ck->skipped_tensors, skipped);  // sorted by name
  // A name that merely contains a known prefix is not skipped.
  Rewritten lookalike([](const std::string&, Stored&) { return true; },
                      {{"layers.0.mtp.0.x", small}});
  EXPECT_TRUE(mentions(lookalike.load_error(), {"1 tensor(s)", "layers.0.mtp.0.x"}));
  // With the draft head loaded (this checkpoint has one), other mtp.* names are mistakes: a
  // tensor the head does not have, a stage beyond n_mtp_layers.
  Rewritten stray([](const std::string&, Stored&) { return true; },
                  {{"mtp.0.x", small}, {"mtp.2.attn.wq_a.weight", small}});
  EXPECT_TRUE(mentions(stray.load_error(), {"2 tensor(s)", "mtp.0.x", "mtp.2.attn.wq_a.weight"}));
}

TEST(CheckpointErrors, NormWeightsStoredAsF32AreRoundedToBf16) {
  // fp32 bit patterns and their bf16 under round-to-nearest-even, worked out by hand:
  // 0x3f804000 is below half an ulp (down), 0x3f808000 a tie to the even 0x3f80, 0x3f818000 a tie
  // to the even 0x3f82, 0x3f80c000 above half (up), 0xbf7fffff carries into the exponent.
  const uint32_t in[5] = {0x3f804000u, 0x3f808000u, 0x3f818000u, 0x3f80c000u, 0xbf7fffffu};
  const uint16_t want[5] = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0xbf80};
  std::vector<float> values(64);
  for (size_t i = 0; i < values.size(); ++i) std::memcpy(&values[i], &in[i % 5], 4);
  Rewritten as_f32([&](const std::string& n, Stored& s) {
    if (n == "layers.0.attn_norm.weight") s = {DType::F32, {64}, f32_bytes(values)};
    return true;
  });
  auto ck = Checkpoint::load(as_f32.dir());
  const Weight& w = ck->layers[0].attn_norm;
  EXPECT_EQ(w.format, WeightFormat::BF16);
  EXPECT_NE(static_cast<const void*>(w.data),
            static_cast<const void*>(ck->store().get("layers.0.attn_norm.weight").data));
  for (size_t i = 0; i < 64; ++i) ASSERT_EQ(w.bf16()[i], want[i % 5]) << i;
  EXPECT_EQ(ck->converted_bytes, 128u);
}

TEST(CheckpointErrors, F32ScalesMustBePowersOfTwo) {
  auto ck0 = Checkpoint::load(micro_dir());
  const Weight& orig = ck0->layers[0].wq_a;  // scale [2, 2]
  std::vector<float> pow2(4);
  for (int i = 0; i < 4; ++i) pow2[size_t(i)] = std::ldexp(1.0f, int(orig.scale[i]) - 127);
  auto with_scale = [](const std::vector<float>& v) {
    return [v](const std::string& n, Stored& s) {
      if (n == "layers.0.attn.wq_a.scale") s = {DType::F32, {2, 2}, f32_bytes(v)};
      return true;
    };
  };
  Rewritten f32_scales(with_scale(pow2));
  auto ck = Checkpoint::load(f32_scales.dir());
  const Weight& w = ck->layers[0].wq_a;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(w.scale[i], orig.scale[i]) << i;
  EXPECT_EQ(ck->converted_bytes, 4u);
  for (float bad : {3.0f, 0.0f, -2.0f, 1.5f * std::ldexp(1.0f, -20)}) {
    std::vector<float> v = pow2;
    v[3] = bad;
    EXPECT_TRUE(mentions(Rewritten(with_scale(v)).load_error(),
                         {"'layers.0.attn.wq_a.scale'", "element 3", "not a power of two"}))
        << bad;
  }
}

TEST(CheckpointErrors, ExpertsStoredAsF4WithTheirLogicalShape) {
  auto ck0 = Checkpoint::load(micro_dir());
  const Weight& orig = ck0->layers[5].experts[6].w2;  // [64, 32] logical
  const std::vector<uint8_t> packed(orig.u8(), orig.u8() + 64 * 16);
  Rewritten as_f4([](const std::string& n, Stored& s) {
    if (n == "layers.5.ffn.experts.6.w2.weight") {
      EXPECT_EQ(s.shape, (Shape{64, 16}));
      s.dtype = DType::E2M1;
      s.shape = {64, 32};  // the same bytes, counted in 4-bit elements
    }
    return true;
  });
  auto ck = Checkpoint::load(as_f4.dir());
  const Weight& w = ck->layers[5].experts[6].w2;
  EXPECT_EQ(w.format, WeightFormat::Fp4Row);
  EXPECT_EQ(w.shape, (Shape{64, 32}));
  EXPECT_EQ(w.data, ck->store().get("layers.5.ffn.experts.6.w2.weight").data);
  EXPECT_EQ(std::vector<uint8_t>(w.u8(), w.u8() + packed.size()), packed);
  EXPECT_EQ(ck->converted_bytes, 0u);
}

// The stored dtype decides the computation (checkpoint.h's table): an unquantized weight in a
// normally fp8 slot is a plain linear on its stored values, bf16 linears round F32 to bf16, fp32
// slots keep F32 values, and forms no slot accepts are refused naming what is.
TEST(CheckpointErrors, StoredDtypeDecidesTheComputation) {
  std::vector<float> vals(64 * 128);
  for (size_t i = 0; i < vals.size(); ++i) vals[i] = 0.01f * float(i % 97) + 1e-4f;  // not bf16
  auto values_for = [&](const Shape& shape) {
    return f32_bytes(std::vector<float>(vals.begin(), vals.begin() + shape.numel()));
  };
  auto unquantized = [&](const std::string& weight, DType dtype) {
    return [=](const std::string& n, Stored& s) {
      if (n == weight + ".scale") return false;
      if (n == weight + ".weight") {
        if (dtype == DType::F32)
          s = {DType::F32, s.shape, values_for(s.shape)};
        else
          s = {DType::BF16, s.shape, std::vector<uint8_t>(size_t(s.shape.numel()) * 2, 0x3c)};
      }
      return true;
    };
  };
  {  // wq_a [64, 64] stored F32: kept as stored, input not quantized
    Rewritten r(unquantized("layers.0.attn.wq_a", DType::F32));
    auto ck = Checkpoint::load(r.dir());
    const Weight& w = ck->layers[0].wq_a;
    EXPECT_EQ(w.format, WeightFormat::F32);
    EXPECT_FALSE(w.quant_input);
    EXPECT_EQ(w.f32()[5], vals[5]);
    EXPECT_EQ(loaded_form(SlotKind::QLinear, w),
              "f32 values -> plain linear (input not quantized)");
    EXPECT_TRUE(ck->layers[0].wq_b.quant_input);  // its neighbours stay fp8 QLins
    EXPECT_EQ(loaded_form(SlotKind::QLinear, ck->layers[0].wq_b),
              "fp8 e4m3 + e8m0 32x32 -> act_quant + fp8 QLin");
  }
  {  // wo_a [64, 128] stored F32: a bf16 parameter, rounded
    Rewritten r(unquantized("layers.0.attn.wo_a", DType::F32));
    auto ck = Checkpoint::load(r.dir());
    const Weight& w = ck->layers[0].wo_a;
    EXPECT_EQ(w.format, WeightFormat::BF16);
    EXPECT_EQ(w.bf16()[5], f32_to_bf16(vals[5]));
  }
  {  // the release's fp8 wo_a: dequantized values, input not quantized
    auto ck = Checkpoint::load(micro_dir());
    EXPECT_EQ(ck->layers[0].wo_a.format, WeightFormat::Fp8Block);
    EXPECT_FALSE(ck->layers[0].wo_a.quant_input);
    EXPECT_TRUE(ck->layers[0].experts[1].w1.quant_input);
    EXPECT_TRUE(ck->layers[0].shared.w2.quant_input);
  }
  {  // the ratio-2 compressor of layer 2 stored F32: fp32 values kept (the schema once said BF16)
    std::vector<float> cmp(64 * 64);
    for (size_t i = 0; i < cmp.size(); ++i) cmp[i] = 1.0f + float(i) * 1e-6f;
    Rewritten r([&](const std::string& n, Stored& s) {
      if (n == "layers.2.attn.compressor.wgate.weight") s = {DType::F32, {64, 64}, f32_bytes(cmp)};
      return true;
    });
    auto ck = Checkpoint::load(r.dir());
    const Weight& w = ck->layers[2].cmp_wgate;
    EXPECT_EQ(w.format, WeightFormat::F32);
    EXPECT_EQ(w.f32()[7], cmp[7]);
    EXPECT_NE(bf16_to_f32(f32_to_bf16(cmp[7])), cmp[7]);          // a value bf16 cannot hold
    EXPECT_EQ(ck->layers[2].cmp_wkv.format, WeightFormat::BF16);  // released BF16 stays mapped
  }
  {  // a float weight with its scale left behind
    Rewritten r([&](const std::string& n, Stored& s) {
      if (n == "layers.0.attn.wkv.weight") s = {DType::F32, s.shape, values_for(s.shape)};
      return true;
    });
    EXPECT_TRUE(mentions(r.load_error(), {"'layers.0.attn.wkv.scale'", "'layers.0.attn.wkv.weight'",
                                          "F32 [64, 64]", "only fp8/fp4 weights carry scales"}));
  }
  {  // packed fp4 where the reference holds a bf16 parameter
    Rewritten r([&](const std::string& n, Stored& s) {
      if (n == "layers.0.attn.wo_a.weight") s = {DType::I8, {64, 64}, std::vector<uint8_t>(4096)};
      if (n == "layers.0.attn.wo_a.scale")
        s = {DType::E8M0, {64, 4}, std::vector<uint8_t>(256, 127)};
      return true;
    });
    EXPECT_TRUE(mentions(r.load_error(), {"'layers.0.attn.wo_a.weight'", "I8 [64, 64]",
                                          "expected BF16 [64, 128]", "or F8_E4M3 [64, 128]"}));
  }
  {  // fp8 codes in an fp32 slot
    Rewritten r([&](const std::string& n, Stored& s) {
      if (n == "head.weight") s = {DType::E4M3, s.shape, std::vector<uint8_t>(s.bytes.size() / 2)};
      return true;
    });
    EXPECT_TRUE(
        mentions(r.load_error(), {"'head.weight'", "F8_E4M3 [512, 64]",
                                  "expected F32 [512, 64] (or BF16/F16, widened exactly)"}));
  }
}

TEST(CheckpointErrors, NoConfig) {
  ScratchDir dir;
  EXPECT_TRUE(mentions(error_of([&] { Checkpoint::load(dir.path().string()); }), {"config.json"}));
}

}  // namespace
}  // namespace deepinfer
