// Request bodies of /v1/completions, /v1/chat/completions, /tokenize and /detokenize -> engine
// requests. Every field is type-checked and range-checked here, so what reaches the engine is
// already valid; the engine's own checks stay as a second line.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "server/json_fields.h"
#include "server/structured_output.h"
#include "tokenizer/chat.h"
#include "tokenizer/py_json.h"

namespace deepinfer::server {

namespace {

// Deeper bodies are refused before parsing: the parser copes, but dumping and destroying nested
// values recurses, and no legitimate request nests this deep.
constexpr int kMaxNesting = 64;

const char* type_name(const Json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number_float()) return "a decimal number";
  if (v.is_binary()) return "an integer beyond 64 bits";
  return "an unsupported value";
}

// --- requests ---

constexpr int64_t kMaxChoices = 128;         // n
constexpr int64_t kMaxEngineRequests = 256;  // prompts x n of one call
constexpr int64_t kMaxLogprobs = 20;
constexpr size_t kMaxStops = 16;

Json parse_body(std::string_view body) {
  if (json_nesting_depth(body) > kMaxNesting)
    throw ApiError(400, str_cat("The request body nests deeper than ", kMaxNesting, " levels."), {},
                   "invalid_json");
  // Integers beyond 64 bits keep their digits (tool schemas and arguments are rendered into the
  // prompt as Python writes them).
  Json j = tokenizer_internal::parse_json_exact(body);
  if (j.is_discarded()) {
    std::string what;
    try {
      [[maybe_unused]] const Json again = Json::parse(body);  // for where and why it fails
    } catch (const Json::exception& e) {
      // Drop the library's "[json.exception.parse_error.101] " prefix; keep where and why.
      what = e.what();
      if (const size_t at = what.find("] "); at != std::string::npos) what.erase(0, at + 2);
    }
    throw ApiError(400, "The request body is not valid JSON: " + what, {}, "invalid_json");
  }
  if (!j.is_object())
    throw ApiError(400, str_cat("The request body must be a JSON object, not ", type_name(j), "."),
                   {}, "invalid_json");
  return j;
}

std::string get_string(const Json& v, const std::string& name) {
  if (!v.is_string()) throw_bad_type(name, "a string", v);
  return v.get<std::string>();
}

bool get_bool(const Json& v, const std::string& name) {
  if (!v.is_boolean()) throw_bad_type(name, "a boolean", v);
  return v.get<bool>();
}

double get_number(const Json& v, const std::string& name, double lo, double hi) {
  if (!v.is_number()) throw_bad_type(name, "a number", v);
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    throw_bad_value(name,
                    str_cat("expected a number in [", lo, ", ", hi, "], got ", v.dump(), "."));
  return x;
}

int32_t get_token_id(const Json& v, const std::string& name, int64_t vocab) {
  if (!v.is_number_integer()) throw_bad_type(name, "an integer token id", v);
  const bool ok = v.is_number_unsigned() ? v.get<uint64_t>() < uint64_t(vocab)
                                         : v.get<int64_t>() >= 0 && v.get<int64_t>() < vocab;
  if (!ok)
    throw_bad_value(name, str_cat(v.dump(), " is not a token id of this model (the vocabulary has ",
                                  vocab, " tokens)."));
  return int32_t(v.get<int64_t>());
}

// The field `key` of `obj`, which must be there (and be an object when `object`): else a 400
// naming `param`, with `message` or "Missing required parameter".
const Json& need(const Json& obj, const char* key, const std::string& param,
                 const char* message = nullptr, bool object = false) {
  const Json* v = find_field(obj, key);
  if (!v || (object && !v->is_object()))
    throw ApiError(400, message ? message : str_cat("Missing required parameter: '", key, "'."),
                   param, "missing");
  return *v;
}

// The string field `key`, or `absent` when it is not given.
std::string opt_string(const Json& obj, const char* key, const std::string& name,
                       const char* absent = "") {
  const Json* v = find_field(obj, key);
  return v ? get_string(*v, name) : absent;
}

// Sets `*out` from the boolean field `key` when it is given.
void read_bool(const Json& obj, const char* key, bool* out, const std::string& name) {
  if (const Json* v = find_field(obj, key)) *out = get_bool(*v, name);
}

std::string check_model(const Json& j, const ModelInfo& info) {
  const std::string name = opt_string(j, "model", "model", info.names.at(0).c_str());
  if (std::ranges::find(info.names, name) == info.names.end())
    throw ApiError(404,
                   str_cat("The model '", name, "' does not exist; this server serves '",
                           info.names.at(0), "'."),
                   "model", "model_not_found");
  return info.names.at(0);
}

const Tokenizer& need_tokenizer(const ModelInfo& info, const std::string& param, const char* what) {
  if (!info.tokenizer)
    throw ApiError(400,
                   str_cat("This model has no tokenizer, so ", what,
                           " cannot be used; send prompts as token ids."),
                   param, "no_tokenizer");
  return *info.tokenizer;
}

// "prompt": a string, an array of strings, an array of token ids, or an array of those.
std::vector<std::vector<int32_t>> parse_prompts(const Json& j, const ModelInfo& info) {
  const Json& p = need(j, "prompt", "prompt");
  if (!p.is_string() && !p.is_array())
    throw_bad_type("prompt", "a string, an array of strings or an array of token ids", p);
  if (p.empty()) throw_bad_value("prompt", "the prompt list is empty.");  // a string's size is 1
  // One prompt (a string, or an array of ids), or an array of prompts all of the first's kind.
  const bool one = p.is_string() || p[0].is_number();
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < (one ? 1 : p.size()); ++i) {
    const Json& e = one ? p : p[i];
    const std::string name = one ? "prompt" : str_cat("prompt[", i, "]");
    if (e.is_string() && (one || p[0].is_string()))
      prompts.push_back(
          need_tokenizer(info, name, "text prompts").encode(e.get<std::string>(), false));
    else if (e.is_array() && (one || p[0].is_array()))
      prompts.push_back(token_list(e, name, info.vocab_size));
    else
      throw_bad_type(name, "all strings or all arrays of token ids", e);
  }
  for (size_t i = 0; i < prompts.size(); ++i)
    if (prompts[i].empty())
      throw_bad_value(prompts.size() == 1 ? "prompt" : str_cat("prompt[", i, "]"),
                      "the prompt is empty.");
  return prompts;
}

