// Streaming detokenization: every prefix of every corpus encoding, pushed id by id, yields
// exactly decode() of that prefix, in pieces that are each valid UTF-8.
#include <gtest/gtest.h>

#include "test_data.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace deepinfer {
namespace {

TEST(Detokenizer, EveryPrefixOfTheCorpus) {
  DI_REQUIRE_DEEPSEEK_TOKENIZER(tok);
  size_t prefixes = 0, held_back = 0;
  for (const auto& entry : test::read_jsonl(test::data_path("corpus.jsonl"))) {
    const std::vector<int32_t> ids = tok->encode(test::corpus_bytes(entry));
    // One streaming pass serves every prefix: after pushing ids[0..k), the output so far plus
    // a flush of a copy must equal decode(ids[0..k)).
    for (const bool skip : {false, true}) {
      IncrementalDetokenizer detok(*tok, skip);
      std::string streamed;
      for (size_t k = 0; k <= ids.size(); ++k) {
        if (k > 0) {
          const std::string piece = detok.push(ids[k - 1]);
          ASSERT_TRUE(utf8::is_valid(piece)) << entry.dump();
          streamed += piece;
        }
        IncrementalDetokenizer copy = detok;
        const std::string flushed = copy.flush();  // non-empty when bytes were held back
        held_back += !flushed.empty();
        ASSERT_EQ(streamed + flushed, tok->decode(std::span(ids.data(), k), skip))
            << entry.dump() << " prefix " << k << " skip_special " << skip;
        ++prefixes;
      }
    }
  }
  EXPECT_GT(prefixes, 100000u);
  EXPECT_GT(held_back, 100u);  // the corpus does split characters across tokens
}

TEST(Detokenizer, SplitsNoCharacter) {
  DI_REQUIRE_DEEPSEEK_TOKENIZER(tok);
  // Emoji and rare CJK characters are spread over several byte-level tokens.
  const std::string text = "😀👨‍👩‍👧 龘𠀀 é";
  const std::vector<int32_t> ids = tok->encode(text);
  ASSERT_GT(ids.size(), 6u);
  IncrementalDetokenizer detok(*tok);
  std::string out;
  for (const int32_t id : ids) {
    const std::string piece = detok.push(id);
    EXPECT_TRUE(utf8::is_valid(piece));
    EXPECT_EQ(piece.find("\xEF\xBF\xBD"), std::string::npos);  // no U+FFFD along the way
    out += piece;
  }
  EXPECT_EQ(detok.flush(), "");  // nothing held back
  EXPECT_EQ(out, text);
}

TEST(Detokenizer, SpecialTokensShownOrSkipped) {
  DI_REQUIRE_DEEPSEEK_TOKENIZER(tok);
  const std::vector<int32_t> ids = tok->encode("<｜begin▁of▁sentence｜>Hi<｜end▁of▁sentence｜>");
  ASSERT_EQ(ids.front(), 0);
  ASSERT_EQ(ids.back(), 1);
  for (const bool skip : {false, true}) {
    IncrementalDetokenizer detok(*tok, skip);
    std::string out;
    for (const int32_t id : ids) out += detok.push(id);
    out += detok.flush();
    EXPECT_EQ(out, skip ? "Hi" : "<｜begin▁of▁sentence｜>Hi<｜end▁of▁sentence｜>");
  }
}

}  // namespace
}  // namespace deepinfer
