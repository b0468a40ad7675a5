#include "server/http_parser.h"

#include <strings.h>

#include <algorithm>
#include <charconv>
#include <cstring>

#include "core/error.h"

namespace deepinfer::server::http {

namespace {

constexpr size_t kMaxBlankLines = 16;       // before a request line (RFC 9112 §2.2)
constexpr size_t kMaxChunkSizeLine = 4096;  // a chunk size with its extensions
constexpr uint64_t kHugeChunk = uint64_t(1) << 60;

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

bool is_tchar(unsigned char c) {
  return is_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') ||
         (c != 0 && std::strchr("!#$%&'*+-.^_`|~", c) != nullptr);
}

bool is_token(std::string_view s) {
  return !s.empty() && std::ranges::all_of(s, is_tchar);
}

// A control character other than tab.
bool is_ctl(unsigned char c) {
  return c != '\t' && (c < 0x20 || c == 0x7F);
}

bool is_ows(char c) {
  return c == ' ' || c == '\t';
}

// Printable for the messages that quote what the client sent.
std::string quoted(std::string_view s) {
  std::string out;
  for (const unsigned char c : s.substr(0, 32)) out += c >= 0x20 && c < 0x7F ? char(c) : '?';
  return out;
}

// chunk-ext after the size: *( BWS ";" BWS name [ BWS "=" BWS ( token / quoted-string ) ] ).
bool valid_chunk_ext(std::string_view s) {
  size_t i = 0;
  auto skip_bws = [&] {
    while (i < s.size() && is_ows(s[i])) ++i;
  };
  // Each skips BWS first, then takes what it names, or nothing and returns false.
  auto take = [&](char ch) {
    skip_bws();
    if (i == s.size() || s[i] != ch) return false;
    ++i;
    return true;
  };
  auto token = [&] {
    skip_bws();
    const size_t start = i;
    while (i < s.size() && is_tchar(s[i])) ++i;
    return i > start;
  };
  // After the opening quote: text and backslash-escaped characters up to the closing quote.
  auto quoted_rest = [&] {
    for (; i < s.size() && s[i] != '"'; ++i)
      if ((s[i] == '\\' && ++i == s.size()) || is_ctl(s[i])) return false;
    return i++ < s.size();  // false: no closing quote
  };
  for (;;) {
    skip_bws();
    if (i == s.size()) return true;
    if (!take(';') || !token()) return false;
    if (take('=') && !(take('"') ? quoted_rest() : token())) return false;
  }
}

bool parse_decimal(std::string_view s, uint64_t* out) {
  // At most 18 digits: every such count fits, and nothing that large is ever accepted.
  const char* end = s.data() + s.size();
  return !s.empty() && s.size() <= 18 && std::from_chars(s.data(), end, *out).ptr == end;
}

}  // namespace

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && is_ows(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ows(s.back())) s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && strncasecmp(a.data(), b.data(), a.size()) == 0;
}

std::vector<std::string_view> list_elements(std::string_view list) {
  std::vector<std::string_view> out;
  while (true) {
    const size_t comma = list.find(',');
    const std::string_view e = trim_ows(list.substr(0, comma));
    if (!e.empty()) out.push_back(e);
    if (comma == std::string_view::npos) return out;
    list.remove_prefix(comma + 1);
  }
}

std::string body_too_large_message(size_t max_body_bytes) {
  return str_cat("The request body is larger than the server's limit of ", max_body_bytes,
                 " bytes.");
}

const std::string* HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return &v;
  return nullptr;
}

void HttpParser::fail(int status, std::string message, std::string code) {
  error_ = ParseError{status, std::move(message), std::move(code)};
  phase_ = Phase::kDone;
  state_ = State::kError;
}

size_t HttpParser::take_line(const char* data, size_t n, bool* complete) {
  const auto* lf = static_cast<const char*>(std::memchr(data, '\n', n));
  const size_t content = lf ? size_t(lf - data) : n;
  line_.append(data, content);
  *complete = lf != nullptr;
  if (phase_ == Phase::kRequestLine && !line_.empty() && line_ != "\r") started_ = true;
  // The request line (once a request has begun), the header lines and the trailer lines count
  // against the header section's limit.
  const bool in_section = phase_ == Phase::kHeaderLines || phase_ == Phase::kTrailers ||
                          (phase_ == Phase::kRequestLine && started_);
  if (phase_ == Phase::kRequestLine && line_.size() > limits_.max_request_line)
    fail(414, str_cat("The request line is longer than ", limits_.max_request_line, " bytes."),
         "uri_too_long");
  else if (in_section && section_bytes_ + line_.size() + (lf ? 1 : 0) > limits_.max_header_bytes)
    fail(431,
         str_cat(phase_ == Phase::kTrailers ? "The trailer section" : "The header section",
                 " is larger than ", limits_.max_header_bytes, " bytes."),
         "header_too_large");
  else if (phase_ == Phase::kChunkSize && line_.size() > kMaxChunkSizeLine)
    fail(400, "A chunk size line is too long.", "invalid_chunked_body");
  return lf ? content + 1 : content;
}

