// Typed access to fields of a request body, with OpenAI-style errors naming the field
// (implemented in openai_request.cpp). Internal to src/server (it carries nlohmann/json); the
// public headers never include it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/api_request.h"

namespace deepinfer::server {

// Ordered, so that objects passed on as text (tool schemas) keep the key order the client chose.
using Json = nlohmann::ordered_json;

// Dumps for the wire: invalid UTF-8 (partial characters of a token's bytes) becomes U+FFFD
// instead of throwing.
std::string dump_json(const Json& j);

// The field, or null when it is absent or JSON null (the API treats both as "not given").
const Json* find_field(const Json& obj, const char* key);

[[noreturn]] void throw_bad_type(const std::string& name, const char* expected, const Json& got);
[[noreturn]] void throw_bad_value(const std::string& name, const std::string& what);

// An integer within [lo, hi]; numbers with a fraction are wrong types, as in the OpenAI API.
int64_t get_int(const Json& v, const std::string& name, int64_t lo, int64_t hi);
// An array of token ids, each in [0, vocab).
std::vector<int32_t> token_list(const Json& v, const std::string& name, int64_t vocab);
// An image (a data: URL, or with allow_files a file path too) decoded as Pillow decodes it and
// preprocessed for the model's tower (docs/vision.md); `what` names it in errors.
RequestImage load_image(const std::string& source, const std::string& what,
                        const vision::VisionLimits& v, bool allow_files);

// --- request fields shared by the OpenAI endpoints and the offline runner's JSONL lines ---

struct OutputShape;

// temperature, top_p, top_k, min_p, the penalties, seed, ignore_eos, stop and stop_token_ids
// into `p`; fields absent or null keep p's values (the runner's flags, the API's defaults).
void parse_sampling_fields(const Json& j, const ModelInfo& info, SamplingParams* p);
// "response_format": text, json_object or json_schema; sets `shape` and returns the text the
// chat encoder renders for it (empty for text).
std::string parse_response_format(const Json& j, OutputShape* shape);
// The grammar of `shape` from info.grammars into p; a schema that cannot be compiled is a 400
// naming the place in it.
void constrain(const OutputShape& shape, const ModelInfo& info, SamplingParams* p);

}  // namespace deepinfer::server
