// The HTTP/1.1 request parser: requests at every split of their bytes, pipelining, chunked bodies,
// every malformed framing with its status, and the limits.
#include "server/http_parser.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace deepinfer::server::http {
namespace {

// What a run of the parser over a byte stream gives: each request in order, then the error that
// ended it (status 0: none).
struct Outcome {
  std::vector<HttpRequest> requests;
  int error = 0;
  std::string code;
  size_t headers_events = 0;
  size_t left = 0;  // bytes not consumed (after an error)
};

// Feeds `input` in pieces of `piece` bytes (0: all at once), as a connection would.
Outcome run(const std::string& input, size_t piece = 0, ParserLimits limits = {}) {
  HttpParser p(limits);
  Outcome out;
  std::string buf;
  size_t off = 0, given = 0;
  for (;;) {
    if (off == buf.size()) {
      if (given == input.size()) break;
      const size_t n = piece ? std::min(piece, input.size() - given) : input.size() - given;
      buf.append(input, given, n);
      given += n;
    }
    off += p.feed(buf.data() + off, buf.size() - off);
    switch (p.state()) {
      case HttpParser::State::kHeaders:
        ++out.headers_events;
        break;
      case HttpParser::State::kComplete:
        out.requests.push_back(p.take_request());
        p.reset();
        break;
      case HttpParser::State::kError:
        out.error = p.error().status;
        out.code = p.error().code;
        out.left = buf.size() - off + (input.size() - given);
        return out;
      case HttpParser::State::kNeedMore:
        EXPECT_EQ(off, buf.size()) << "kNeedMore with bytes left";
        break;
    }
  }
  return out;
}

void expect_same(const Outcome& a, const Outcome& b, const std::string& what) {
  ASSERT_EQ(a.requests.size(), b.requests.size()) << what;
  EXPECT_EQ(a.error, b.error) << what;
  EXPECT_EQ(a.headers_events, b.headers_events) << what;
  for (size_t i = 0; i < a.requests.size(); ++i) {
    const HttpRequest &x = a.requests[i], &y = b.requests[i];
    EXPECT_EQ(x.method, y.method) << what;
    EXPECT_EQ(x.path, y.path) << what;
    EXPECT_EQ(x.headers, y.headers) << what;
    EXPECT_EQ(x.body, y.body) << what;
    EXPECT_EQ(x.body_bytes, y.body_bytes) << what;
    EXPECT_EQ(x.body_too_large, y.body_too_large) << what;
    EXPECT_EQ(x.keep_alive, y.keep_alive) << what;
  }
}

const std::string kGet = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
const std::string kPost =
    "POST /v1/completions?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\n\r\n{\"a\": [1,2]}";
const std::string kChunked =
    "POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    "4;name=value;q=\"a \\\" b\"\r\n{\"pr\r\n"
    "A\r\nompt\": \"hi\r\n"
    "2 ; ext\r\n\"}\r\n"
    "0\r\nX-Trailer: yes\r\nOther: 2\r\n\r\n";

TEST(HttpParser, ASimpleRequest) {
  const Outcome o = run(kGet);
  ASSERT_EQ(o.error, 0);
  ASSERT_EQ(o.requests.size(), 1u);
  const HttpRequest& r = o.requests[0];
  EXPECT_EQ(r.method, "GET");
  EXPECT_EQ(r.path, "/health");
  EXPECT_EQ(r.version_minor, 1);
  EXPECT_TRUE(r.keep_alive);
  ASSERT_NE(r.header("HOST"), nullptr);
  EXPECT_EQ(*r.header("host"), "x");
  EXPECT_EQ(r.header("content-length"), nullptr);
  EXPECT_EQ(o.headers_events, 0u) << "no body, no headers event";
}

TEST(HttpParser, BodiesByLengthAndChunked) {
  Outcome o = run(kPost);
  ASSERT_EQ(o.requests.size(), 1u);
  EXPECT_EQ(o.requests[0].path, "/v1/completions") << "without the query";
  EXPECT_EQ(o.requests[0].body, "{\"a\": [1,2]}");
  EXPECT_EQ(o.headers_events, 1u);
  EXPECT_EQ(o.error, 0);
  // A Content-Length one short: the last byte starts the next request, which never completes.
  o = run(kPost.substr(0, kPost.find("12")) + "11" + kPost.substr(kPost.find("12") + 2) + "\r\n");
  ASSERT_EQ(o.requests.size(), 1u);
  EXPECT_EQ(o.requests[0].body, "{\"a\": [1,2]");
  EXPECT_EQ(o.error, 400) << "'}' is no request line";

  o = run(kChunked);
  ASSERT_EQ(o.error, 0);
  ASSERT_EQ(o.requests.size(), 1u);
  EXPECT_EQ(o.requests[0].body, "{\"prompt\": \"hi\"}");
  EXPECT_TRUE(o.requests[0].chunked);
  EXPECT_EQ(o.requests[0].body_bytes, 16u);
  EXPECT_EQ(o.requests[0].headers.size(), 2u) << "trailers are not merged into the headers";
}

TEST(HttpParser, PipelinedRequestsInOrder) {
  const std::string post = "POST /detokenize HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}";
  const std::string all = kGet + post + kChunked + "GET /v1/models HTTP/1.0\r\n\r\n";
  const Outcome o = run(all);
  ASSERT_EQ(o.error, 0);
  ASSERT_EQ(o.requests.size(), 4u);
  EXPECT_EQ(o.requests[0].path, "/health");
  EXPECT_EQ(o.requests[1].path, "/detokenize");
  EXPECT_EQ(o.requests[1].body, "{}");
  EXPECT_EQ(o.requests[2].path, "/tokenize");
  EXPECT_EQ(o.requests[3].path, "/v1/models");
  EXPECT_FALSE(o.requests[3].keep_alive);

  // feed() stops at the end of each request, leaving the next one's bytes.
  HttpParser p;
  const std::string two = kGet + kGet;
  EXPECT_EQ(p.feed(two), kGet.size());
  EXPECT_EQ(p.state(), HttpParser::State::kComplete);
  EXPECT_EQ(p.feed(two.substr(kGet.size())), 0u) << "nothing until reset()";
  p.reset();
  EXPECT_EQ(p.feed(two.substr(kGet.size())), kGet.size());
  EXPECT_EQ(p.state(), HttpParser::State::kComplete);
}

TEST(HttpParser, EverySplitGivesTheSameRequests) {
  const std::string post = "POST /detokenize HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}";
  const std::vector<std::string> streams = {
      kGet + post + kChunked,
      "\r\n\nGET / HTTP/1.1\nHost: y\n\n",  // blank lines first, bare LF line ends
      "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\n0\n\n",
      "POST / HTTP/1.1\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\nabc",
      kGet + "GET / HTTP/1.1\r\nBad Header: x\r\n\r\n",  // an error after a good request
  };
  for (const std::string& s : streams) {
    const Outcome whole = run(s);
    expect_same(whole, run(s, 1), "byte by byte: " + s);
    for (size_t cut = 1; cut < s.size(); ++cut) {
      // Two pieces, split at `cut`.
      HttpParser p;
      Outcome o;
      std::string buf = s.substr(0, cut);
      size_t off = 0;
      bool second = false;
      for (;;) {
        if (off == buf.size()) {
          if (second) break;
          buf += s.substr(cut);
          second = true;
        }
        off += p.feed(buf.data() + off, buf.size() - off);
        if (p.state() == HttpParser::State::kHeaders) ++o.headers_events;
        if (p.state() == HttpParser::State::kComplete) {
          o.requests.push_back(p.take_request());
          p.reset();
        }
        if (p.state() == HttpParser::State::kError) {
          o.error = p.error().status;
          break;
        }
      }
      expect_same(whole, o, "split at " + std::to_string(cut) + ": " + s);
    }
  }
}

TEST(HttpParser, ConnectionAndVersion) {
  auto req = [](const std::string& s) { return run(s).requests.at(0); };
  EXPECT_FALSE(req("GET / HTTP/1.0\r\n\r\n").keep_alive);
  EXPECT_TRUE(req("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive);
  EXPECT_FALSE(req("GET / HTTP/1.1\r\nConnection: foo, close\r\n\r\n").keep_alive);
  EXPECT_TRUE(req("GET / HTTP/1.1\r\nConnection: upgrade\r\n\r\n").keep_alive);
  EXPECT_EQ(req("GET / HTTP/1.9\r\n\r\n").version_minor, 1);
  EXPECT_EQ(req("GET / HTTP/1.0\r\n\r\n").version_minor, 0);
  // Absolute form: the path after the authority.
  EXPECT_EQ(req("GET http://host:80/v1/models?a HTTP/1.1\r\n\r\n").path, "/v1/models");
  EXPECT_EQ(req("GET http://host HTTP/1.1\r\n\r\n").path, "/");
  EXPECT_EQ(req("OPTIONS * HTTP/1.1\r\n\r\n").path, "*");
  // Expect is ignored from HTTP/1.0 clients.
  EXPECT_FALSE(req("POST / HTTP/1.0\r\nExpect: 100-continue\r\n\r\n").expect_continue);
  EXPECT_TRUE(
      req("POST / HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\nx").expect_continue);
  // Header values are trimmed; names keep their case.
  const HttpRequest r = req("GET / HTTP/1.1\r\nX-Name:  \t v a l \t\r\n\r\n");
  EXPECT_EQ(r.headers.at(0).first, "X-Name");
  EXPECT_EQ(r.headers.at(0).second, "v a l");
}

TEST(HttpParser, StartedIgnoresLeadingBlankLines) {
  HttpParser p;
  p.feed("\r\n\r\n");
  EXPECT_FALSE(p.started());
  p.feed("\r");
  EXPECT_FALSE(p.started());
  p.feed("\nG");
  EXPECT_TRUE(p.started());
}

TEST(HttpParser, HeadersEventComesBeforeTheBody) {
  HttpParser p;
  const std::string head = "POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n";
  EXPECT_EQ(p.feed(head + "ab"), head.size());
  EXPECT_EQ(p.state(), HttpParser::State::kHeaders);
  EXPECT_TRUE(p.request().expect_continue);
  EXPECT_EQ(p.feed("ab"), 2u);
  EXPECT_EQ(p.state(), HttpParser::State::kNeedMore);
  EXPECT_EQ(p.feed("cd"), 2u);
  EXPECT_EQ(p.state(), HttpParser::State::kComplete);
  EXPECT_EQ(p.request().body, "abcd");
}

struct Bad {
  std::string input;
  int status;
  const char* code;
};

TEST(HttpParser, MalformedRequestsGetTheirStatus) {
  const std::string big_line(20000, 'a');
  std::string many_headers = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 200; ++i) many_headers += "X-" + std::to_string(i) + ": v\r\n";
  std::string huge_headers = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 100; ++i)
    huge_headers += "X-" + std::to_string(i) + ": " + std::string(1000, 'v') + "\r\n";
  const std::string post = "POST / HTTP/1.1\r\n";
  const std::string te = post + "Transfer-Encoding: chunked\r\n\r\n";
  const std::vector<Bad> cases = {
      {"NONSENSE\r\n\r\n", 400, "invalid_request_line"},
      {"GET /\r\n\r\n", 400, "invalid_request_line"},
      {"GET  / HTTP/1.1\r\n\r\n", 400, "invalid_request_line"},
      {"GET / HTTP/1.1 \r\n\r\n", 400, "invalid_request_line"},
      {"GET / FOO/1.1\r\n\r\n", 400, "invalid_request_line"},
      {"GET / HTTP/1\r\n\r\n", 400, "invalid_request_line"},
      {"GET / HTTP/2.0\r\n\r\n", 505, "http_version_not_supported"},
      {"G@T / HTTP/1.1\r\n\r\n", 400, "invalid_request_line"},
      {"GET foo HTTP/1.1\r\n\r\n", 400, "invalid_request_line"},
      {"GET http:///x HTTP/1.1\r\n\r\n", 400, "invalid_request_line"},
      {"GET /\x01 HTTP/1.1\r\n\r\n", 400, "invalid_request_line"},
      {"GET /\x7f HTTP/1.1\r\n\r\n", 400, "invalid_request_line"},
      {"GET / HTTP/1.1\r\r\n\r\n", 400, "invalid_request"},
      {"GET /" + big_line + " HTTP/1.1\r\n\r\n", 414, "uri_too_long"},
      {std::string(17, '\n') + "GET / HTTP/1.1\r\n\r\n", 400, "invalid_request_line"},
      {"GET / HTTP/1.1\r\nNoColon\r\n\r\n", 400, "invalid_header"},
      {"GET / HTTP/1.1\r\n: empty name\r\n\r\n", 400, "invalid_header"},
      {"GET / HTTP/1.1\r\nHost : x\r\n\r\n", 400, "invalid_header"},
      {"GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n", 400, "invalid_header"},
      {std::string("GET / HTTP/1.1\r\nA: b\0c\r\n\r\n", 27), 400, "invalid_header"},
      {"GET / HTTP/1.1\r\nA: b\rc\r\n\r\n", 400, "invalid_request"},
      {"GET / HTTP/1.1\r\nA\x80: b\r\n\r\n", 400, "invalid_header"},
      {many_headers + "\r\n", 431, "header_too_large"},
      {huge_headers + "\r\n", 431, "header_too_large"},
      {post + "Content-Length: -5\r\n\r\n", 400, "invalid_content_length"},
      {post + "Content-Length: +12\r\n\r\n", 400, "invalid_content_length"},
      {post + "Content-Length: 1a\r\n\r\n", 400, "invalid_content_length"},
      {post + "Content-Length: 99999999999999999999\r\n\r\n", 400, "invalid_content_length"},
      {post + "Content-Length:\r\n\r\n", 400, "invalid_content_length"},
      {post + "Content-Length: 5, 6\r\n\r\n", 400, "invalid_content_length"},
      {post + "Content-Length: 5\r\nContent-Length: 6\r\n\r\n", 400, "invalid_content_length"},
      {post + "Content-Length: 999999999\r\n\r\n", 413, "request_too_large"},
      {post + "Transfer-Encoding: gzip\r\n\r\n", 501, "unsupported_transfer_encoding"},
      {post + "Transfer-Encoding: gzip, chunked\r\n\r\n", 501, "unsupported_transfer_encoding"},
      {post + "Transfer-Encoding: chunked, chunked\r\n\r\n", 400, "invalid_transfer_encoding"},
      {post + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 400,
       "invalid_transfer_encoding"},
      {post + "Transfer-Encoding: ,\r\n\r\n", 400, "invalid_transfer_encoding"},
      {post + "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400,
       "invalid_content_length"},
      {"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "invalid_transfer_encoding"},
      {post + "Expect: something\r\n\r\n", 417, "expectation_failed"},
      {te + "zz\r\n", 400, "invalid_chunked_body"},
      {te + "\r\n", 400, "invalid_chunked_body"},
      {te + " 5\r\n", 400, "invalid_chunked_body"},
      {te + "5;\r\n", 400, "invalid_chunked_body"},
      {te + "5;=x\r\n", 400, "invalid_chunked_body"},
      {te + "5;a=\r\n", 400, "invalid_chunked_body"},
      {te + "5;a=\"unterminated\r\n", 400, "invalid_chunked_body"},
      {te + "5x\r\n", 400, "invalid_chunked_body"},
      {te + "3\r\nabcX", 400, "invalid_chunked_body"},
      {te + "3\r\nabc\rX", 400, "invalid_chunked_body"},
      {te + "0\r\nbad trailer\r\n\r\n", 400, "invalid_chunked_body"},
      {te + std::string(5000, '0') + "\r\n", 400, "invalid_chunked_body"},
      {te + "ffffffffffffffffffff\r\n", 413, "request_too_large"},
      {te + "7fffffff\r\n", 413, "request_too_large"},
  };
  for (const Bad& b : cases) {
    const Outcome o = run(b.input);
    EXPECT_EQ(o.error, b.status) << b.input.substr(0, 80);
    EXPECT_EQ(o.code, b.code) << b.input.substr(0, 80);
    EXPECT_TRUE(o.requests.empty()) << b.input.substr(0, 80);
    // The same outcome however the bytes arrive.
    EXPECT_EQ(run(b.input, 1).error, b.status) << "byte by byte: " << b.input.substr(0, 80);
    EXPECT_EQ(run(b.input, 7).error, b.status) << "7 at a time: " << b.input.substr(0, 80);
  }
  // Repeats of one Content-Length are one Content-Length.
  const Outcome same = run(post + "Content-Length: 2, 2\r\nContent-Length: 02\r\n\r\nab");
  ASSERT_EQ(same.error, 0);
  EXPECT_EQ(same.requests.at(0).body, "ab");
}

TEST(HttpParser, LimitsOnBodiesAndHeaders) {
  ParserLimits l;
  l.max_body_bytes = 10;
  l.max_discard_bytes = 40;
  l.max_header_bytes = 200;
  l.max_request_line = 100;
  l.max_header_count = 3;
  // Over the body limit but within the discard limit: read to the end and dropped.
  Outcome o = run("POST / HTTP/1.1\r\nContent-Length: 20\r\n\r\n" + std::string(20, 'x'), 0, l);
  ASSERT_EQ(o.error, 0);
  EXPECT_TRUE(o.requests.at(0).body_too_large);
  EXPECT_TRUE(o.requests.at(0).body.empty());
  EXPECT_EQ(o.requests.at(0).body_bytes, 20u);
  o = run("POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n" + std::string(10, 'x'), 3, l);
  EXPECT_FALSE(o.requests.at(0).body_too_large);
  EXPECT_EQ(o.requests.at(0).body, std::string(10, 'x'));
  // Chunked: the same, and past the discard limit a 413 at once.
  const std::string te = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  o = run(te + "8\r\n12345678\r\n8\r\n12345678\r\n0\r\n\r\n", 0, l);
  ASSERT_EQ(o.error, 0);
  EXPECT_TRUE(o.requests.at(0).body_too_large);
  EXPECT_EQ(o.requests.at(0).body_bytes, 16u);
  std::string many = te;
  for (int i = 0; i < 5; ++i) many += "9\r\n123456789\r\n";
  EXPECT_EQ(run(many, 0, l).error, 413);
  EXPECT_EQ(run("POST / HTTP/1.1\r\nContent-Length: 41\r\n\r\n", 0, l).error, 413);
  EXPECT_EQ(run("POST / HTTP/1.1\r\nContent-Length: 40\r\n\r\n", 0, l).error, 0);
  // Header limits: bytes, count, request line; trailers count as a header section of their own.
  EXPECT_EQ(run("GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n", 0, l).error, 0);
  EXPECT_EQ(run("GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n", 0, l).error, 431);
  EXPECT_EQ(run("GET / HTTP/1.1\r\nA: " + std::string(200, 'v') + "\r\n\r\n", 0, l).error, 431);
  EXPECT_EQ(run("GET /" + std::string(100, 'p') + " HTTP/1.1\r\n\r\n", 0, l).error, 414);
  EXPECT_EQ(run(te + "0\r\nT: " + std::string(200, 'v') + "\r\n\r\n", 0, l).error, 431);
  EXPECT_EQ(run(te + "0\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n", 0, l).error, 431);
  // An exact fit is accepted: the section is counted with its line ends.
  const std::string head = "GET / HTTP/1.1\r\nA: ";
  const std::string fit = head + std::string(200 - head.size() - 4, 'v') + "\r\n\r\n";
  ASSERT_EQ(fit.size(), 200u);
  EXPECT_EQ(run(fit, 0, l).error, 0);
  EXPECT_EQ(run(fit, 1, l).error, 0);
  const std::string over = head + std::string(200 - head.size() - 3, 'v') + "\r\n\r\n";
  EXPECT_EQ(run(over, 0, l).error, 431);
  EXPECT_EQ(run(over, 1, l).error, 431);
}

}  // namespace
}  // namespace deepinfer::server::http