size_t HttpParser::feed(const char* data, size_t n) {
  if (state_ == State::kComplete || state_ == State::kError) return 0;
  state_ = State::kNeedMore;
  size_t used = 0;
  while (used < n && state_ == State::kNeedMore) {
    if (phase_ == Phase::kBody) {
      const size_t k = size_t(std::min<uint64_t>(remaining_, n - used));
      body_bytes(data + used, k);
      used += k;
      remaining_ -= k;
      if (remaining_ == 0 && req_.chunked)
        phase_ = Phase::kChunkCr;
      else if (remaining_ == 0)
        complete();
    } else if (phase_ == Phase::kChunkCr || phase_ == Phase::kChunkLf) {
      const char c = data[used];
      if (c == '\n' || (c == '\r' && phase_ == Phase::kChunkCr)) {
        phase_ = c == '\n' ? Phase::kChunkSize : Phase::kChunkLf;
        ++used;
      } else {
        fail(400, "A chunk's data is not followed by CRLF.", "invalid_chunked_body");
      }
    } else {  // a line: the request line, a header, a chunk size or a trailer
      bool complete = false;
      used += take_line(data + used, n - used, &complete);
      if (state_ == State::kError || !complete) continue;
      if (phase_ != Phase::kChunkSize) section_bytes_ += line_.size() + 1;
      std::string_view line(line_);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.find('\r') != std::string_view::npos) {
        fail(400, "A line of the request contains a bare CR.", "invalid_request");
        continue;
      }
      if (phase_ == Phase::kRequestLine)
        on_request_line(line);
      else if (phase_ == Phase::kChunkSize)
        on_chunk_size(line);
      else
        on_field_line(line);
      line_.clear();
    }
  }
  return used;
}

void HttpParser::on_request_line(std::string_view line) {
  if (line.empty()) {  // allowed before a request line, up to a bound
    section_bytes_ = 0;
    if (++blank_lines_ > kMaxBlankLines)
      fail(400, "Too many blank lines before the request line.", "invalid_request_line");
    return;
  }
  auto malformed = [&](std::string message) {
    fail(400, std::move(message), "invalid_request_line");
  };
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos)
    return malformed(
        str_cat("Malformed request line '", quoted(line), "' (expected METHOD TARGET HTTP/1.1)."));
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (!is_token(method))
    return malformed(str_cat("Malformed request method '", quoted(method), "'."));
  if (std::ranges::any_of(target, [](unsigned char c) { return c <= 0x20 || c == 0x7F; }))
    return malformed("The request target contains a control character.");
  const bool digits =
      version.size() == 8 && version[6] == '.' && is_digit(version[5]) && is_digit(version[7]);
  if (!digits || version.substr(0, 5) != "HTTP/")
    return malformed(str_cat("Malformed HTTP version '", quoted(version), "'."));
  if (version[5] != '1')
    return fail(505, str_cat("HTTP version ", quoted(version), " is not supported (HTTP/1.1 is)."),
                "http_version_not_supported");
  req_.version_minor = version[7] == '0' ? 0 : 1;
  req_.keep_alive = req_.version_minor >= 1;
  req_.method = method;
  std::string_view path = target;
  if (target.empty()) return malformed("The request target is empty.");
  if (target[0] != '/' && target != "*") {
    // Absolute form (RFC 9112 §3.2.2): the path after the authority.
    const size_t scheme = iequals(target.substr(0, 7), "http://")    ? 7
                          : iequals(target.substr(0, 8), "https://") ? 8
                                                                     : 0;
    if (scheme == 0) return malformed(str_cat("Malformed request target '", quoted(target), "'."));
    const std::string_view rest = target.substr(scheme);
    const size_t at = rest.find_first_of("/?");
    if (at == 0) return malformed("The request target has no host.");
    path = at == std::string_view::npos ? std::string_view("/") : rest.substr(at);
  }
  req_.path = path.substr(0, path.find('?'));
  if (req_.path.empty()) req_.path = "/";
  phase_ = Phase::kHeaderLines;
}

// A header field line, or a trailer field line (checked the same way, then dropped).
void HttpParser::on_field_line(std::string_view line) {
  const bool trailer = phase_ == Phase::kTrailers;
  if (line.empty()) return trailer ? complete() : on_headers_end();
  const char* section = trailer ? "trailer" : "header";
  const char* code = trailer ? "invalid_chunked_body" : "invalid_header";
  if (is_ows(line[0]))
    return fail(400, str_cat("Folded ", section, " lines (obs-fold) are not accepted."), code);
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos || !is_token(line.substr(0, colon)))
    return fail(400, str_cat("Malformed ", section, " line '", quoted(line), "'."), code);
  const std::string_view value = trim_ows(line.substr(colon + 1));
  // Visible characters, spaces, tabs and obs-text (RFC 9110 §5.5).
  if (std::ranges::any_of(value, is_ctl))
    return fail(400,
                str_cat("The value of ", section, " '", quoted(line.substr(0, colon)),
                        "' contains a control character."),
                code);
  const size_t count = trailer ? ++trailer_count_ : req_.headers.size() + 1;
  if (count > limits_.max_header_count)
    return fail(
        431,
        str_cat("The request has more than ", limits_.max_header_count, " ", section, " fields."),
        "header_too_large");
  if (!trailer) req_.headers.emplace_back(line.substr(0, colon), value);
}

