// `deepinfer bench ...`: kernel and end-to-end benchmarks, each printing its figure, the machine
// limit measured in the same run, and their ratio (JSON lines with --json).
#include <malloc.h>

#include <memory>
#include <sstream>

#include <CLI/CLI.hpp>

#include "core/error.h"
#include "core/thread_pool.h"

#include "bench/bench_decode.h"
#include "bench/bench_grammar.h"
#include "bench/bench_linear.h"
#include "bench/bench_prefix.h"
#include "bench/bench_util.h"

namespace deepinfer::bench {

namespace {

struct BenchFlags {
  bool json = false;
  int threads = 0;
};

void apply(const BenchFlags& f) {
  if (f.threads > 0) ThreadPool::set_global_threads(f.threads);
  // The model's per-step buffers are freed and allocated again every step; keep freed memory in
  // the heap instead of returning it to the kernel, so that steps do not pay page faults.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // the largest value glibc accepts
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

// "a,b,c" -> numbers.
template <typename T>
std::vector<T> parse_list(const std::string& s, const char* what) {
  std::vector<T> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      DI_REQUIRE(used == item.size() && v > 0, "");
      out.push_back(T(v));
    } catch (const std::exception&) {
      throw Error(
          str_cat(what, ": '", item, "' is not a positive integer (expected a list like 1,4,16)"));
    }
  }
  DI_REQUIRE(!out.empty(), what, ": empty list");
  return out;
}

void add_common(CLI::App* cmd, BenchFlags& f) {
  cmd->add_flag("--json", f.json, "One JSON object per result line");
  cmd->add_option("--threads", f.threads, "Threads (default: DEEPINFER_NUM_THREADS or all cores)");
}

}  // namespace