// --- chat ---

ChatRole parse_role(const Json& v, const std::string& name) {
  // In the order of ChatRole.
  static constexpr std::string_view kRoles[] = {"system", "user",      "assistant",
                                                "tool",   "developer", "latest_reminder"};
  const std::string r = get_string(v, name);
  if (const auto it = std::ranges::find(kRoles, r); it != std::end(kRoles))
    return ChatRole(it - std::begin(kRoles));
  throw_bad_value(name, str_cat("'", r,
                                "' is not one of system, user, assistant, tool, developer, "
                                "latest_reminder."));
}

// Where an image part stands in the chat text until the prompt is tokenized (it becomes the
// image token there).
constexpr std::string_view kImageMark = "\x1e\x1fimage\x1f\x1e";

// An image part's picture, decoded and preprocessed for the model's tower.
RequestImage parse_image_part(const Json& part, const std::string& name, const ModelInfo& info) {
  if (info.vision.max_tokens <= 0)
    throw ApiError(400, "This model has no vision tower; image parts are not supported.",
                   name + ".type", "unsupported_value");
  const Json& u = need(part, "image_url", name + ".image_url", "An image part needs 'image_url'.");
  const std::string where = name + ".image_url" + (u.is_object() ? ".url" : "");
  const std::string url =
      get_string(u.is_object() ? need(u, "url", where, "image_url needs 'url'.") : u, where);
  try {
    return load_image(url, where, info.vision, /*allow_files=*/false);
  } catch (const Error& e) {  // the image's own errors (vision/ throws no ApiError)
    throw ApiError(400, e.what(), where, "invalid_image");
  }
}

// A string, or an array of {"type": "text", "text": ...} parts, joined by a blank line as the
// reference encoder joins text blocks; an {"type": "image_url", ...} part goes to `images` and
// leaves kImageMark in the text.
std::string parse_content(const Json& v, const std::string& name, const ModelInfo& info,
                          std::vector<RequestImage>* images) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) throw_bad_type(name, "a string or an array of content parts", v);
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string part = str_cat(name, "[", i, "]");
    if (!v[i].is_object()) throw_bad_type(part, "an object", v[i]);
    const std::string t = opt_string(v[i], "type", part + ".type");
    if (t == "image_url" && images) {
      images->push_back(parse_image_part(v[i], part, info));
      out += kImageMark;
      continue;
    }
    if (t != "text")
      throw ApiError(400,
                     str_cat("Content part type '", t, "' is not supported; only 'text'",
                             images ? " and 'image_url' are." : " is."),
                     part + ".type", "unsupported_value");
    const Json& text = need(v[i], "text", part + ".text", "A text part needs 'text'.");
    if (i) out += "\n\n";
    out += get_string(text, part + ".text");
  }
  return out;
}

