// Errors. `deepinfer::Error` is the one exception type for bad input (files, configs, requests):
// its message names the input and says what was expected. `DI_CHECK` guards internal invariants
// (a failure is a bug in DeepInfer, not in the input) and throws `Error` too, so a server can
// report it instead of aborting.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace deepinfer {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// Concatenates anything streamable: str_cat("tensor ", name, " has ", n, " dims").
template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

[[noreturn]] void throw_check_failure(const char* cond, const char* file, int line,
                                      const std::string& msg);

}  // namespace deepinfer

// Throws deepinfer::Error with the streamed message when `cond` is false.
#define DI_REQUIRE(cond, ...)                                                 \
  do {                                                                        \
    if (!(cond)) throw ::deepinfer::Error(::deepinfer::str_cat(__VA_ARGS__)); \
  } while (0)

// Internal invariant; the message says which one broke.
#define DI_CHECK(cond, ...)                                                                  \
  do {                                                                                       \
    if (!(cond))                                                                             \
      ::deepinfer::throw_check_failure(#cond, __FILE__, __LINE__,                            \
                                       ::deepinfer::str_cat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
