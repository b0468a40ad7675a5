#include "engine/parallel.h"

#include "core/error.h"
#include "ranks/serial.h"

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
  cfg.validate(n_experts);
  DI_REQUIRE(world.size() == cfg.world_size(), "the run has ", world.size(),
             " ranks but --dp/--cp/--ep ask for ", cfg.world_size());
  RankLayout L;
  L.cfg = cfg;
  L.world_rank = world.rank();
  const int g = cfg.replica_size();
  L.dp_rank = L.world_rank / g;
  L.replica_rank = L.world_rank % g;
  L.scheduler = L.replica_rank == 0;
  // Every member calls split in the same order: replica groups, then the dp group.
  L.replica = world.group().split(L.dp_rank, L.replica_rank);
  L.dp = world.group().split(L.replica_rank == 0 ? 0 : -1, L.dp_rank);
  if (cfg.dp == 1) {
    L.channel = g > 1 ? &world.channel() : nullptr;
    if (cfg.cp > 1) L.model.context = cp_shard(*L.replica);
    if (cfg.ep > 1) L.model.experts = static_moe(*L.replica);
  } else if (cfg.ep > 1) {
    L.model.experts = ep_dispatch(world.group());
  }
  const int ep_size = cfg.ep, ep_rank = cfg.ep == 1 ? 0 : cfg.dp == 1 ? L.replica_rank : L.dp_rank;
  L.expert_begin = n_experts / ep_size * ep_rank;
  L.expert_end = n_experts / ep_size * (ep_rank + 1);
  // Engram rows: shard over the ranks that share tokens when asked to, or by default when the
  // ranks span hosts (MPI); ranks on one host share the page cache of one mapping instead.
  const bool shard = cfg.engram_sharding == "on" ||
                     (cfg.engram_sharding == "auto" && world.backend() == ranks::Backend::kMpi);
  if (shard && g > 1) L.model.engram = L.replica.get();
  return L;
}

std::vector<uint8_t> encode_sched_output(const SchedOutput& out) {
  ranks::Writer w;
  w.put<uint64_t>(out.seqs.size());
  for (const SchedSeq& q : out.seqs) {
    w.put<uint64_t>(q.seq_id);
    w.put<int32_t>(q.slot);
    w.put<int64_t>(q.start_pos);
    w.put_vector(q.tokens);
    w.put<int64_t>(q.n_padding);
    w.put<uint8_t>(q.reset_blocks);
    w.put_vector(q.new_blocks);
    w.put<uint8_t>(q.sample);
    w.put<uint8_t>(q.decode);
    w.put<int32_t>(q.restore);
    w.put<int32_t>(q.n_drafts);
    w.put<uint8_t>(q.backup);
    w.put<uint8_t>(q.rollback);
    w.put_vector(q.saves);
  }
  w.put_vector(out.released);
  return w.take();
}

SchedOutput decode_sched_output(std::span<const uint8_t> bytes) {
  ranks::Reader r(bytes, "step message");
  SchedOutput out;
  const uint64_t n = r.get<uint64_t>();
  DI_REQUIRE(n <= r.remaining(), "step message: ", n, " sequences in ", r.remaining(), " bytes");
  for (uint64_t i = 0; i < n; ++i) {
    SchedSeq q;
    q.seq_id = r.get<uint64_t>();
    q.slot = r.get<int32_t>();
    q.start_pos = r.get<int64_t>();
    q.tokens = r.get_vector<int32_t>();
    q.n_padding = r.get<int64_t>();
    q.reset_blocks = r.get<uint8_t>();
    q.new_blocks = r.get_vector<int32_t>();
    q.sample = r.get<uint8_t>();
    q.decode = r.get<uint8_t>();
    q.restore = r.get<int32_t>();
    q.n_drafts = r.get<int32_t>();
    q.backup = r.get<uint8_t>();
    q.rollback = r.get<uint8_t>();
    q.saves = r.get_vector<SchedSeq::Save>();
    out.seqs.push_back(std::move(q));
  }
  out.released = r.get_vector<uint64_t>();
  r.expect_end();
  return out;
}

}  // namespace deepinfer