std::vector<ChatToolCall> parse_tool_calls(const Json& v, const std::string& name) {
  if (!v.is_array()) throw_bad_type(name, "an array", v);
  std::vector<ChatToolCall> calls;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string c = str_cat(name, "[", i, "]");
    if (!v[i].is_object()) throw_bad_type(c, "an object", v[i]);
    ChatToolCall& call = calls.emplace_back();
    call.id = opt_string(v[i], "id", c + ".id");
    const Json& f =
        need(v[i], "function", c + ".function", "A tool call needs a 'function' object.", true);
    call.name = get_string(need(f, "name", c + ".function.name", "A tool call needs a name."),
                           c + ".function.name");
    // Arguments are JSON text in the API; an object sent as such is accepted too.
    const Json* args = find_field(f, "arguments");
    if (!args)
      call.arguments = "{}";
    else if (args->is_string())
      call.arguments = args->get<std::string>();
    else if (args->is_object())
      call.arguments = tokenizer_internal::py_json_dumps(*args);
    else
      throw_bad_type(c + ".function.arguments", "a JSON string", *args);
  }
  return calls;
}

// An OpenAI "tools" array checked for shape, as the text the encoder reads (big integers keep
// their digits); empty for an empty array.
std::string tools_text(const Json& tools, const std::string& where) {
  if (!tools.is_array()) throw_bad_type(where, "an array", tools);
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const std::string name = str_cat(where, "[", i, "]");
    if (!t.is_object()) throw_bad_type(name, "an object", t);
    if (opt_string(t, "type", name + ".type", "function") != "function")
      throw_bad_value(name + ".type", "only 'function' tools are supported.");
    const Json& f =
        need(t, "function", name + ".function", "A tool needs a 'function' object.", true);
    get_string(need(f, "name", name + ".function.name", "A function needs a name."),
               name + ".function.name");
  }
  return tools.empty() ? std::string() : tokenizer_internal::py_json_dumps(tools);
}

std::vector<ChatMessage> parse_messages(const Json& j, const ModelInfo& info,
                                        std::vector<RequestImage>* images) {
  const Json& m = need(j, "messages", "messages");
  if (!m.is_array()) throw_bad_type("messages", "an array", m);
  if (m.empty()) throw_bad_value("messages", "at least one message is needed.");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < m.size(); ++i) {
    const Json& e = m[i];
    const std::string name = str_cat("messages[", i, "]");
    if (!e.is_object()) throw_bad_type(name, "an object", e);
    ChatMessage& msg = out.emplace_back();
    msg.role =
        parse_role(need(e, "role", name + ".role", "A message needs a 'role'."), name + ".role");
    if (const Json* c = find_field(e, "content"))
      msg.content = parse_content(*c, name + ".content", info,
                                  msg.role == ChatRole::kUser ? images : nullptr);
    if (msg.role == ChatRole::kAssistant) {
      msg.reasoning_content = opt_string(e, "reasoning_content", name + ".reasoning_content");
      if (const Json* t = find_field(e, "tool_calls"))
        msg.tool_calls = parse_tool_calls(*t, name + ".tool_calls");
    }
    if (msg.role == ChatRole::kTool)
      msg.tool_call_id = opt_string(e, "tool_call_id", name + ".tool_call_id");
    // What the encoder reads on a message: tools on system/developer messages, a response format
    // on system messages (written as given), a quick-instruction task on user/developer ones.
    const bool sys = msg.role == ChatRole::kSystem, dev = msg.role == ChatRole::kDeveloper;
    if (const Json* t = sys || dev ? find_field(e, "tools") : nullptr)
      msg.tools_json = tools_text(*t, name + ".tools");
    if (const Json* rf = sys ? find_field(e, "response_format") : nullptr) {
      if (!rf->is_object()) throw_bad_type(name + ".response_format", "an object", *rf);
      msg.response_format_json = tokenizer_internal::py_json_dumps(*rf);
    }
    if (msg.role == ChatRole::kUser || dev) msg.task = opt_string(e, "task", name + ".task");
  }
  return out;
}