void HttpParser::on_headers_end() {
  std::vector<std::string_view> codings;  // of every Transfer-Encoding field
  std::optional<uint64_t> length;
  for (const auto& [name, value] : req_.headers) {
    if (iequals(name, "transfer-encoding")) {
      for (std::string_view e : list_elements(value)) codings.push_back(e);
    } else if (iequals(name, "content-length")) {
      auto not_a_count = [&](std::string_view v) {
        fail(400, str_cat("Content-Length '", quoted(v), "' is not a byte count (decimal digits)."),
             "invalid_content_length");
      };
      const std::vector<std::string_view> values = list_elements(value);
      if (values.empty()) return not_a_count(value);
      for (std::string_view e : values) {
        uint64_t v = 0;
        if (!parse_decimal(e, &v)) return not_a_count(e);
        if (length && *length != v)
          return fail(400, "The request has conflicting Content-Length values.",
                      "invalid_content_length");
        length = v;
      }
    }
  }
  if (req_.header("transfer-encoding")) {
    if (codings.empty())
      return fail(400, "Transfer-Encoding is empty.", "invalid_transfer_encoding");
    for (std::string_view c : codings)
      if (!iequals(c, "chunked"))
        return fail(501,
                    str_cat("Transfer-Encoding '", quoted(c),
                            "' is not supported (send the body with Content-Length or chunked)."),
                    "unsupported_transfer_encoding");
    if (codings.size() > 1)
      return fail(400, "Transfer-Encoding applies chunked more than once.",
                  "invalid_transfer_encoding");
    if (req_.version_minor == 0)
      return fail(400, "Transfer-Encoding is not allowed in an HTTP/1.0 request.",
                  "invalid_transfer_encoding");
    if (length)  // a Content-Length too
      return fail(400, "The request has both Transfer-Encoding and Content-Length.",
                  "invalid_content_length");
    req_.chunked = true;
  }
  if (length && *length > limits_.max_discard_bytes)
    return fail(413, body_too_large_message(limits_.max_body_bytes), "request_too_large");
  req_.content_length = length;
  if (const std::string* c = req_.header("connection")) {
    bool close = false, keep = false;
    for (std::string_view e : list_elements(*c)) {
      close |= iequals(e, "close");
      keep |= iequals(e, "keep-alive");
    }
    if (close || keep) req_.keep_alive = !close;  // close wins
  }
  if (const std::string* e = req_.header("expect"); e && req_.version_minor >= 1) {
    if (!iequals(*e, "100-continue"))
      return fail(417, str_cat("Expectation '", quoted(*e), "' is not supported."),
                  "expectation_failed");
    req_.expect_continue = true;
  }
  if (!req_.chunked && length.value_or(0) == 0) return complete();  // no body
  phase_ = req_.chunked ? Phase::kChunkSize : Phase::kBody;
  remaining_ = length.value_or(0);
  state_ = State::kHeaders;
}

void HttpParser::on_chunk_size(std::string_view line) {
  uint64_t size = 0;
  const auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), size, 16);
  const size_t i = size_t(end - line.data());  // past the hex digits, however many
  if (ec == std::errc::result_out_of_range) size = kHugeChunk;
  if (i == 0)
    return fail(400, str_cat("Malformed chunk size '", quoted(line), "'."), "invalid_chunked_body");
  if (!valid_chunk_ext(line.substr(i)))
    return fail(400, str_cat("Malformed chunk extension in '", quoted(line), "'."),
                "invalid_chunked_body");
  if (size >= kHugeChunk || req_.body_bytes + size > limits_.max_discard_bytes)
    return fail(413, body_too_large_message(limits_.max_body_bytes), "request_too_large");
  // The last chunk (size 0) is followed by the trailers, which count from here (trailer_count_ is
  // still 0); the section count is not used while chunks are read.
  phase_ = size == 0 ? Phase::kTrailers : Phase::kBody;
  remaining_ = size;
  section_bytes_ = 0;
}

void HttpParser::body_bytes(const char* data, size_t n) {
  req_.body_bytes += n;
  if (req_.body_too_large) return;
  if (req_.body.size() + n <= limits_.max_body_bytes) {
    req_.body.append(data, n);
  } else {
    req_.body_too_large = true;
    std::string().swap(req_.body);
  }
}

}  // namespace deepinfer::server::http
