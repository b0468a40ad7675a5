// Groups (group.h) and the world (world.h).
#include "ranks/world.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>

#include "core/error.h"
#include "ranks/launch.h"

namespace deepinfer::ranks {

void sum_in_rank_order(const float* const* parts, int n_parts, size_t n, float* out) {
  DI_CHECK(n_parts >= 1);
  // Blocks keep the running sums in registers or L1 while each part streams through once, and
  // reading a whole block before writing it lets `out` be one of the parts.
  constexpr size_t kBlock = 256;
  float acc[kBlock];
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t m = std::min(kBlock, n - b);
    std::memcpy(acc, parts[0] + b, m * sizeof(float));
    for (int r = 1; r < n_parts; ++r) {
      const float* p = parts[r] + b;
      for (size_t j = 0; j < m; ++j) acc[j] += p[j];
    }
    std::memcpy(out + b, acc, m * sizeof(float));
  }
}

void Group::check_root(int root) const {
  DI_REQUIRE(root >= 0 && root < size(), "broadcast: root ", root, " is outside the group of ",
             size());
}

std::vector<std::vector<uint8_t>> Group::all_gather_v(std::span<const uint8_t> mine) {
  const uint64_t my_len = mine.size();
  std::vector<uint64_t> lens(static_cast<size_t>(size()));
  all_gather(&my_len, sizeof my_len, lens.data());
  // Every message padded to the longest, so that one all_gather moves them all.
  const uint64_t longest = *std::max_element(lens.begin(), lens.end());
  std::vector<uint8_t> padded(longest), flat(size_t(size()) * longest);
  std::copy(mine.begin(), mine.end(), padded.begin());
  all_gather(padded.data(), longest, flat.data());
  std::vector<std::vector<uint8_t>> all;
  for (size_t r = 0; r < lens.size(); ++r)
    all.emplace_back(flat.data() + r * longest, flat.data() + r * longest + lens[r]);
  return all;
}

const char* backend_name(Backend b) {
  static const char* const kNames[] = {"single", "shm", "mpi"};
  return size_t(b) < std::size(kNames) ? kNames[size_t(b)] : "?";
}

namespace {

class SingleGroup final : public Group {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void broadcast(void*, size_t, int root) override { check_root(root); }
  void all_reduce(float*, size_t) override {}
  void all_gather(const void* in, size_t n_bytes_each, void* out) override {
    if (n_bytes_each && in != out) std::memmove(out, in, n_bytes_each);
  }
  void reduce_scatter(const float* in, size_t n_per_rank, float* out) override {
    all_gather(in, n_per_rank * sizeof(float), out);
  }
  void barrier() override {}
  std::unique_ptr<Group> split(int color, int) override {
    return color < 0 ? nullptr : make_single_group();
  }
};

constexpr uint64_t kData = 1, kShutdown = 2;

// The value of an environment variable that must hold an integer in [lo, hi].
int env_int(const char* name, int lo, int hi) {
  const char* v = std::getenv(name);
  DI_REQUIRE(v && *v, name, " is not set; a spawned rank needs ", kEnvLocalRank, ", ",
             kEnvWorldSize, " and ", kEnvShmName);
  errno = 0;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  DI_REQUIRE(errno == 0 && *end == '\0' && x >= lo && x <= hi, name, "=\"", v,
             "\" is not an integer in [", lo, ", ", hi, "]");
  return int(x);
}

}  // namespace

std::unique_ptr<Group> make_single_group() {
  return std::make_unique<SingleGroup>();
}

void StepChannel::send(std::span<const uint8_t> msg) {
  DI_REQUIRE(group_->rank() == 0, "the step channel sends from the leader only (rank ",
             group_->rank(), " tried)");
  DI_REQUIRE(!shut_down_, "the step channel was shut down; nothing can be sent after that");
  uint64_t head[2] = {kData, msg.size()};
  header(head);
  group_->broadcast(const_cast<uint8_t*>(msg.data()), msg.size(), 0);  // the root only reads
}

bool StepChannel::receive(std::vector<uint8_t>& msg) {
  DI_REQUIRE(group_->rank() != 0, "the leader cannot receive on the step channel");
  DI_REQUIRE(!shut_down_, "the step channel was shut down; nothing more will arrive");
  uint64_t head[2] = {0, 0};
  header(head);
  msg.clear();
  if (head[0] == kShutdown) {
    shut_down_ = true;
    return false;
  }
  DI_CHECK(head[0] == kData, "step channel header kind ", head[0]);
  msg.resize(head[1]);
  group_->broadcast(msg.data(), msg.size(), 0);
  return true;
}

void StepChannel::finish() {
  if (group_->rank() == 0) {
    uint64_t head[2] = {kShutdown, 0};
    if (!shut_down_) header(head);
    shut_down_ = true;
    return;
  }
  std::vector<uint8_t> msg;
  DI_REQUIRE(shut_down_ || !receive(msg),
             "the run ended on a follower while the leader still sent a ", msg.size(),
             "-byte step message; the shutdown message was expected");
}

std::unique_ptr<World> init_world(const WorldOptions& options) {
  DI_REQUIRE(options.world_size >= 0, "world size ", options.world_size, " must be >= 0");
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("OMPI_COMM_WORLD_RANK")) {
#ifdef DEEPINFER_RANKS_HAVE_MPI  // defined by CMake when MPI was found
    return make_mpi_world(options);
#else
    throw Error(
        "running under mpirun (OMPI_COMM_WORLD_SIZE is set) but this build has no MPI backend "
        "(configure with libopenmpi-dev installed)");
#endif
  }
  if (std::getenv(kEnvLocalRank)) {
    const int world_size = env_int(kEnvWorldSize, 2, INT_MAX);
    const int rank = env_int(kEnvLocalRank, 1, world_size - 1);
    const char* name = std::getenv(kEnvShmName);
    DI_REQUIRE(name && name[0] == '/', kEnvShmName,
               " must name a shared-memory segment (\"/...\"), got \"", name ? name : "", "\"");
    DI_REQUIRE(options.world_size == 0 || options.world_size == world_size, kEnvWorldSize, "=",
               world_size, " but this run asks for ", options.world_size, " ranks");
    return make_shm_follower(options, rank, world_size, name);
  }
  if (options.world_size > 1) return make_shm_leader(options);
  return std::make_unique<World>(Backend::kSingle, make_single_group(),
                                 std::make_unique<StepChannel>(make_single_group()));
}

}  // namespace deepinfer::ranks