// "tools" checked for shape (the encoder reads it as text) and "tool_choice". Returns the text
// to offer, empty when no tools are offered. tool_choice "required" or a named function makes
// `shape` a tool call of those tools.
std::string parse_tools(const Json& j, OutputShape* shape) {
  const Json* tools = find_field(j, "tools");
  std::string choice = "auto", named;
  if (const Json* c = find_field(j, "tool_choice")) {
    if (c->is_object()) {
      if (opt_string(*c, "type", "tool_choice.type") != "function")
        throw_bad_value("tool_choice.type", "expected 'function'.");
      const std::string param = "tool_choice.function.name";
      const char* no_name = "A named tool_choice needs function.name.";
      named = get_string(need(need(*c, "function", param, no_name, true), "name", param, no_name),
                         param);
      choice = "named";
    } else if (c->is_string()) {
      choice = c->get<std::string>();
      if (choice != "auto" && choice != "none" && choice != "required")
        throw_bad_value("tool_choice", str_cat("'", choice,
                                               "' is not one of auto, none, required, or a named "
                                               "function."));
    } else {
      throw_bad_type("tool_choice", "a string or an object", *c);
    }
  }
  const bool forced = choice == "required" || choice == "named";
  if (!tools) {
    if (forced)
      throw ApiError(400, "tool_choice asks for a tool call, but no tools are given.",
                     "tool_choice", "invalid_value");
    return {};
  }
  // tool_choice "none": the model is not told about the tools, so it cannot call them.
  const std::string text = tools_text(*tools, "tools");
  if (choice == "none") return {};
  if (!forced) return text;
  shape->kind = OutputShape::Kind::kToolCalls;
  for (const Json& t : *tools) {
    const Json& f = t["function"];
    std::string name = f["name"].get<std::string>();
    if (choice == "named" && name != named) continue;
    const Json* params = find_field(f, "parameters");
    shape->tools.push_back(
        {std::move(name), params ? tokenizer_internal::py_json_dumps(*params) : std::string()});
  }
  if (shape->tools.empty())
    throw_bad_value("tool_choice.function.name",
                    str_cat("no tool named '", named, "' is among the tools."));
  read_bool(j, "parallel_tool_calls", &shape->parallel_tool_calls, "parallel_tool_calls");
  return text;
}

// 1..100, or 0 for "none" (thinking off).
int parse_effort(const Json& v, const std::string& name) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "none") return 0;
    // OpenAI's middle setting, and the extra name some servers accept, are the format's default.
    if (s == "medium" || s == "xhigh") return kDefaultReasoningEffort;
    try {
      return reasoning_effort_from_name(s);
    } catch (const Error&) {
      throw_bad_value(name,
                      str_cat("'", s, "' is not one of none, low, medium, high, xhigh, max."));
    }
  }
  return int(get_int(v, name, 1, 100));
}

