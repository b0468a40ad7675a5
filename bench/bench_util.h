// Shared pieces of `deepinfer bench`: result rows printed as JSON lines (--json) or aligned text,
// wall-clock timing, and the machine limits every benchmark divides by (measured in the same run
// as the figure it reports).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/format.h"

namespace CLI {
class App;
}

namespace deepinfer::bench {

// Registers `deepinfer bench` and its subcommands on the app (bench/cmd_bench.cpp).
void add_command(CLI::App& app);

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

// Seconds to read every byte of `bufs` once with every thread of the global pool (thread t
// reads share t of their concatenation), the faster of a plain read and one with software
// prefetch: the read limit of the very memory a kernel streams (same pages, same placement),
// sampled next to the kernel it bounds.
double sweep_seconds(const std::vector<std::span<const uint8_t>>& bufs);

// Alternated samples of a figure and its limit (ABAB): each pair's ratio is figure / limit.
struct PairStats {
  std::vector<double> figure, limit, ratio;
  void add(double fig, double lim) {
    figure.push_back(fig);
    limit.push_back(lim);
    ratio.push_back(fig / lim);
  }
};
double median(std::vector<double> v);
double min_of(const std::vector<double>& v);
double max_of(const std::vector<double>& v);
// Adds <name> (median figure), <limit_name> (median limit), ratio (median of the pair ratios),
// ratio_min, ratio_max and pairs to `row`.
void add_pairs(Row& row, const PairStats& p, const std::string& name, const std::string& limit_name,
               int precision = 2);

}  // namespace deepinfer::bench
