// The MPI world: one rank per process under mpirun, on any number of hosts. Compiled only when
// CMake finds MPI; mpi.h stays inside this folder.

// Only the C API: the C++ bindings are deprecated and live in a library we do not link.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "ranks/launch.h"

namespace deepinfer::ranks {

namespace {

using namespace std::chrono_literals;

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

// The fixed-order sum is done here, not by MPI_Allreduce or MPI_Reduce_scatter, whose order MPI
// leaves open: each rank sums its share of the elements over all ranks in rank order, and an
// all-reduce gathers the shares.
class MpiGroup final : public Group {
 public:
  explicit MpiGroup(MPI_Comm comm) : comm_(comm) {
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }
  ~MpiGroup() override {
    if (!mpi_finalized()) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void broadcast(void* data, size_t n_bytes, int root) override {
    check_root(root);
    auto* p = static_cast<uint8_t*>(data);
    for (size_t off = 0; off < n_bytes; off += kMaxBytes) {
      const int len = int(std::min(kMaxBytes, n_bytes - off));
      check(MPI_Bcast(p + off, len, MPI_BYTE, root, comm_), "MPI_Bcast");
    }
  }

  void all_reduce(float* data, size_t n) override {
    const size_t share = (n + size_t(size_) - 1) / size_t(size_);
    padded_.assign(share * size_t(size_), 0.0f);
    mine_.resize(share);
    std::copy(data, data + n, padded_.begin());
    reduce_scatter(padded_.data(), share, mine_.data());
    all_gather(mine_.data(), share * sizeof(float), padded_.data());
    std::copy(padded_.begin(), padded_.begin() + ptrdiff_t(n), data);
  }

  void reduce_scatter(const float* in, size_t n_per_rank, float* out) override {
    const size_t chunk = std::max<size_t>(1, kSumChunk / size_t(size_));
    // [size_, len]: slice `off` of every destination's part, and of my part from every rank
    parts_.resize(size_t(size_));
    for (size_t off = 0; off < n_per_rank; off += chunk) {
      const size_t len = std::min(chunk, n_per_rank - off);
      send_.resize(size_t(size_) * len);
      recv_.resize(send_.size());
      for (size_t d = 0; d < size_t(size_); ++d) {
        std::memcpy(send_.data() + d * len, in + d * n_per_rank + off, len * sizeof(float));
        parts_[d] = recv_.data() + d * len;
      }
      check(
          MPI_Alltoall(send_.data(), int(len), MPI_FLOAT, recv_.data(), int(len), MPI_FLOAT, comm_),
          "MPI_Alltoall");
      sum_in_rank_order(parts_.data(), size_, len, out + off);
    }
  }

  void all_gather(const void* in, size_t n_bytes_each, void* out) override {
    auto* mine = static_cast<uint8_t*>(out) + size_t(rank_) * n_bytes_each;
    if (n_bytes_each > kMaxBytes / size_t(size_)) {
      // Too large for int counts in one call: each rank broadcasts its block, in pieces.
      std::memmove(mine, in, n_bytes_each);
      for (int r = 0; r < size_; ++r)
        broadcast(static_cast<uint8_t*>(out) + size_t(r) * n_bytes_each, n_bytes_each, r);
      return;
    }
    check(MPI_Allgather(in == mine ? MPI_IN_PLACE : in, int(n_bytes_each), MPI_BYTE, out,
                        int(n_bytes_each), MPI_BYTE, comm_),
          "MPI_Allgather");
  }

  void barrier() override { check(MPI_Barrier(comm_), "MPI_Barrier"); }

  std::unique_ptr<Group> split(int color, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub), "MPI_Comm_split");
    if (sub == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiGroup>(sub);
  }

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  // Scratch of the sums, kept across calls (they run every step).
  std::vector<float> padded_, mine_, send_, recv_;
  std::vector<const float*> parts_;
};

// Followers wait for the header with a non-blocking broadcast they poll and sleep on, instead of
// spinning in MPI between steps.
class MpiChannel final : public StepChannel {
 public:
  explicit MpiChannel(MPI_Comm comm) : StepChannel(std::make_unique<MpiGroup>(comm)), comm_(comm) {}

 private:
  void header(uint64_t* head) override {
    MPI_Request req;
    check(MPI_Ibcast(head, 2, MPI_UINT64_T, 0, comm_, &req), "MPI_Ibcast");
    for (auto sleep = 0us;; sleep = std::min(sleep + 20us, 1000us)) {
      int done = 0;
      check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) return;
      std::this_thread::sleep_for(sleep);  // returns at once for 0
    }
  }

  MPI_Comm comm_;  // owned by the group
};

class MpiWorld final : public World {
 public:
  explicit MpiWorld(const WorldOptions& options) : World(Backend::kMpi) {
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
  // unclean end (no shutdown message sent or received) leaves MPI alone: the process exits and
  // mpirun ends the whole job.
  ~MpiWorld() override {
    if (!channel_->shut_down() || mpi_finalized()) {
      (void)group_.release();
      (void)channel_.release();
      return;
    }
    channel_.reset();
    group_.reset();
    if (owns_mpi_) MPI_Finalize();
  }

 private:
  bool owns_mpi_ = false;
};

}  // namespace

std::unique_ptr<World> make_mpi_world(const WorldOptions& options) {
  return std::make_unique<MpiWorld>(options);
}

}  // namespace deepinfer::ranks
