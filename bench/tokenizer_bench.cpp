// Tokenizer throughput on the test corpus: encode MB/s on the first pass (empty pre-token
// cache) and on later passes, and decode MB/s. bench/tokenizer_bench.sh runs it beside the
// independent JavaScript implementation on the same corpus.
//
//   tokenizer_bench <tokenizer dir or tokenizer.json> <corpus.jsonl>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(char(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <tokenizer dir or tokenizer.json> <corpus.jsonl>\n", argv[0]);
    return 2;
  }
  try {
    std::vector<std::string> texts;
    size_t bytes = 0;
    {
      std::ifstream in(argv[2]);
      if (!in) throw std::runtime_error(std::string("cannot open ") + argv[2]);
      for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        const auto j = nlohmann::json::parse(line);
        texts.push_back(j.contains("hex") ? from_hex(j["hex"]) : j["text"].get<std::string>());
        bytes += texts.back().size();
      }
    }
    auto t0 = std::chrono::steady_clock::now();
    const auto tok = deepinfer::Tokenizer::load(argv[1]);
    std::printf("load: %.0f ms\n", seconds_since(t0) * 1e3);

    size_t n_tokens = 0;
    t0 = std::chrono::steady_clock::now();
    std::vector<std::vector<int32_t>> encoded;
    for (const std::string& s : texts) {
      encoded.push_back(tok->encode(s));
      n_tokens += encoded.back().size();
    }
    const double cold = seconds_since(t0);

    int passes = 0;
    t0 = std::chrono::steady_clock::now();
    do {
      for (const std::string& s : texts) tok->encode(s);
      ++passes;
    } while (seconds_since(t0) < 2.0);
    const double warm = seconds_since(t0) / passes;

    int decode_passes = 0;
    size_t decoded_bytes = 0;
    t0 = std::chrono::steady_clock::now();
    do {
      for (const auto& ids : encoded) decoded_bytes += tok->decode(ids).size();
      ++decode_passes;
    } while (seconds_since(t0) < 1.0);
    const double decode = seconds_since(t0);

    const double mb = double(bytes) / 1e6;
    std::printf("corpus: %zu strings, %.3f MB, %zu tokens\n", texts.size(), mb, n_tokens);
    std::printf("deepinfer encode: %.2f MB/s first pass, %.2f MB/s later passes (%d)\n", mb / cold,
                mb / warm, passes);
    std::printf("deepinfer decode: %.2f MB/s\n", double(decoded_bytes) / 1e6 / decode);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
