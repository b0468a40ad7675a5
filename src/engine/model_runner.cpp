#include "engine/model_runner.h"

#include "core/error.h"
#include "core/region_timer.h"
#include "engine/parallel.h"

namespace deepinfer {

namespace {

// Data-parallel replicas step together: every step all of them learn whether anyone has work,
// and every --prefill-attempt-interval steps they vote on whether the step may prefill. With
// experts split over the replicas an idle rank still runs the (empty) step: the experts'
// collectives need it.
class DpRunner : public ModelRunner {
 public:
  DpRunner(Model& model, KvCache& kv, const RankLayout& L)
      : ModelRunner(model, kv),
        dp_(*L.dp),
        interval_(L.cfg.prefill_attempt_interval),
        empty_steps_(L.cfg.ep > 1) {}
  bool begin_step(const Scheduler& s, bool* allow_prefill) override {
    DI_REGION("comm.dp_vote");
    float v[2] = {s.has_work() ? 1.0f : 0.0f, s.wants_prefill() ? 1.0f : 0.0f};
    dp_.all_reduce(v, 2);
    busy_ = v[0] > 0;
    if (!busy_) return false;
    *allow_prefill = v[1] > 0 && steps_ % interval_ == 0;
    ++steps_;
    return true;
  }
  const std::vector<float>* run(const SchedOutput& out) override {
    if (out.empty() && !empty_steps_) return nullptr;
    return &execute(out, empty_steps_);
  }
  bool others_busy() const override { return busy_; }

 private:
  ranks::Group& dp_;
  int64_t interval_, steps_ = 0;
  bool empty_steps_, busy_ = true;
};

}  // namespace

bool ModelRunner::begin_step(const Scheduler&, bool* allow_prefill) {
  *allow_prefill = true;
  return true;
}

const std::vector<float>* ModelRunner::run(const SchedOutput& out) {
  if (followers_) {
    DI_REGION("comm.step_send");
    followers_->send(encode_sched_output(out));
  }
  return out.empty() ? nullptr : &execute(out);
}

const std::vector<float>& ModelRunner::execute(const SchedOutput& out, bool always) {
  {
    DI_REGION("engine.prepare");
    for (uint64_t id : out.released) tables_.erase(id);
    batch_.tokens.clear();
    batch_.seqs.clear();
    for (const SchedSeq& q : out.seqs) {
      std::vector<int32_t>& table = tables_[q.seq_id];
      if (q.reset_blocks) table.clear();
      table.insert(table.end(), q.new_blocks.begin(), q.new_blocks.end());
      ForwardSeq f;
      f.start_pos = q.start_pos;
      f.n_tokens = int64_t(q.tokens.size()) + q.n_padding;
      f.n_padding = q.n_padding;
      f.kv = {q.slot, table.data(), int64_t(table.size())};
      const int64_t real = int64_t(q.tokens.size());
      f.logits_from = q.sample && want_logits_ ? real - 1 : real;
      batch_.tokens.insert(batch_.tokens.end(), q.tokens.begin(), q.tokens.end());
      // Placeholder rows repeat the last real token; they write no state and nobody sees them.
      batch_.tokens.insert(batch_.tokens.end(), size_t(q.n_padding), q.tokens.back());
      batch_.seqs.push_back(f);
    }
  }
  logits_.resize(size_t(batch_.n_logit_rows() * model_.config().vocab_size));
  {
    DI_REGION("engine.forward");
    if (!batch_.seqs.empty() || always) model_.forward(batch_, kv_, logits_.data());
  }
  return logits_;
}

std::unique_ptr<ModelRunner> make_runner(Model& model, KvCache& kv, const RankLayout* layout) {
  if (layout && layout->cfg.dp > 1) return std::make_unique<DpRunner>(model, kv, *layout);
  return std::make_unique<ModelRunner>(model, kv, true, layout ? layout->channel : nullptr);
}

void run_replica_follower(ModelRunner& runner, ranks::StepChannel& channel) {
  std::vector<uint8_t> msg;
  for (;;) {
    {
      DI_REGION("comm.step_receive");
      if (!channel.receive(msg)) return;
    }
    runner.execute(decode_sched_output(msg));
  }
}

}  // namespace deepinfer