// The thinking switch: "thinking": true | {"type": "enabled"|"disabled"}, or
// chat_template_kwargs.thinking / enable_thinking. A reasoning effort alone turns it on, except
// "none", which turns it off. chat_template_kwargs.drop_thinking: false keeps earlier turns'
// reasoning in the prompt. response_format json_object / json_schema is rendered into the system
// message as the encoder does (the output itself is not constrained).
ChatOptions parse_chat_options(const Json& j, OutputShape* shape) {
  ChatOptions o;
  std::optional<bool> thinking;
  if (const Json* t = find_field(j, "thinking")) {
    if (t->is_object()) {
      const std::string s = opt_string(*t, "type", "thinking.type");
      if (s != "enabled" && s != "disabled")
        throw_bad_value("thinking.type", "expected 'enabled' or 'disabled'.");
      thinking = s == "enabled";
    } else {
      thinking = get_bool(*t, "thinking");
    }
  }
  const Json* kwargs = find_field(j, "chat_template_kwargs");
  if (kwargs && !kwargs->is_object()) throw_bad_type("chat_template_kwargs", "an object", *kwargs);
  for (const char* key : {"thinking", "enable_thinking"})
    if (const Json* t = kwargs ? find_field(*kwargs, key) : nullptr)
      thinking = get_bool(*t, str_cat("chat_template_kwargs.", key));
  const Json* effort = find_field(j, "reasoning_effort");
  if (!effort && kwargs) effort = find_field(*kwargs, "reasoning_effort");
  if (effort) o.reasoning_effort = parse_effort(*effort, "reasoning_effort");
  if (effort && o.reasoning_effort == 0) {  // "none"
    if (thinking.value_or(false))
      throw_bad_value("reasoning_effort", "'none' turns thinking off, but thinking is enabled.");
    thinking = false;
  }
  o.thinking = thinking.value_or(effort != nullptr);
  if (kwargs)
    read_bool(*kwargs, "drop_thinking", &o.drop_thinking, "chat_template_kwargs.drop_thinking");
  o.tools_json = parse_tools(j, shape);
  read_bool(j, "add_generation_prompt", &o.add_generation_prompt, "add_generation_prompt");
  read_bool(j, "continue_final_message", &o.continue_final_message, "continue_final_message");
  if (o.continue_final_message) o.add_generation_prompt = false;
  OutputShape format;
  o.response_format_json = parse_response_format(j, &format);
  if (format.kind != OutputShape::Kind::kFree) {
    if (shape->kind != OutputShape::Kind::kFree)
      throw ApiError(400,
                     "tool_choice asks for a tool call and response_format for a reply format; "
                     "give one of them.",
                     "response_format", "invalid_value");
    *shape = std::move(format);
  }
  shape->after_thinking = o.thinking;
  return o;
}

// The prompt of a chat request; `shape` gets its output shape (after_thinking: in thinking mode).
// Image parts of user messages go to `images` (null: refused), each an image token in the prompt.
std::vector<int32_t> encode_chat_prompt(const Json& j, const ModelInfo& info, OutputShape* shape,
                                        std::vector<RequestImage>* images) {
  const Tokenizer& tok = need_tokenizer(info, "messages", "the chat API");
  const std::vector<ChatMessage> messages = parse_messages(j, info, images);
  const ChatOptions options = parse_chat_options(j, shape);
  std::string text;
  try {
    text = encode_chat(messages, options);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "messages", "invalid_value");
  }
  // The chat text carries its own BOS. An image's mark becomes the image token, the text around
  // it tokenized apart (the image token is a special token: text never merges across it).
  std::vector<int32_t> ids;
  size_t at = 0, marks = 0;
  for (size_t m; (m = text.find(kImageMark, at)) != std::string::npos; at = m + kImageMark.size()) {
    const std::vector<int32_t> piece = tok.encode(text.substr(at, m - at), false);
    ids.insert(ids.end(), piece.begin(), piece.end());
    ids.push_back(info.image_token_id);
    ++marks;
  }
  const std::vector<int32_t> rest = tok.encode(text.substr(at), false);
  ids.insert(ids.end(), rest.begin(), rest.end());
  if (marks != (images ? images->size() : 0))
    throw ApiError(400, "The messages' text holds an image placeholder's reserved characters.",
                   "messages", "invalid_value");
  return ids;
}

// The fields of an API call beyond the sampling parameters.
void parse_call_fields(const Json& j, const ModelInfo& info, ApiRequest* r) {
  parse_sampling_fields(j, info, &r->params);
  if (const Json* v = find_field(j, "n")) r->n = int32_t(get_int(*v, "n", 1, kMaxChoices));
  if (const Json* v = find_field(j, "best_of"); v && get_int(*v, "best_of", 1, kMaxChoices) != r->n)
    throw ApiError(400, "best_of other than n is not supported.", "best_of", "unsupported_value");
  if (const Json* v = find_field(j, "logit_bias"); v && !(v->is_object() && v->empty()))
    throw ApiError(400, "logit_bias is not supported.", "logit_bias", "unsupported_value");
  read_bool(j, "stream", &r->stream, "stream");
  if (const Json* v = find_field(j, "stream_options")) {
    if (!r->stream)
      throw ApiError(400, "stream_options is only allowed when stream is true.", "stream_options",
                     "invalid_value");
    if (!v->is_object()) throw_bad_type("stream_options", "an object", *v);
    read_bool(*v, "include_usage", &r->include_usage, "stream_options.include_usage");
  }
  read_bool(j, "return_token_ids", &r->return_token_ids, "return_token_ids");
  if (!info.tokenizer) r->return_token_ids = true;  // ids are the only output then
}

