#include "ranks/shm_world.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "ranks/launch.h"
#include "ranks/shm_group.h"

namespace deepinfer::ranks {

namespace {

// --- step channel ---
// Pieces go through two buffers, numbered by a running count p: piece p lives in buffer p % 2,
// and the leader may overwrite it once every follower has read piece p - 2. So the leader runs
// up to one piece ahead of the slowest follower, and a message that fits in one piece costs the
// leader no wait when the followers keep up.

class ShmChannel final : public StepChannel {
 public:
  explicit ShmChannel(std::shared_ptr<ShmState> state)
      : state_(std::move(state)),
        ch_(state_->segment.channel()),
        piece_bytes_(state_->segment.header()->piece_bytes) {}

  void send(std::span<const uint8_t> msg) override { publish(msg, shm::kData); }
  void send_shutdown() override {
    if (!shut_down_) publish({}, shm::kShutdown);
    shut_down_ = true;
  }
  bool receive(std::vector<uint8_t>& msg) override;
  bool shut_down() const { return shut_down_; }

 private:
  void publish(std::span<const uint8_t> msg, uint32_t kind);

  std::shared_ptr<ShmState> state_;
  shm::ChannelArea* ch_;
  uint64_t piece_bytes_;
  uint64_t pieces_ = 0;  // sent (leader) or read (follower)
  bool shut_down_ = false;
};

void ShmChannel::publish(std::span<const uint8_t> msg, uint32_t kind) {
  DI_REQUIRE(state_->world_rank == 0, "the step channel sends from the leader only (rank ",
             state_->world_rank, " tried)");
  DI_REQUIRE(!shut_down_, "the step channel was shut down; nothing can be sent after that");
  // A cheap look before handing over work makes a dead follower show up at the next step even
  // when the channel never has to wait.
  state_->alive.check();
  uint64_t off = 0;
  do {
    const uint64_t p = pieces_;
    if (p >= 2) {
      const uint32_t need = uint32_t(p - 1);
      shm::wait_until(
          ch_->acked,
          [&] {
            for (int r = 1; r < state_->world_size; ++r) {
              const uint32_t got = ch_->consumed[r].pieces.load(std::memory_order_acquire);
              if (int32_t(got - need) < 0) return false;
            }
            return true;
          },
          state_->alive);
    }
    const int buf = int(p & 1);
    const uint64_t len = std::min<uint64_t>(piece_bytes_, msg.size() - off);
    if (len) std::memcpy(state_->segment.piece_data(buf), msg.data() + off, len);
    ch_->piece[buf] = {msg.size(), off, kind, uint32_t(len)};
    off += len;
    pieces_ = p + 1;
    shm::notify(ch_->published);  // its value becomes the number of pieces published
  } while (off < msg.size());
}

bool ShmChannel::receive(std::vector<uint8_t>& msg) {
  DI_REQUIRE(state_->world_rank != 0, "the leader cannot receive on the step channel");
  DI_REQUIRE(!shut_down_, "the step channel was shut down; nothing more will arrive");
  msg.clear();
  for (;;) {
    const uint32_t want = uint32_t(pieces_ + 1);
    shm::wait_until(
        ch_->published,
        [&] { return int32_t(ch_->published.value.load(std::memory_order_acquire) - want) >= 0; },
        state_->alive);
    const int buf = int(pieces_ & 1);
    const shm::PieceHeader h = ch_->piece[buf];
    DI_CHECK(h.offset == msg.size() && h.piece_bytes <= piece_bytes_ &&
                 h.offset + h.piece_bytes <= h.msg_bytes,
             "step channel piece ", pieces_, " out of sequence");
    if (h.kind == shm::kData) {
      if (h.offset == 0) msg.reserve(h.msg_bytes);
      const uint8_t* data = state_->segment.piece_data(buf);
      msg.insert(msg.end(), data, data + h.piece_bytes);
    }
    ++pieces_;
    ch_->consumed[state_->world_rank].pieces.store(uint32_t(pieces_), std::memory_order_release);
    shm::notify(ch_->acked);
    if (h.kind == shm::kShutdown) {
      shut_down_ = true;
      return false;
    }
    if (msg.size() == h.msg_bytes) return true;
  }
}

// --- worlds ---

class ShmWorld final : public World {
 public:
  ShmWorld(std::shared_ptr<ShmState> state, const WorldOptions& options)
      : state_(state),
        group_(state, 0, state->world_rank, state->world_size),
        channel_(state),
        options_(options) {}

  ~ShmWorld() override {
    if (state_->world_rank == 0 && !finished_) state_->alive.kill_children();
  }

