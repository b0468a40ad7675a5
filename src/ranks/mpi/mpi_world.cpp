#include "ranks/mpi/mpi_world.h"

// Only the C API: the C++ bindings are deprecated and live in a library we do not link.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace deepinfer::ranks {

namespace {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(str_cat(what, " failed: ", std::string(text, size_t(len))));
}

bool mpi_finalized() {
  int done = 0;
  MPI_Finalized(&done);
  return done != 0;
}

// MPI counts are ints; larger buffers go in pieces of this many bytes.
constexpr size_t kMaxBytes = size_t(1) << 30;
// Floats per round of a sum: bounds the scratch memory.
constexpr size_t kSumChunk = size_t(1) << 20;

// The fixed-order sum is done here, not by MPI_Allreduce, whose order MPI leaves open: each rank
// sums its share of the elements over all ranks in rank order and the shares are gathered.
class MpiGroup final : public Group {
 public:
  explicit MpiGroup(MPI_Comm comm) : comm_(comm) {
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    counts_.resize(static_cast<size_t>(size_));
    displs_.resize(static_cast<size_t>(size_));
    parts_.resize(static_cast<size_t>(size_));
  }
  ~MpiGroup() override {
    if (!mpi_finalized()) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void broadcast(void* data, size_t n_bytes, int root) override {
    DI_REQUIRE(root >= 0 && root < size_, "broadcast: root ", root, " is outside the group of ",
               size_);
    auto* p = static_cast<uint8_t*>(data);
    for (size_t off = 0; off < n_bytes; off += kMaxBytes) {
      const int len = int(std::min(kMaxBytes, n_bytes - off));
      check(MPI_Bcast(p + off, len, MPI_BYTE, root, comm_), "MPI_Bcast");
    }
  }

  using Group::all_reduce;
  void all_reduce(float* data, size_t n) override {
    if (size_ == 1) return;
    for (size_t off = 0; off < n; off += kSumChunk) {
      const size_t len = std::min(kSumChunk, n - off);
      share(len);
      const int mine = counts_[size_t(rank_)];
      scratch_.resize(size_t(size_) * size_t(mine));
      // recv: [size_, mine], my share of the chunk from every rank
      std::vector<int> rcounts(size_t(size_), mine), rdispls(static_cast<size_t>(size_));
      for (int r = 0; r < size_; ++r) rdispls[size_t(r)] = r * mine;
      check(MPI_Alltoallv(data + off, counts_.data(), displs_.data(), MPI_FLOAT, scratch_.data(),
                          rcounts.data(), rdispls.data(), MPI_FLOAT, comm_),
            "MPI_Alltoallv");
      for (int r = 0; r < size_; ++r)
        parts_[size_t(r)] = scratch_.data() + size_t(r) * size_t(mine);
      sum_in_rank_order(parts_.data(), size_, size_t(mine), data + off + displs_[size_t(rank_)]);
      check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data + off, counts_.data(),
                           displs_.data(), MPI_FLOAT, comm_),
            "MPI_Allgatherv");
    }
  }

  void all_gather(const void* in, size_t n_bytes_each, void* out) override {
    const auto* src = static_cast<const uint8_t*>(in);
    auto* dst = static_cast<uint8_t*>(out);
    const size_t step = std::max<size_t>(1, kMaxBytes / size_t(size_));
    if (n_bytes_each <= step) {
      const void* send = (in == dst + size_t(rank_) * n_bytes_each) ? MPI_IN_PLACE : in;
      check(
          MPI_Allgather(send, int(n_bytes_each), MPI_BYTE, out, int(n_bytes_each), MPI_BYTE, comm_),
          "MPI_Allgather");
      return;
    }
    std::vector<uint8_t> tmp;  // [size_, len]
    for (size_t off = 0; off < n_bytes_each; off += step) {
      const size_t len = std::min(step, n_bytes_each - off);
      tmp.resize(size_t(size_) * len);
      check(MPI_Allgather(src + off, int(len), MPI_BYTE, tmp.data(), int(len), MPI_BYTE, comm_),
            "MPI_Allgather");
      for (int r = 0; r < size_; ++r)
        std::memcpy(dst + size_t(r) * n_bytes_each + off, tmp.data() + size_t(r) * len, len);
    }
  }

  void reduce_scatter(const float* in, size_t n_per_rank, float* out) override {
    if (size_ == 1) {
      if (n_per_rank && in != out) std::memmove(out, in, n_per_rank * sizeof(float));
      return;
    }
    const size_t chunk = std::max<size_t>(1, kSumChunk / size_t(size_));
    std::vector<float> send;  // [size_, len]: slice `off` of every destination's part
    for (size_t off = 0; off < n_per_rank; off += chunk) {
      const size_t len = std::min(chunk, n_per_rank - off);
      send.resize(size_t(size_) * len);
      scratch_.resize(size_t(size_) * len);
      for (int d = 0; d < size_; ++d)
        std::memcpy(send.data() + size_t(d) * len, in + size_t(d) * n_per_rank + off,
                    len * sizeof(float));
      check(MPI_Alltoall(send.data(), int(len), MPI_FLOAT, scratch_.data(), int(len), MPI_FLOAT,
                         comm_),
            "MPI_Alltoall");
      for (int r = 0; r < size_; ++r) parts_[size_t(r)] = scratch_.data() + size_t(r) * len;
      sum_in_rank_order(parts_.data(), size_, len, out + off);
    }
  }

  void barrier() override { check(MPI_Barrier(comm_), "MPI_Barrier"); }

  std::vector<std::vector<uint8_t>> all_gather_v(std::span<const uint8_t> mine) override {
    const uint64_t my_len = mine.size();
    std::vector<uint64_t> lens(static_cast<size_t>(size_));
    check(MPI_Allgather(&my_len, 1, MPI_UINT64_T, lens.data(), 1, MPI_UINT64_T, comm_),
          "MPI_Allgather");
    std::vector<std::vector<uint8_t>> all(static_cast<size_t>(size_));
    uint64_t longest = 0;
    for (int r = 0; r < size_; ++r) {
      all[size_t(r)].resize(lens[size_t(r)]);
      longest = std::max(longest, lens[size_t(r)]);
    }
    // Rounds of at most `step` bytes per rank keep every count and displacement an int.
    const uint64_t step = std::max<size_t>(1, kMaxBytes / size_t(size_));
    std::vector<uint8_t> flat;
    for (uint64_t off = 0; off < longest; off += step) {
      int total = 0;
      for (int r = 0; r < size_; ++r) {
        const uint64_t len = lens[size_t(r)];
        counts_[size_t(r)] = off < len ? int(std::min(step, len - off)) : 0;
        displs_[size_t(r)] = total;
        total += counts_[size_t(r)];
      }
      flat.resize(size_t(total));
      check(MPI_Allgatherv(mine.data() + std::min<uint64_t>(off, my_len), counts_[size_t(rank_)],
                           MPI_BYTE, flat.data(), counts_.data(), displs_.data(), MPI_BYTE, comm_),
            "MPI_Allgatherv");
      for (int r = 0; r < size_; ++r) {
        if (counts_[size_t(r)] == 0) continue;  // ended in an earlier round (or empty)
        std::memcpy(all[size_t(r)].data() + off, flat.data() + displs_[size_t(r)],
                    size_t(counts_[size_t(r)]));
      }
    }
    return all;
  }

  std::unique_ptr<Group> split(int color, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub), "MPI_Comm_split");
    if (sub == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiGroup>(sub);
  }

 private:
  // Splits `n` elements into near-equal shares by rank: counts_ and displs_.
  void share(size_t n) {
    int at = 0;
    for (int r = 0; r < size_; ++r) {
      counts_[size_t(r)] = int(n / size_t(size_) + (size_t(r) < n % size_t(size_) ? 1 : 0));
      displs_[size_t(r)] = at;
      at += counts_[size_t(r)];
    }
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::vector<int> counts_, displs_;  // [size_]
  std::vector<float> scratch_;
  std::vector<const float*> parts_;  // [size_]
};