void parse_logprobs(const Json& j, ApiRequest* r) {
  if (r->endpoint == Endpoint::kCompletions) {
    if (const Json* v = find_field(j, "logprobs")) {
      // Completions: "logprobs": K asks for the top K alternatives (0: the sampled token only).
      r->top_logprobs = int32_t(get_int(*v, "logprobs", 0, kMaxLogprobs));
      r->logprobs = true;
    }
    if (const Json* v = find_field(j, "echo"); v && get_bool(*v, "echo"))
      throw ApiError(400, "echo is not supported.", "echo", "unsupported_value");
    if (const Json* v = find_field(j, "suffix"); v && !(v->is_string() && v->empty()))
      throw ApiError(400, "suffix is not supported.", "suffix", "unsupported_value");
    return;
  }
  read_bool(j, "logprobs", &r->logprobs, "logprobs");
  if (const Json* v = find_field(j, "top_logprobs")) {
    r->top_logprobs = int32_t(get_int(*v, "top_logprobs", 0, kMaxLogprobs));
    if (!r->logprobs)
      throw ApiError(400, "top_logprobs needs logprobs set to true.", "top_logprobs",
                     "invalid_value");
  }
}

// max_tokens against the context: the prompt must leave room for at least one token, and an
// explicit max_tokens must fit beside it. Without one, completions default to 16 and chat to
// the rest of the context.
void fit_max_tokens(const Json& j, const ModelInfo& info, ApiRequest* r) {
  const bool chat = r->endpoint == Endpoint::kChat;
  // Chat names it max_completion_tokens now; max_tokens is the older spelling.
  const char* given_name =
      chat && find_field(j, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  const Json* given = find_field(j, given_name);
  const int64_t max_tokens = given ? get_int(*given, given_name, 1, INT64_MAX / 2) : 0;
  int64_t len = 0;  // the longest prompt
  for (const auto& p : r->prompts) len = std::max(len, int64_t(p.size()) + r->image_tokens);
  if (len >= info.max_model_len)
    throw ApiError(
        400,
        str_cat("This model's maximum context length is ", info.max_model_len,
                " tokens, and the prompt has ", len, ", which leaves no room for a completion."),
        chat ? "messages" : "prompt", "context_length_exceeded");
  if (given && len + max_tokens > info.max_model_len)
    throw ApiError(400,
                   str_cat("This model's maximum context length is ", info.max_model_len,
                           " tokens; the prompt has ", len, " and ", given_name, " asks for ",
                           max_tokens, " more (", len + max_tokens, " in all)."),
                   given_name, "context_length_exceeded");
  const int64_t room = info.max_model_len - len;
  r->params.max_tokens = given ? max_tokens : chat ? room : std::min<int64_t>(16, room);
}

}  // namespace

// --- typed fields (json_fields.h) and the requests (api_request.h) ---

std::string error_body(const ApiError& e) {
  Json err = {{"message", e.what()},
              {"type", e.type},
              {"param", e.param.empty() ? Json() : Json(e.param)},
              {"code", e.code.empty() ? Json() : Json(e.code)}};
  return dump_json(Json{{"error", std::move(err)}});
}

ApiError internal_error(const std::exception& e) {
  std::fprintf(stderr, "deepinfer: internal error while serving a request: %s\n", e.what());
  return ApiError(500, str_cat("Internal server error: ", e.what()), {}, "internal_error");
}