void add_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks against the machine's limits");
  bench->require_subcommand(1);

  {
    auto f = std::make_shared<BenchFlags>();
    auto mib = std::make_shared<int>(1024);
    auto reps = std::make_shared<int>(5);
    CLI::App* cmd =
        bench->add_subcommand("bandwidth", "Read bandwidth, all threads (decode limit)");
    add_common(cmd, *f);
    cmd->add_option("--mib", *mib, "Buffer size in MiB (well above the last-level cache)");
    cmd->add_option("--reps", *reps, "Repetitions (best is reported)");
    cmd->callback([f, mib, reps] {
      apply(*f);
      DI_REQUIRE(*mib >= 64, "--mib ", *mib, ": expected at least 64");
      Reporter rep(f->json);
      bench_bandwidth(rep, uint64_t(*mib) << 20, *reps);
    });
  }
  {
    auto f = std::make_shared<BenchFlags>();
    auto opt = std::make_shared<LinearBenchOptions>();
    auto formats = std::make_shared<std::string>("fp8,fp4");
    auto rows = std::make_shared<std::string>("16,128,512");
    auto gemv_rows = std::make_shared<std::string>("1");
    auto ws = std::make_shared<int>(256);
    auto no_dnn = std::make_shared<bool>(false);
    auto shapes = std::make_shared<std::string>();
    CLI::App* cmd = bench->add_subcommand(
        "linear", "fp8/fp4 GEMV (GB/s vs read bandwidth) and GEMM (GFLOP/s vs oneDNN bf16)");
    add_common(cmd, *f);
    cmd->add_option("--formats", *formats, "Weight formats: fp8, fp4, bf16 (plain, as the head)");
    cmd->add_option("--rows", *rows, "GEMM row counts");
    cmd->add_option("--gemv-rows", *gemv_rows,
                    "GEMV row counts (e.g. 1,5: a verify step of 4 drafts)");
    cmd->add_option("--shapes", *shapes,
                    "in:out pairs, e.g. 5120:1280,2304:5120 (default: V4.1-Flash)");
    cmd->add_option("--working-set-mib", *ws, "Weights cycled through per measurement");
    cmd->add_option("--pairs", opt->pairs,
                    "Alternated (limit, kernel) samples per figure; the median ratio is reported");
    cmd->add_flag("--no-onednn", *no_dnn, "Skip the oneDNN comparison");
    auto no_gemm = std::make_shared<bool>(false);
    cmd->add_flag("--no-gemm", *no_gemm, "GEMV only");
    cmd->callback([f, opt, formats, rows, gemv_rows, ws, no_dnn, no_gemm, shapes] {
      apply(*f);
      opt->formats.clear();
      std::stringstream ss(*formats);
      for (std::string s; std::getline(ss, s, ',');) opt->formats.push_back(s);
      opt->gemm_rows = parse_list<int64_t>(*rows, "--rows");
      if (*no_gemm) opt->gemm_rows.clear();
      opt->gemv_rows = parse_list<int64_t>(*gemv_rows, "--gemv-rows");
      for (int64_t n : opt->gemv_rows)
        DI_REQUIRE(n >= 1 && n <= 16, "--gemv-rows ", n, ": expected 1 to 16");
      DI_REQUIRE(*ws >= 1, "--working-set-mib ", *ws, ": expected at least 1");
      DI_REQUIRE(opt->pairs >= 1, "--pairs ", opt->pairs, ": expected at least 1");
      opt->working_set = uint64_t(*ws) << 20;
      opt->onednn = !*no_dnn;
      std::stringstream sh(*shapes);
      for (std::string s; std::getline(sh, s, ',');) {
        const size_t colon = s.find(':');
        DI_REQUIRE(colon != std::string::npos, "--shapes: '", s, "' is not in:out");
        const auto in = parse_list<int64_t>(s.substr(0, colon), "--shapes");
        const auto out = parse_list<int64_t>(s.substr(colon + 1), "--shapes");
        DI_REQUIRE(in[0] % 32 == 0, "--shapes: input dim ", in[0], " is not a multiple of 32");
        opt->shapes.push_back({in[0], out[0], s});
      }
      Reporter rep(f->json);
      bench_linear(rep, *opt);
    });
  }
  {
    auto f = std::make_shared<BenchFlags>();
    auto opt = std::make_shared<DecodeBenchOptions>();
    auto batches = std::make_shared<std::string>("1,4,16");
    CLI::App* cmd = bench->add_subcommand(
        "decode", "Decode tok/s vs the bandwidth roofline; prefill tok/s vs the FLOP limit");
    add_common(cmd, *f);
    cmd->add_option("--model", opt->model_dir, "Checkpoint directory")->required();
    cmd->add_option("--batches", *batches, "Decode batch sizes");
    cmd->add_option("--prompt", opt->prompt, "Context tokens before the timed decode steps");
    cmd->add_option("--steps", opt->steps, "Timed decode steps per pair");
    cmd->add_option("--pairs", opt->pairs,
                    "Alternated (limit, measurement) samples per figure; the median ratio is "
                    "reported");
    cmd->add_option("--prefill", opt->prefill_tokens, "Prompt length of the prefill measurement");
    cmd->add_flag("--regions", opt->regions, "Print the model's time per region (stderr)");
    cmd->add_option("--speculative", opt->speculative,
                    "Also decode with this many drafts per step: all accepted (forced) and n-gram, "
                    "against plain decode (engine, --prompt context, greedy)");
    cmd->add_option("--spec-tokens", opt->spec_tokens, "Tokens per request of --speculative");
    cmd->callback([f, opt, batches] {
      apply(*f);
      opt->batches = parse_list<int>(*batches, "--batches");
      DI_REQUIRE(opt->prompt >= 1 && opt->steps >= 1 && opt->prefill_tokens >= 1 && opt->pairs >= 1,
                 "--prompt, --steps, --pairs and --prefill must be positive");
      DI_REQUIRE(opt->speculative >= 0 && opt->spec_tokens >= 2,
                 "--speculative must be >= 0 and --spec-tokens >= 2");
      Reporter rep(f->json);
      bench_decode(rep, *opt);
    });
  }
  {
    auto f = std::make_shared<BenchFlags>();
    auto opt = std::make_shared<VisionBenchOptions>();
    CLI::App* cmd = bench->add_subcommand(
        "vision", "The vision tower's time per image vs the FLOP limit (oneDNN bf16 peak)");
    add_common(cmd, *f);
    cmd->add_option("--model", opt->model_dir, "Checkpoint directory (with a vision tower)")
        ->required();
    cmd->add_option("--pairs", opt->pairs, "Alternated (limit, measurement) samples");
    cmd->add_option("--side", opt->side,
                    "Token grid side of the image (default: the largest that fits)");
    cmd->callback([f, opt] {
      apply(*f);
      DI_REQUIRE(opt->pairs >= 1 && opt->side >= 0, "--pairs must be >= 1 and --side >= 0");
      Reporter rep(f->json);
      bench_vision(rep, *opt);
    });
  }
  {
    auto f = std::make_shared<BenchFlags>();
    auto opt = std::make_shared<GrammarBenchOptions>();
    CLI::App* cmd = bench->add_subcommand(
        "grammar", "Token-mask cost per step of constrained (JSON) output on a vocabulary");
    add_common(cmd, *f);
    cmd->add_option("--tokenizer", opt->tokenizer, "tokenizer.json, or a directory holding it")
        ->required();
    cmd->add_option("--schema", opt->schema_file, "A JSON schema file (default: a built-in one)");
    cmd->add_option("--walks", opt->walks, "Random walks per phase");
    cmd->add_option("--max-steps", opt->max_steps, "Tokens per walk at most");
    cmd->callback([f, opt] {
      apply(*f);
      DI_REQUIRE(opt->walks >= 1 && opt->max_steps >= 1, "--walks and --max-steps must be >= 1");
      Reporter rep(f->json);
      bench_grammar(rep, *opt);
    });
  }
  {
    auto f = std::make_shared<BenchFlags>();
    auto opt = std::make_shared<PrefixBenchOptions>();
    CLI::App* cmd = bench->add_subcommand(
        "prefix-cache", "Time to first token from a cached prefix vs the same request cold");
    add_common(cmd, *f);
    cmd->add_option("--model", opt->model_dir, "Checkpoint directory")->required();
    cmd->add_option("--prefix", opt->prefix, "Tokens shared with the earlier request")
        ->capture_default_str();
    cmd->add_option("--suffix", opt->suffix, "Tokens after the prefix")->capture_default_str();
    cmd->add_option("--pairs", opt->pairs,
                    "Alternated (cold, cached) pairs; the median ratio is reported")
        ->capture_default_str();
    cmd->callback([f, opt] {
      apply(*f);
      DI_REQUIRE(opt->prefix >= 1 && opt->suffix >= 1 && opt->pairs >= 1,
                 "--prefix, --suffix and --pairs must be >= 1");
      Reporter rep(f->json);
      bench_prefix(rep, *opt);
    });
  }
  {
    auto f = std::make_shared<BenchFlags>();
    auto calls = std::make_shared<int>(20000);
    CLI::App* cmd = bench->add_subcommand("pool", "Thread-pool overhead per parallel_for");
    add_common(cmd, *f);
    cmd->add_option("--calls", *calls, "Calls timed");
    cmd->callback([f, calls] {
      apply(*f);
      Reporter rep(f->json);
      bench_pool(rep, std::max(1, *calls));
    });
  }
}

}  // namespace deepinfer::bench
