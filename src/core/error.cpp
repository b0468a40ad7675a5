#include "core/error.h"

namespace deepinfer {

void throw_check_failure(const char* cond, const char* file, int line, const std::string& msg) {
  throw Error(str_cat("internal check failed: ", cond, " at ", file, ":", line,
                      msg.empty() ? "" : ": ", msg));
}

}  // namespace deepinfer