std::string dump_json(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

int json_nesting_depth(std::string_view text) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {  // an escaped character never ends it
      in_string = escaped || c != '"';
      escaped = !escaped && c == '\\';
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

const Json* find_field(const Json& obj, const char* key) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

void throw_bad_type(const std::string& name, const char* expected, const Json& got) {
  throw ApiError(400,
                 str_cat("Invalid type for '", name, "': expected ", expected, ", but got ",
                         type_name(got), "."),
                 name, "invalid_type");
}

void throw_bad_value(const std::string& name, const std::string& what) {
  throw ApiError(400, str_cat("Invalid value for '", name, "': ", what), name, "invalid_value");
}

int64_t get_int(const Json& v, const std::string& name, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) throw_bad_type(name, "an integer", v);
  // Unsigned values past the int64 range are outside every range asked for.
  const bool in_range = !v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t(INT64_MAX);
  const int64_t x = in_range ? v.get<int64_t>() : 0;
  if (!in_range || x < lo || x > hi)
    throw_bad_value(name,
                    str_cat("expected an integer in [", lo, ", ", hi, "], got ", v.dump(), "."));
  return x;
}

std::vector<int32_t> token_list(const Json& v, const std::string& name, int64_t vocab) {
  if (!v.is_array()) throw_bad_type(name, "an array of token ids", v);
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    ids.push_back(get_token_id(v[i], str_cat(name, "[", i, "]"), vocab));
  return ids;
}

RequestImage load_image(const std::string& source, const std::string& what,
                        const vision::VisionLimits& v, bool allow_files) {
  const vision::RgbImage img =
      vision::decode_image(vision::image_source_bytes(source, what, allow_files), what);
  vision::ImagePatches p = vision::preprocess(img, v);
  return {std::move(p.patches), p.plan.vit_h, p.plan.vit_w};
}

std::string parse_response_format(const Json& j, OutputShape* shape) {
  const Json* rf = find_field(j, "response_format");
  if (!rf) return {};
  if (!rf->is_object()) throw_bad_type("response_format", "an object", *rf);
  const std::string t = opt_string(*rf, "type", "response_format.type");
  if (t == "json_object") {
    shape->kind = OutputShape::Kind::kJsonObject;
    return tokenizer_internal::py_json_dumps(*rf);
  }
  if (t == "json_schema") {
    const Json& js = need(*rf, "json_schema", "response_format.json_schema",
                          "A json_schema response format needs a 'json_schema' object.", true);
    const Json* schema = find_field(js, "schema");
    if (!schema || !(schema->is_object() || schema->is_boolean()))
      throw ApiError(400, "response_format.json_schema needs a 'schema' object.",
                     "response_format.json_schema.schema", "missing");
    shape->kind = OutputShape::Kind::kJsonSchema;
    return shape->schema_json = tokenizer_internal::py_json_dumps(*schema);
  }
  if (t != "text")
    throw_bad_value("response_format.type",
                    str_cat("'", t, "' is not one of text, json_object, json_schema."));
  return {};
}

void constrain(const OutputShape& shape, const ModelInfo& info, SamplingParams* p) {
  if (shape.kind == OutputShape::Kind::kFree) return;
  const char* param =
      shape.kind == OutputShape::Kind::kToolCalls ? "tool_choice" : "response_format";
  if (!info.grammars)
    throw ApiError(400, "Structured outputs need the model's tokenizer, and it has none.", param,
                   "no_tokenizer");
  try {
    p->grammar = info.grammars->get(shape);
    p->grammar_source = encode_output_shape(shape);
  } catch (const Error& e) {
    throw ApiError(400, str_cat("The output format cannot be enforced: ", e.what()),
                   shape.kind == OutputShape::Kind::kToolCalls ? "tools"
                   : shape.kind == OutputShape::Kind::kJsonSchema
                       ? "response_format.json_schema.schema"
                       : "response_format",
                   "unsupported_schema");
  }
}

void parse_sampling_fields(const Json& j, const ModelInfo& info, SamplingParams* p) {
  // The number `key` within [lo, hi] into `*out` when it is given; whether it was.
  auto number = [&](const char* key, float* out, double lo, double hi) {
    const Json* v = find_field(j, key);
    if (v) *out = float(get_number(*v, key, lo, hi));
    return v != nullptr;
  };
  number("temperature", &p->temperature, 0, 1e6);
  if (number("top_p", &p->top_p, 0, 1) && p->top_p <= 0)
    throw_bad_value("top_p", "expected a number in (0, 1].");
  if (const Json* v = find_field(j, "top_k"))  // -1 means off, as in vLLM
    p->top_k = std::max<int64_t>(0, get_int(*v, "top_k", -1, info.vocab_size));
  number("min_p", &p->min_p, 0, 1);
  number("presence_penalty", &p->presence_penalty, -2, 2);
  number("frequency_penalty", &p->frequency_penalty, -2, 2);
  if (number("repetition_penalty", &p->repetition_penalty, 0, 1e6) && p->repetition_penalty <= 0)
    throw_bad_value("repetition_penalty", "expected a number > 0.");
  if (const Json* v = find_field(j, "seed"))
    p->seed = uint64_t(get_int(*v, "seed", INT64_MIN, INT64_MAX));
  read_bool(j, "ignore_eos", &p->ignore_eos, "ignore_eos");
  if (const Json* s = find_field(j, "stop")) {
    if (!s->is_string() && !s->is_array())
      throw_bad_type("stop", "a string or an array of strings", *s);
    if (s->size() > kMaxStops)  // a string's size is 1
      throw_bad_value("stop", str_cat("at most ", kMaxStops, " stop strings are allowed."));
    p->stop.clear();
    for (size_t i = 0; i < s->size(); ++i)
      p->stop.push_back(s->is_string() ? s->get<std::string>()
                                       : get_string((*s)[i], str_cat("stop[", i, "]")));
    if (std::ranges::count(p->stop, "")) throw_bad_value("stop", "stop strings must not be empty.");
    if (!p->stop.empty()) need_tokenizer(info, "stop", "stop strings");
  }
  if (const Json* s = find_field(j, "stop_token_ids"))
    p->stop_token_ids = token_list(*s, "stop_token_ids", info.vocab_size);
}

uint64_t choice_seed(uint64_t seed, int32_t i) {
  return seed + uint64_t(i) * 0x9e3779b97f4a7c15ull;
}

ApiRequest parse_api_request(Endpoint endpoint, std::string_view body, const ModelInfo& info) {
  const Json j = parse_body(body);
  ApiRequest r;
  r.endpoint = endpoint;
  r.model = check_model(j, info);
  OutputShape shape;
  if (endpoint == Endpoint::kChat) {
    r.prompts.push_back(encode_chat_prompt(j, info, &shape, &r.images));
    const int64_t k = info.vision.downsample;
    for (const RequestImage& im : r.images) {
      const int64_t h = (im.vit_h + k - 1) / k, w = (im.vit_w + k - 1) / k;
      r.image_tokens += h * (w + 1) + 2 - 1;
    }
    r.chat.enabled = true;
    r.chat.thinking = shape.after_thinking;
  } else {
    r.prompts = parse_prompts(j, info);
    parse_response_format(j, &shape);
  }
  parse_call_fields(j, info, &r);
  constrain(shape, info, &r.params);
  parse_logprobs(j, &r);
  if (int64_t(r.prompts.size()) * r.n > kMaxEngineRequests)
    throw_bad_value(endpoint == Endpoint::kChat ? "n" : "prompt",
                    str_cat(r.prompts.size(), " prompts x n = ", r.n, " is more than ",
                            kMaxEngineRequests, " sequences in one request."));
  fit_max_tokens(j, info, &r);
  // The sampled token's logprob is looked up among the engine's top alternatives, so ask for
  // at least the 20 OpenAI documents.
  r.params.logprobs = r.logprobs ? std::max<int64_t>(r.top_logprobs, kMaxLogprobs) : 0;
  return r;
}

std::vector<int32_t> parse_tokenize_request(std::string_view body, const ModelInfo& info) {
  const Json j = parse_body(body);
  check_model(j, info);
  const bool has_prompt = find_field(j, "prompt"), has_messages = find_field(j, "messages");
  if (has_prompt == has_messages)
    throw ApiError(400, "Give exactly one of 'prompt' or 'messages'.",
                   has_prompt ? "messages" : "prompt", "invalid_value");
  if (has_messages) {
    OutputShape shape;
    std::vector<RequestImage> images;  // tokenized with their image tokens; the pixels are dropped
    return encode_chat_prompt(j, info, &shape, &images);
  }
  const Json& p = *find_field(j, "prompt");
  if (p.is_array()) return token_list(p, "prompt", info.vocab_size);
  const std::string text = get_string(p, "prompt");
  bool bos = false;
  read_bool(j, "add_special_tokens", &bos, "add_special_tokens");
  return need_tokenizer(info, "prompt", "text prompts").encode(text, bos);
}

std::vector<int32_t> parse_detokenize_request(std::string_view body, const ModelInfo& info) {
  const Json j = parse_body(body);
  check_model(j, info);
  std::vector<int32_t> ids = token_list(need(j, "tokens", "tokens"), "tokens", info.vocab_size);
  need_tokenizer(info, "tokens", "/detokenize");
  return ids;
}

}  // namespace deepinfer::server
