// Shared pieces of `deepinfer bench`: result rows printed as JSON lines (--json) or aligned text,
// wall-clock timing, and the machine limits every benchmark divides by (measured in the same run
// as the figure it reports).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/format.h"

namespace deepinfer::bench {

// One result: ordered fields. Numbers keep their type in JSON.
class Row {
 public:
  explicit Row(std::string bench) { add("bench", std::move(bench)); }
  Row& add(const std::string& key, const std::string& value);
  Row& add(const std::string& key, const char* value) { return add(key, std::string(value)); }
  Row& add(const std::string& key, double value, int precision = 3);
  Row& add(const std::string& key, int64_t value);
  Row& add(const std::string& key, int value) { return add(key, int64_t(value)); }

  struct Field {
    std::string key, text;
    bool number;
    double num;
  };
  const std::vector<Field>& fields() const { return fields_; }

 private:
  std::vector<Field> fields_;
};

class Reporter {
 public:
  explicit Reporter(bool json) : json_(json) {}
  void print(const Row& r);
  void note(const std::string& text);  // free text (stderr in JSON mode)

 private:
  bool json_;
};

double now_s();

// Read bandwidth in GB/s (1e9 B/s) over a fresh buffer of `bytes` (keep it well above the
// last-level cache): every thread of the global pool sums its contiguous share; best of `reps`.
double read_bandwidth_gbs(uint64_t bytes, int reps);

}  // namespace deepinfer::bench
