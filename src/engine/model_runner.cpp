#include "engine/model_runner.h"

#include "core/error.h"
#include "core/region_timer.h"
#include "engine/parallel.h"

namespace deepinfer {

ModelRunner::ModelRunner(Model& model, KvCache& kv, bool logits, const RankLayout* layout)
    : model_(model), kv_(kv), want_logits_(logits) {
  if (!layout) return;
  followers_ = layout->channel;
  if (layout->cfg.dp == 1) return;
  dp_ = layout->dp.get();
  interval_ = layout->cfg.prefill_attempt_interval;
  empty_steps_ = layout->cfg.ep > 1;
}

bool ModelRunner::begin_step(const Scheduler& s, bool* allow_prefill) {
  *allow_prefill = true;
  if (!dp_) return true;
  DI_REGION("comm.dp_vote");
  float v[2] = {s.has_work() ? 1.0f : 0.0f, s.wants_prefill() ? 1.0f : 0.0f};
  dp_->all_reduce(v, 2);
  busy_ = v[0] > 0;
  if (!busy_) return false;
  *allow_prefill = v[1] > 0 && steps_ % interval_ == 0;
  ++steps_;
  return true;
}

const std::vector<float>* ModelRunner::run(const SchedOutput& out) {
  if (followers_) {
    DI_REGION("comm.step_send");
    followers_->send(encode_sched_output(out));
  }
  if (out.empty() && !empty_steps_) return nullptr;
  return &execute(out, empty_steps_);
}

const std::vector<float>& ModelRunner::execute(const SchedOutput& out, bool always) {
  {
    DI_REGION("engine.prepare");
    for (uint64_t id : out.released) tables_.erase(id);
    batch_.tokens.clear();
    batch_.seqs.clear();
    batch_.saves.clear();
    for (const SchedSeq& q : out.seqs) {
      for (const SchedSeq::Save& v : q.saves)
        if (v.snap >= 0) batch_.saves.push_back({int32_t(batch_.seqs.size()), v.boundary, v.snap});
      std::vector<int32_t>& table = tables_[q.seq_id];
      if (q.reset_blocks) table.clear();
      table.insert(table.end(), q.new_blocks.begin(), q.new_blocks.end());
      const int64_t real = int64_t(q.tokens.size());
      batch_.seqs.push_back({.start_pos = q.start_pos,
                             .n_tokens = real + q.n_padding,
                             .n_padding = q.n_padding,
                             .kv = {q.slot, table.data(), int64_t(table.size())},
                             .logits_from = q.sample && want_logits_ ? real - 1 - q.n_drafts : real,
                             .restore = q.restore,
                             .rollback = q.rollback,
                             .backup = q.backup});
      batch_.tokens.insert(batch_.tokens.end(), q.tokens.begin(), q.tokens.end());
      // Placeholder rows repeat the last real token; they write no state and nobody sees them.
      batch_.tokens.insert(batch_.tokens.end(), size_t(q.n_padding), q.tokens.back());
    }
  }
  logits_.resize(size_t(batch_.n_logit_rows() * model_.config().vocab_size));
  {
    DI_REGION("engine.forward");
    if (!batch_.seqs.empty() || always) model_.forward(batch_, kv_, logits_.data());
  }
  return logits_;
}

const DraftOutput& ModelRunner::draft(const SchedOutput& out, std::span<const int32_t> accepted,
                                      std::span<const int32_t> from, int slots) {
  DI_CHECK(accepted.size() == out.seqs.size() && from.size() == out.seqs.size());
  draft_in_.clear();
  for (size_t i = 0; i < out.seqs.size(); ++i) {
    const SchedSeq& q = out.seqs[i];
    DI_CHECK(accepted[i] >= 0 && accepted[i] <= q.n_drafts);
    draft_in_.push_back({int32_t(i), int64_t(q.tokens.size()) - q.n_drafts + accepted[i], from[i]});
  }
  draft_out_.slots = slots;
  if (!draft_in_.empty()) model_.draft(draft_in_, kv_, draft_out_);
  return draft_out_;
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
