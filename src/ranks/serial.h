// Byte messages for the step channel: the leader writes plain values, vectors and strings into a
// Writer and sends the bytes; followers read them back in the same order with a Reader. Values
// are copied in host byte order (all ranks run the same build on the same architecture) with no
// padding or alignment. A Reader never reads past its bytes: a truncated or corrupt message
// throws deepinfer::Error naming the message and the offset.
#pragma once

#include <cstdint>
#include <cstring>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/error.h"

namespace deepinfer::ranks {

template <typename T>
concept Pod = std::is_trivially_copyable_v<T> && !std::is_pointer_v<T>;

class Writer {
 public:
  template <Pod T>
  void put(const T& v) {
    put_bytes(&v, sizeof(T));
  }
  // A length (uint64) then the elements of a contiguous range (vector, span, string).
  template <std::ranges::contiguous_range R>
  requires Pod<std::ranges::range_value_t<R>>
  void put_vector(const R& v) {
    put<uint64_t>(std::ranges::size(v));
    put_bytes(std::ranges::data(v), std::ranges::size(v) * sizeof(std::ranges::range_value_t<R>));
  }
  void put_string(std::string_view s) { put_vector(s); }
  void put_bytes(const void* p, size_t n) {
    const auto* bytes = static_cast<const uint8_t*>(p);
    buf_.insert(buf_.end(), bytes, bytes + n);
  }

  const std::vector<uint8_t>& bytes() const { return buf_; }
  std::vector<uint8_t> take() { return std::move(buf_); }

 private:
  std::vector<uint8_t> buf_;
};

class Reader {
 public:
  // `what` names the message in errors ("step message").
  explicit Reader(std::span<const uint8_t> bytes, std::string_view what = "message")
      : bytes_(bytes), what_(what) {}

  template <Pod T>
  T get() {
    T v;
    get_bytes(&v, sizeof(T), "a value");
    return v;
  }
  template <Pod T>
  std::vector<T> get_vector() {
    return get_sequence<std::vector<T>>("a vector");
  }
  std::string get_string() { return get_sequence<std::string>("a string"); }
  void get_bytes(void* p, size_t n, const char* item = "bytes") {
    DI_REQUIRE(n <= remaining(), what_, ": truncated at byte ", pos_, " of ", bytes_.size(),
               " reading ", item, " of ", n, " bytes");
    if (n) std::memcpy(p, bytes_.data() + pos_, n);
    pos_ += n;
  }

  size_t remaining() const { return bytes_.size() - pos_; }
  bool done() const { return pos_ == bytes_.size(); }
  // For a reader that has consumed what it expected: leftover bytes mean the two sides disagree.
  void expect_end() const {
    DI_REQUIRE(done(), what_, ": ", remaining(), " unread bytes after byte ", pos_,
               " (writer and reader disagree on the layout)");
  }

 private:
  // A length prefix, validated against what is left before anything is allocated, then the
  // elements.
  template <typename Seq>
  Seq get_sequence(const char* item) {
    using T = typename Seq::value_type;
    const size_t at = pos_;
    const uint64_t n = get<uint64_t>();
    DI_REQUIRE(n <= remaining() / sizeof(T), what_, ": ", item, " at byte ", at, " claims ", n,
               " elements of ", sizeof(T), " bytes but only ", remaining(), " bytes remain");
    Seq seq(n, T());
    get_bytes(seq.data(), n * sizeof(T), item);
    return seq;
  }

  std::span<const uint8_t> bytes_;
  std::string what_;
  size_t pos_ = 0;
};

}  // namespace deepinfer::ranks