// The channel is a broadcast from rank 0 on a communicator of its own, so its messages never
// interleave with the collectives of the step. Followers wait for the header with a
// non-blocking broadcast they poll and sleep on, instead of spinning in MPI between steps.
class MpiChannel final : public StepChannel {
 public:
  explicit MpiChannel(MPI_Comm comm) : comm_(comm) {
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  }
  ~MpiChannel() override {
    if (!mpi_finalized()) MPI_Comm_free(&comm_);
  }

  void send(std::span<const uint8_t> msg) override {
    DI_REQUIRE(rank_ == 0, "the step channel sends from the leader only (rank ", rank_, " tried)");
    DI_REQUIRE(!shut_down_, "the step channel was shut down; nothing can be sent after that");
    uint64_t head[2] = {kData, msg.size()};
    header(head);
    for (size_t off = 0; off < msg.size(); off += kMaxBytes) {
      const int len = int(std::min(kMaxBytes, msg.size() - off));
      check(MPI_Bcast(const_cast<uint8_t*>(msg.data()) + off, len, MPI_BYTE, 0, comm_),
            "MPI_Bcast");
    }
  }
  void send_shutdown() override {
    DI_REQUIRE(rank_ == 0, "the step channel sends from the leader only (rank ", rank_, " tried)");
    if (shut_down_) return;
    uint64_t head[2] = {kShutdown, 0};
    header(head);
    shut_down_ = true;
  }
  bool receive(std::vector<uint8_t>& msg) override {
    DI_REQUIRE(rank_ != 0, "the leader cannot receive on the step channel");
    DI_REQUIRE(!shut_down_, "the step channel was shut down; nothing more will arrive");
    uint64_t head[2] = {0, 0};
    header(head);
    if (head[0] == kShutdown) {
      shut_down_ = true;
      msg.clear();
      return false;
    }
    DI_CHECK(head[0] == kData, "step channel header kind ", head[0]);
    msg.resize(head[1]);
    for (size_t off = 0; off < msg.size(); off += kMaxBytes) {
      const int len = int(std::min(kMaxBytes, msg.size() - off));
      check(MPI_Bcast(msg.data() + off, len, MPI_BYTE, 0, comm_), "MPI_Bcast");
    }
    return true;
  }
  bool shut_down() const { return shut_down_; }

