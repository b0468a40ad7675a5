// The tokenizer against an independent implementation (@lenml/tokenizers) on the assembled
// corpus (tests/data/tokenizer/corpus.jsonl; expected ids from tests/tokenizer/gen_expected.mjs).
#include <gtest/gtest.h>

#include "test_data.h"
#include "tokenizer/utf8.h"

namespace deepinfer {
namespace {

std::string show_ids(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s + "]";
}

TEST(TokenizerCorpus, IdsMatchIndependentImplementation) {
  DI_REQUIRE_DEEPSEEK_TOKENIZER(tok);
  const auto corpus = test::read_jsonl(test::data_path("corpus.jsonl"));
  const auto expected = test::read_jsonl(test::data_path("expected_ids.jsonl"));
  ASSERT_GE(corpus.size(), 2000u);
  ASSERT_EQ(corpus.size(), expected.size()) << "regenerate with tests/tokenizer/gen_expected.mjs";
  int failures = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::string text = test::corpus_bytes(corpus[i]);
    const std::vector<int32_t> want = expected[i].get<std::vector<int32_t>>();
    const std::vector<int32_t> got = tok->encode(text);
    if (got != want && ++failures <= 10) {
      ADD_FAILURE() << "corpus line " << i + 1 << " (" << corpus[i]["cat"] << ") "
                    << corpus[i].dump() << "\n  want " << show_ids(want) << "\n  got  "
                    << show_ids(got);
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(TokenizerCorpus, DecodeInvertsEncode) {
  DI_REQUIRE_DEEPSEEK_TOKENIZER(tok);
  int checked = 0;
  for (const auto& entry : test::read_jsonl(test::data_path("corpus.jsonl"))) {
    const std::string text = test::corpus_bytes(entry);
    const std::string decoded = tok->decode(tok->encode(text));
    // Invalid UTF-8 comes back repaired, exactly as it was encoded.
    EXPECT_EQ(decoded, utf8::lossy(text)) << entry.dump();
    if (utf8::is_valid(text)) ++checked;
  }
  EXPECT_GE(checked, 2000);
}

TEST(TokenizerCorpus, BosIsPrependedOnRequest) {
  DI_REQUIRE_DEEPSEEK_TOKENIZER(tok);
  EXPECT_EQ(tok->eos_id(), 1);
  const std::vector<int32_t> plain = tok->encode("Hello");
  std::vector<int32_t> with_bos = tok->encode("Hello", /*add_bos=*/true);
  ASSERT_EQ(with_bos.size(), plain.size() + 1);
  EXPECT_EQ(with_bos[0], 0);
  EXPECT_EQ(std::vector<int32_t>(with_bos.begin() + 1, with_bos.end()), plain);
}

}  // namespace
}  // namespace deepinfer
