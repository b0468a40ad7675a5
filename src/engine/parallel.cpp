#include "engine/parallel.h"

#include <algorithm>

#include "core/error.h"
#include "core/region_timer.h"

namespace deepinfer {

void ParallelConfig::validate(int n_experts) const {
  DI_REQUIRE(dp >= 1 && cp >= 1 && ep >= 1, "--dp, --cp and --ep must be >= 1");
  DI_REQUIRE(prefill_attempt_interval >= 1, "--prefill-attempt-interval must be >= 1");
  DI_REQUIRE(engram_sharding == "auto" || engram_sharding == "on" || engram_sharding == "off",
             "--engram-sharding must be auto, on or off");
  if (dp == 1) {
    const int g = replica_size();
    DI_REQUIRE((cp == 1 || cp == g) && (ep == 1 || ep == g), "--cp ", cp, " with --ep ", ep,
               ": within one replica, cp and ep must each be 1 or the replica size");
  } else {
    DI_REQUIRE(cp == 1, "--dp ", dp, " with --cp ", cp,
               ": data-parallel replicas are single ranks (use --cp without --dp)");
    DI_REQUIRE(ep == 1 || ep == dp, "--dp ", dp, " with --ep ", ep,
               ": experts split over all data-parallel ranks (--ep equal to --dp) or none");
  }
  DI_REQUIRE(n_experts % ep == 0, "--ep ", ep, " does not divide the ", n_experts,
             " routed experts");
}

RankLayout make_rank_layout(const ParallelConfig& cfg, ranks::World& world, int n_experts) {
  DI_REQUIRE(world.size() == cfg.world_size(), "the run has ", world.size(),
             " ranks but --dp/--cp/--ep ask for ", cfg.world_size());
  RankLayout L;
  L.cfg = cfg;
  const int g = cfg.replica_size(), dp_rank = world.rank() / g, replica_rank = world.rank() % g;
  L.scheduler = replica_rank == 0;
  // Every member calls split in the same order: replica groups, then the dp group.
  L.replica = world.group().split(dp_rank, replica_rank);
  L.dp = world.group().split(L.scheduler ? 0 : -1, dp_rank);
  if (cfg.dp == 1) {
    L.channel = g > 1 ? &world.channel() : nullptr;
    if (cfg.cp > 1) L.model.context = std::make_shared<ContextShard>(L.replica.get());
    if (cfg.ep > 1) L.model.experts = std::make_shared<ExpertExchange>(L.replica.get());
  } else if (cfg.ep > 1) {
    L.model.experts = std::make_shared<ExpertExchange>(&world.group(), true);
  }
  const int ep_rank = cfg.ep == 1 ? 0 : cfg.dp == 1 ? replica_rank : dp_rank;
  L.expert_begin = n_experts / cfg.ep * ep_rank;
  L.expert_end = n_experts / cfg.ep * (ep_rank + 1);
  // Engram rows: shard over the ranks that share tokens when asked to, or by default when the
  // ranks span hosts (MPI); ranks on one host share the page cache of one mapping instead.
  const bool shard = cfg.engram_sharding == "on" ||
                     (cfg.engram_sharding == "auto" && world.backend() == ranks::Backend::kMpi);
  if (shard && g > 1) L.model.engram = L.replica.get();
  return L;
}

void fields(auto& io, ranks::FieldsOf<SchedSeq> auto& q) {
  io(q.seq_id, q.slot, q.start_pos, q.tokens, q.n_padding, q.reset_blocks, q.new_blocks, q.sample,
     q.decode, q.restore, q.n_drafts, q.backup, q.rollback, q.saves);
}

std::vector<uint8_t> encode_sched_output(const SchedOutput& out) {
  ranks::Writer w;
  w(out.seqs, out.released);
  return w.take();
}

SchedOutput decode_sched_output(std::span<const uint8_t> bytes) {
  ranks::Reader r(bytes, "step message");
  SchedOutput out;
  r(out.seqs, out.released);
  r.expect_end();
  return out;
}

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
  return &execute(out);
}

const std::vector<float>& ModelRunner::execute(const SchedOutput& out) {
  {
    DI_REGION("engine.prepare");
    for (uint64_t id : out.released) tables_.erase(id);
    batch_.tokens.clear();
    batch_.seqs.clear();
    batch_.saves.clear();
    batch_.image_embeds.clear();
    const bool images = std::any_of(out.seqs.begin(), out.seqs.end(),
                                    [](const SchedSeq& q) { return q.image_at != nullptr; });
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
      if (images) {  // the rows' embeddings of image spans (drafts and padding are text)
        for (int64_t i = 0, p = q.start_pos; i < real; ++i, ++p)
          batch_.image_embeds.push_back(
              q.image_at && p < q.image_len && i < real - q.n_drafts ? q.image_at[p] : nullptr);
        batch_.image_embeds.insert(batch_.image_embeds.end(), size_t(q.n_padding), nullptr);
      }
    }
  }
  logits_.resize(size_t(batch_.n_logit_rows() * model_.config().vocab_size));
  {
    DI_REGION("engine.forward");
    if (!batch_.seqs.empty() || empty_steps_) model_.forward(batch_, kv_, logits_.data());
  }
  return logits_;
}

}  // namespace deepinfer
