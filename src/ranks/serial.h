// Byte messages for the step channel: the leader writes plain values, vectors and strings into a
// Writer and sends the bytes; followers read them back in the same order with a Reader. Values
// are copied in host byte order (all ranks run the same build on the same architecture) with no
// padding or alignment. A Reader never reads past its bytes: a truncated or corrupt message
// throws deepinfer::Error naming the message and the offset.
//
// The ranks' structured messages are field lists, each list serving both directions: w(a, b, ...)
// writes the fields in turn, r(a, b, ...) reads them back in the same order. A bool takes one
// byte, an optional a presence byte then its value, a vector of other than plain values its
// length then each item, and a struct its field list: a fields(io, s) overload next to its
// message, found by argument-dependent lookup, with s a FieldsOf the struct.
#pragma once

#include <concepts>
#include <cstdint>
#include <cstring>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.h"

namespace deepinfer::ranks {

template <typename T>
concept Pod = std::is_trivially_copyable_v<T> && !std::is_pointer_v<T>;

// A field list's struct: T is U, const (written) or not (read).
template <typename T, typename U>
concept FieldsOf = std::same_as<std::remove_const_t<T>, U>;

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

  // Writes a field list.
  template <typename... T>
  void operator()(const T&... v) {
    (field(v), ...);
  }

  const std::vector<uint8_t>& bytes() const { return buf_; }
  std::vector<uint8_t> take() { return std::move(buf_); }

 private:
  template <Pod T>
  void field(const T& v) {
    put(v);
  }
  void field(const std::string& s) { put_string(s); }
  template <typename T>
  void field(const std::optional<T>& v) {
    (*this)(v.has_value(), v.value_or(T()));
  }
  template <typename A, typename B>
  void field(const std::pair<A, B>& v) {
    (*this)(v.first, v.second);
  }
  template <typename T>
  void field(const std::vector<T>& v) {
    if constexpr (Pod<T>) {
      put_vector(v);
    } else {
      put<uint64_t>(v.size());
      for (const T& x : v) field(x);
    }
  }
  template <typename T>
  void field(const T& v) {
    fields(*this, v);
  }

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

  // Reads a field list.
  template <typename... T>
  void operator()(T&... v) {
    (field(v), ...);
  }

 private:
  template <Pod T>
  void field(T& v) {
    v = get<T>();
  }
  void field(bool& b) { b = get<uint8_t>() != 0; }
  void field(std::string& s) { s = get_string(); }
  template <typename T>
  void field(std::optional<T>& v) {
    bool has = false;
    (*this)(has, v.emplace());
    if (!has) v.reset();
  }
  template <typename A, typename B>
  void field(std::pair<A, B>& v) {
    (*this)(v.first, v.second);
  }
  template <typename T>
  void field(std::vector<T>& v) {
    if constexpr (Pod<T>) {
      v = get_vector<T>();
    } else {
      // Every item of these messages takes 8 bytes at least.
      const auto n = get<uint64_t>();
      DI_REQUIRE(n <= remaining() / 8, what_, ": a list of ", n, " items in ", remaining(),
                 " bytes");
      v.resize(n);
      for (T& x : v) field(x);
    }
  }
  template <typename T>
  void field(T& v) {
    fields(*this, v);
  }

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