 private:
  static constexpr uint64_t kData = 1, kShutdown = 2;

  void header(uint64_t* head /* [2] */) {
    MPI_Request req;
    check(MPI_Ibcast(head, 2, MPI_UINT64_T, 0, comm_, &req), "MPI_Ibcast");
    auto sleep = std::chrono::microseconds(0);
    for (;;) {
      int done = 0;
      check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) return;
      if (sleep.count()) std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep + std::chrono::microseconds(20), std::chrono::microseconds(1000));
    }
  }

  MPI_Comm comm_;
  int rank_ = 0;
  bool shut_down_ = false;
};

class MpiWorld final : public World {
 public:
  explicit MpiWorld(const WorldOptions& options) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
      owns_mpi_ = true;
    }
    MPI_Comm world = MPI_COMM_NULL, chan = MPI_COMM_NULL;
    check(MPI_Comm_dup(MPI_COMM_WORLD, &world), "MPI_Comm_dup");
    // Errors come back as codes and become deepinfer::Error instead of aborting the job here.
    MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN);
    check(MPI_Comm_dup(world, &chan), "MPI_Comm_dup");
    group_ = std::make_unique<MpiGroup>(world);
    channel_ = std::make_unique<MpiChannel>(chan);
    DI_REQUIRE(options.world_size == 0 || options.world_size == group_->size(), "mpirun started ",
               group_->size(), " ranks but this run asks for ", options.world_size);
  }
  // MPI_Finalize waits for every rank; after an error the others may never get there, so an
  // unclean end leaves MPI alone: the process exits and mpirun ends the whole job.
  ~MpiWorld() override {
    const bool clean = finished_ || channel_->shut_down();
    if (!clean || mpi_finalized()) {
      (void)group_.release();
      (void)channel_.release();
      return;
    }
    channel_.reset();
    group_.reset();
    if (owns_mpi_) MPI_Finalize();
  }

  Backend backend() const override { return Backend::kMpi; }
  Group& group() override { return *group_; }
  StepChannel& channel() override { return *channel_; }
  void finish() override {
    if (finished_) return;
    if (group_->rank() == 0) {
      channel_->send_shutdown();
    } else if (!channel_->shut_down()) {
      await_shutdown(*channel_);
    }
    finished_ = true;
  }
  std::vector<int> local_pids() const override {
    std::vector<int> pids(size_t(group_->size()), 0);
    pids[size_t(group_->rank())] = int(getpid());
    return pids;
  }

 private:
  std::unique_ptr<MpiGroup> group_;
  std::unique_ptr<MpiChannel> channel_;
  bool owns_mpi_ = false;
  bool finished_ = false;
};

}  // namespace

std::unique_ptr<World> make_mpi_world(const WorldOptions& options) {
  return std::make_unique<MpiWorld>(options);
}

}  // namespace deepinfer::ranks
