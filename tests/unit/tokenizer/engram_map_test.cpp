// Engram compressed token map of the real tokenizer against a map computed independently (in
// JavaScript, with its own Unicode tables) by tests/tokenizer/gen_expected.mjs.
#include <gtest/gtest.h>

#include "test_data.h"
#include "tokenizer/engram_map.h"

namespace deepinfer {
namespace {

TEST(EngramMap, MatchesIndependentComputation) {
  DI_REQUIRE_DEEPSEEK_TOKENIZER(tok);
  const auto fixture = nlohmann::json::parse(test::read_text(test::data_path("engram_map.json")));
  const EngramTokenMap map = build_engram_token_map(*tok);

  ASSERT_EQ(tok->vocab_size(), fixture["vocab_size"].get<int32_t>());
  ASSERT_EQ(map.compressed.size(), size_t(tok->vocab_size()));
  // Rebuild the expected map: ids listed in "merged" reuse an earlier key, every other id opens
  // the next one.
  std::vector<int32_t> want(map.compressed.size(), -1);
  for (const auto& pair : fixture["merged"]) want[pair[0].get<size_t>()] = pair[1].get<int32_t>();
  int32_t next = 0;
  for (int32_t& w : want) {
    if (w < 0) w = next++;
  }
  ASSERT_EQ(next, fixture["compressed_vocab_size"].get<int32_t>());

  int mismatches = 0;
  for (size_t id = 0; id < want.size(); ++id) {
    if (map.compressed[id] != want[id] && ++mismatches <= 10) {
      const int32_t one[1] = {int32_t(id)};
      ADD_FAILURE() << "id " << id << " token \"" << tok->id_to_token(int32_t(id))
                    << "\" decoded \"" << tok->decode(one) << "\" normalized \""
                    << engram_normalize(tok->decode(one)) << "\": got " << map.compressed[id]
                    << ", want " << want[id];
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(map.compressed_vocab_size, fixture["compressed_vocab_size"].get<int32_t>());
}

TEST(EngramMap, IsDeterministic) {
  DI_REQUIRE_DEEPSEEK_TOKENIZER(tok);
  const EngramTokenMap a = build_engram_token_map(*tok);
  const EngramTokenMap b = build_engram_token_map(*tok);
  EXPECT_EQ(a.compressed, b.compressed);
  EXPECT_EQ(a.compressed_vocab_size, b.compressed_vocab_size);
  // Compressed ids are dense and opened in id order.
  int32_t seen = 0;
  for (const int32_t c : a.compressed) {
    ASSERT_LE(c, seen);
    if (c == seen) ++seen;
  }
  EXPECT_EQ(seen, a.compressed_vocab_size);
}

TEST(EngramMap, Normalization) {
  EXPECT_EQ(engram_normalize(" The"), "the");
  EXPECT_EQ(engram_normalize("THE\t"), "the");
  EXPECT_EQ(engram_normalize("Café"), "cafe");
  EXPECT_EQ(engram_normalize("Cafe\u0301"), "cafe");
  EXPECT_EQ(engram_normalize("ﬁ"), "fi");        // NFKC
  EXPECT_EQ(engram_normalize("ＡＢＣ"), "abc");  // fullwidth
  EXPECT_EQ(engram_normalize(" "), " ");         // a lone space survives
  EXPECT_EQ(engram_normalize("\t"), " ");
  EXPECT_EQ(engram_normalize("\n\n\n"), " ");
  EXPECT_EQ(engram_normalize("  "), " ");
  EXPECT_EQ(engram_normalize(" \u3000"), " ");  // NFKC turns U+3000 into a space first
  EXPECT_EQ(engram_normalize("\u2028"), "");    // White_Space but not a collapsed blank
  EXPECT_EQ(engram_normalize("ΟΔΟΣ"), "οδοσ");  // per character: no final-sigma form
  EXPECT_EQ(engram_normalize("İstanbul"), "istanbul");
  EXPECT_EQ(engram_normalize("a \t\r\n b"), "a b");
}

}  // namespace
}  // namespace deepinfer
