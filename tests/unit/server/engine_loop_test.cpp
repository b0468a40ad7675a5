// The engine thread on the built-in tiny model: calls submitted from many threads get exactly the
// tokens a direct Engine run gives (greedy), cancellation ends a call and frees its KV, a refused
// choice refuses its whole call, and stopping ends what is left.
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "io/checkpoint.h"
#include "runtime/builtin.h"
#include "server/engine_loop.h"

namespace deepinfer::server {
namespace {

using namespace std::chrono_literals;

struct Tiny {
  std::unique_ptr<Checkpoint> ck;
  std::unique_ptr<Model> model;
  Tiny() {
    ck = Checkpoint::load(default_model_dir());
    model = std::make_unique<Model>(*ck, ModelOptions{});
  }
};

Tiny& tiny() {
  static Tiny t;
  return t;
}

std::unique_ptr<Engine> make_engine() {
  EngineConfig cfg;
  cfg.sched.max_num_seqs = 4;
  cfg.sched.max_model_len = 256;
  return std::make_unique<Engine>(*tiny().model, cfg);
}

Request greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
  Request r;
  r.prompt_ids = std::move(prompt);
  r.params.temperature = 0;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  return r;
}

struct Collected {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<FinishReason> finish;
};

// Queues the requests and waits for the engine thread to take them: "" when all were accepted,
// else its reason for refusing one.
std::string submit(EngineLoop& loop, const std::shared_ptr<Call>& call,
                   std::vector<Request> requests) {
  loop.submit(call, std::move(requests));
  std::optional<std::string> error;
  while (!(error = call->admission())) std::this_thread::sleep_for(1ms);
  return *error;
}

// Waits up to `timeout` for updates and moves them to `out` (false: none came).
bool wait(Call& call, std::vector<CallUpdate>* out, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while ((*out = call.take()).empty() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  return !out->empty();
}

// The updates of a call's `choices` until every choice has ended.
Collected collect(Call& call, size_t choices, std::chrono::seconds limit = 60s) {
  Collected c;
  c.tokens.resize(choices);
  c.finish.resize(choices);
  size_t ended = 0;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (ended < choices && std::chrono::steady_clock::now() < deadline) {
    std::vector<CallUpdate> ups;
    wait(call, &ups, 100ms);
    for (const CallUpdate& u : ups) {
      if (u.end) {
        c.finish[size_t(u.choice)] = u.finish;
        ++ended;
      } else {
        c.tokens[size_t(u.choice)].push_back(u.token.token);
      }
    }
  }
  EXPECT_EQ(ended, choices) << "call did not end in time";
  return c;
}

std::vector<int32_t> prompt_of(int i) {
  std::vector<int32_t> p;
  for (int t = 0; t < 5 + i; ++t) p.push_back(1000 + 37 * i + 11 * t);
  return p;
}

bool wait_idle(const EngineLoop& loop) {
  for (int i = 0; i < 500; ++i) {
    const EngineGauges g = loop.gauges();
    if (g.running == 0 && g.waiting == 0 && g.kv_blocks_used == 0) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

TEST(EngineLoop, ConcurrentCallsMatchADirectRun) {
  constexpr int kCalls = 8;
  // Reference: one engine, all requests at once, run to completion.
  std::map<RequestId, std::vector<int32_t>> want;
  {
    auto engine = make_engine();
    for (int i = 0; i < kCalls; ++i) {
      Request r = greedy(prompt_of(i), 6 + i);
      r.id = RequestId(i);
      ASSERT_EQ(engine->add_request(r), "");
    }
    while (engine->has_unfinished()) {
      engine->step();
      for (auto& o : engine->take_finished()) want[o.id] = o.output_ids;
    }
  }
  auto engine = make_engine();
  Metrics metrics;
  EngineLoop loop(*engine, metrics);
  loop.start();
  std::vector<Collected> got(kCalls);
  std::vector<std::thread> clients;
  for (int i = 0; i < kCalls; ++i) {
    clients.emplace_back([&, i] {
      auto call = std::make_shared<Call>();
      ASSERT_EQ(submit(loop, call, {greedy(prompt_of(i), 6 + i)}), "");
      got[size_t(i)] = collect(*call, 1);
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < kCalls; ++i) {
    EXPECT_EQ(got[size_t(i)].tokens[0], want[RequestId(i)]) << "call " << i;
    EXPECT_EQ(got[size_t(i)].finish[0], FinishReason::Length);
  }
  EXPECT_TRUE(wait_idle(loop));
  const std::string m = metrics.render(loop.gauges(), 0);
  EXPECT_NE(m.find("deepinfer_requests_finished_total{finish_reason=\"length\"} 8"),
            std::string::npos)
      << m;
}

TEST(Metrics, DataParallelReplicasGetOneLineEach) {
  Metrics metrics;
  EngineGauges g;
  g.running = 3;
  g.replicas.resize(2);
  g.replicas[0].running = 1;
  g.replicas[1].running = 2;
  g.replicas[1].waiting = 4;
  g.replicas[1].kv_blocks_used = 7;
  g.replicas[0].stats.generated_tokens = 11;
  const std::string m = metrics.render(g, 0);
  for (const char* line : {"deepinfer_num_requests_running 3\n",
                           "deepinfer_replica_num_requests_running{replica=\"0\"} 1\n",
                           "deepinfer_replica_num_requests_running{replica=\"1\"} 2\n",
                           "deepinfer_replica_num_requests_waiting{replica=\"1\"} 4\n",
                           "deepinfer_replica_kv_blocks_used{replica=\"1\"} 7\n",
                           "deepinfer_replica_generation_tokens_total{replica=\"0\"} 11\n",
                           "# TYPE deepinfer_replica_generation_tokens_total counter\n"})
    EXPECT_NE(m.find(line), std::string::npos) << line << m;
  // One replica: no per-replica lines.
  EXPECT_EQ(metrics.render(EngineGauges{}, 0).find("replica"), std::string::npos);
}

TEST(EngineLoop, ChoicesOfOneCallRunSideBySide) {
  auto engine = make_engine();
  Metrics metrics;
  EngineLoop loop(*engine, metrics);
  loop.start();
  auto call = std::make_shared<Call>();
  std::vector<Request> reqs = {greedy(prompt_of(1), 4), greedy(prompt_of(1), 4),
                               greedy(prompt_of(2), 5)};
  ASSERT_EQ(submit(loop, call, reqs), "");
  const Collected c = collect(*call, 3);
  EXPECT_EQ(c.tokens[0], c.tokens[1]) << "same prompt, greedy";
  EXPECT_EQ(c.tokens[0].size(), 4u);
  EXPECT_EQ(c.tokens[2].size(), 5u);
}

TEST(EngineLoop, CancelEndsTheCallAndFreesItsKv) {
  auto engine = make_engine();
  Metrics metrics;
  EngineLoop loop(*engine, metrics);
  loop.start();
  auto call = std::make_shared<Call>();
  ASSERT_EQ(submit(loop, call, {greedy(prompt_of(3), 200)}), "");
  std::vector<CallUpdate> first;
  while (first.empty()) wait(*call, &first, 100ms);
  // Gauges are published after the step that produced the token.
  for (int i = 0; i < 100 && loop.gauges().kv_blocks_used == 0; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_GT(loop.gauges().kv_blocks_used, 0);
  loop.cancel(call);
  const Collected c = collect(*call, 1);
  EXPECT_EQ(c.finish[0], FinishReason::Abort);
  EXPECT_LT(c.tokens[0].size() + first.size(), 200u);
  EXPECT_TRUE(wait_idle(loop)) << "KV blocks still held after cancel";
}

TEST(EngineLoop, ARefusedChoiceRefusesTheWholeCall) {
  auto engine = make_engine();
  Metrics metrics;
  EngineLoop loop(*engine, metrics);
  loop.start();
  auto call = std::make_shared<Call>();
  const std::string err =
      submit(loop, call, {greedy(prompt_of(1), 4), greedy(std::vector<int32_t>(300, 5), 4)});
  EXPECT_NE(err.find("max_model_len"), std::string::npos) << err;
  EXPECT_TRUE(wait_idle(loop));
  auto next = std::make_shared<Call>();
  ASSERT_EQ(submit(loop, next, {greedy(prompt_of(1), 3)}), "");
  EXPECT_EQ(collect(*next, 1).tokens[0].size(), 3u);
  std::vector<CallUpdate> stray;
  EXPECT_FALSE(wait(*call, &stray, 50ms)) << "the refused call got updates";
}

TEST(EngineLoop, StopEndsRunningCalls) {
  auto engine = make_engine();
  Metrics metrics;
  EngineLoop loop(*engine, metrics);
  loop.start();
  auto call = std::make_shared<Call>();
  ASSERT_EQ(submit(loop, call, {greedy(prompt_of(4), 240)}), "");
  loop.stop();
  const Collected c = collect(*call, 1, 5s);
  EXPECT_EQ(c.finish[0], FinishReason::Abort);
  EXPECT_EQ(engine->kv_blocks_used(), 0);
  auto late = std::make_shared<Call>();
  EXPECT_NE(submit(loop, late, {greedy(prompt_of(1), 3)}), "");
}

}  // namespace
}  // namespace deepinfer::server
