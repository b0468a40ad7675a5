// libFuzzer target: ModelConfig::parse on arbitrary text. Bad input must end in
// deepinfer::Error. Anything else is a finding: another exception, a crash or sanitizer report,
// an accepted config that does not survive to_json and back unchanged, or layer roles that break
// the sharing rules validation promises (V41_SPEC.md §1.2).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "io/config.h"

namespace {

[[noreturn]] void finding(const char* what, int layer) {
  std::fprintf(stderr, "accepted config breaks an invariant: %s (layer %d)\n", what, layer);
  std::abort();
}

void check_roles(const deepinfer::ModelConfig& c) {
  const auto roles = deepinfer::layer_roles(c);
  if (int(roles.size()) != c.n_layers) finding("role count", -1);
  for (int l = 0; l < c.n_layers; ++l) {
    const deepinfer::LayerRole& r = roles[size_t(l)];
    if (r.ratio == 0) {
      if (r.kv_source || r.index_source || r.kv_from >= 0) finding("window layer with a role", l);
      continue;
    }
    if (r.kv_from < 0 || r.kv_from > l) finding("KV source not at or before", l);
    const deepinfer::LayerRole& kv = roles[size_t(r.kv_from)];
    if (!kv.kv_source || kv.ratio != r.ratio) finding("KV from a non-source or another ratio", l);
    if (r.topk_from < 0 || r.topk_from > l || !roles[size_t(r.topk_from)].index_source)
      finding("top-k from a non index source", l);
    if (roles[size_t(r.topk_from)].kv_from != r.kv_from) finding("top-k over another KV", l);
    if (r.index_source) {
      if (r.keys_from != r.kv_from || !roles[size_t(r.keys_from)].key_owner)
        finding("index keys from a non-owner", l);
    }
    if (r.key_owner && !(r.kv_source && r.index_source)) finding("key owner without both", l);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  deepinfer::ModelConfig c;
  try {
    c = deepinfer::ModelConfig::parse(text, "fuzz input");
  } catch (const deepinfer::Error&) {
    return 0;
  }
  // Outside the try: an Error from here on is a finding too.
  const std::string flat = c.to_json();
  const deepinfer::ModelConfig back = deepinfer::ModelConfig::parse(flat, "round trip");
  if (back.to_json() != flat) finding("to_json round trip changed the config", -1);
  check_roles(c);
  return 0;
}