  Backend backend() const override { return Backend::kShm; }
  Group& group() override { return group_; }
  StepChannel& channel() override { return channel_; }
  std::vector<int> local_pids() const override { return state_->pids; }
  std::string dead_rank() override { return state_->alive.poll(); }

  void finish() override {
    if (finished_) return;
    if (state_->world_rank != 0) {
      if (!channel_.shut_down()) await_shutdown(channel_);
      finished_ = true;
      return;
    }
    channel_.send_shutdown();
    finished_ = true;
    state_->alive.reap_children(options_.exit_timeout_s);
  }

 private:
  std::shared_ptr<ShmState> state_;
  ShmGroup group_;
  ShmChannel channel_;
  WorldOptions options_;
  bool finished_ = false;
};

shm::Segment create_segment(const WorldOptions& o) {
  remove_stale_segments();
  std::string name = new_segment_name();
  // A name left by an earlier process with this pid is skipped; the next number is free.
  while (access(str_cat("/dev/shm", name).c_str(), F_OK) == 0) name = new_segment_name();
  // Armed before the name exists, so that no signal finds it unguarded.
  if (o.handle_signals) arm_signal_cleanup(name);
  try {
    return shm::Segment::create(name, o.world_size, o.shm_slot_bytes, o.channel_piece_bytes,
                                uint64_t(std::max(o.shm_max_groups, 0)));
  } catch (...) {
    disarm_signal_cleanup();
    throw;
  }
}

}  // namespace

std::unique_ptr<World> make_shm_leader(const WorldOptions& options) {
  auto state = std::make_shared<ShmState>();
  state->segment = create_segment(options);
  state->world_rank = 0;
  state->world_size = options.world_size;
  shm::Header* h = state->segment.header();
  h->pids[0] = int32_t(getpid());

  try {
    state->pids = spawn_followers(options.world_size, state->segment.name());
    state->alive.watch_children(state->pids);
    state->alive.share_first_dead(&h->first_dead);
    const uint64_t deadline = shm::now_us() + uint64_t(options.join_timeout_s * 1e6);
    const uint32_t followers = uint32_t(options.world_size - 1);
    while (h->joined.value.load(std::memory_order_acquire) < followers) {
      state->alive.check();
      if (shm::now_us() > deadline) {
        throw Error(str_cat("only ", h->joined.value.load(), " of ", followers,
                            " follower ranks joined within ", options.join_timeout_s, " s"));
      }
      shm::futex_sleep(h->joined, h->joined.value.load());
    }
    for (int r = 1; r < options.world_size; ++r) {
      DI_REQUIRE(h->pids[r] == state->pids[size_t(r)], "rank ", r, " of segment ",
                 state->segment.name(), " was joined by pid ", h->pids[r], ", not by pid ",
                 state->pids[size_t(r)], " that was started for it");
    }
  } catch (...) {
    state->alive.kill_children();
    disarm_signal_cleanup();
    throw;
  }
  // Everyone has it mapped: without a name, nothing is left behind however the run ends.
  state->segment.unlink_name();
  disarm_signal_cleanup();
  h->started.value.store(1, std::memory_order_release);
  shm::notify(h->started);
  return std::make_unique<ShmWorld>(state, options);
}

std::unique_ptr<World> make_shm_follower(const WorldOptions& options, int rank, int world_size,
                                         const std::string& shm_name) {
  auto state = std::make_shared<ShmState>();
  state->segment = shm::Segment::attach(shm_name, world_size);
  state->world_rank = rank;
  state->world_size = world_size;
  shm::Header* h = state->segment.header();
  const int leader = h->pids[0];
  DI_REQUIRE(getppid() == leader, kEnvLocalRank, "=", rank, " is set but this process (pid ",
             getpid(), ") was not started by the leader (pid ", leader, ") of ", shm_name);
  DI_REQUIRE(h->pids[rank] == 0, kEnvLocalRank, "=", rank, ": rank ", rank, " of ", shm_name,
             " was already joined by pid ", h->pids[rank]);
  h->pids[rank] = int32_t(getpid());
  std::vector<int> pids(static_cast<size_t>(world_size), 0);
  pids[0] = leader;
  state->alive.watch_peers(pids, rank);
  state->alive.share_first_dead(&h->first_dead);
  shm::notify(h->joined);  // its value counts the followers that joined
  shm::wait_until(
      h->started, [&] { return h->started.value.load(std::memory_order_acquire) != 0; },
      state->alive);
  for (int r = 0; r < world_size; ++r) pids[size_t(r)] = h->pids[r];
  state->pids = pids;
  state->alive.watch_peers(pids, rank);
  return std::make_unique<ShmWorld>(state, options);
}

}  // namespace deepinfer::ranks
