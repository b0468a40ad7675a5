#include "ranks/shm_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <new>

#include "core/error.h"

namespace deepinfer::ranks::shm {

namespace {

uint64_t round64(uint64_t n) {
  return (n + 63) / 64 * 64;
}

// Sizes come from options a user may set, so the products are checked before they wrap.
uint64_t checked_mul(uint64_t a, uint64_t b, const char* what) {
  DI_REQUIRE(b == 0 || a <= UINT64_MAX / b, "shared-memory segment: ", what, " overflows");
  return a * b;
}

}  // namespace

Layout compute_layout(int world_size, uint64_t slot_bytes, uint64_t piece_bytes,
                      uint64_t max_groups) {
  Layout l;
  l.groups_offset = round64(sizeof(Header));
  const uint64_t slots =
      checked_mul(checked_mul(uint64_t(world_size), 2, "slots"), round64(slot_bytes), "slots");
  l.group_stride = round64(sizeof(GroupArea)) + slots;
  l.channel_offset = l.groups_offset + checked_mul(max_groups, l.group_stride, "group areas");
  l.channel_data_offset = l.channel_offset + round64(sizeof(ChannelArea));
  l.total_bytes = l.channel_data_offset + checked_mul(2, round64(piece_bytes), "channel");
  return l;
}

Segment Segment::create(const std::string& name, int world_size, uint64_t slot_bytes,
                        uint64_t piece_bytes, uint64_t max_groups) {
  DI_REQUIRE(world_size >= 1 && world_size <= kMaxRanks, "shared-memory world size ", world_size,
             " is outside [1, ", kMaxRanks, "]");
  DI_REQUIRE(slot_bytes >= 64 * uint64_t(world_size) && slot_bytes % 64 == 0, "shm slot size ",
             slot_bytes, " must be a multiple of 64 and at least 64 bytes per rank (",
             64 * world_size, ")");
  DI_REQUIRE(piece_bytes >= 64 && piece_bytes % 64 == 0 && piece_bytes <= UINT32_MAX,
             "channel piece size ", piece_bytes, " must be a multiple of 64 in [64, 4 GiB)");
  DI_REQUIRE(max_groups >= 1 && max_groups <= 4096, "shm group count ", max_groups,
             " is outside [1, 4096]");
  const Layout l = compute_layout(world_size, slot_bytes, piece_bytes, max_groups);

  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  DI_REQUIRE(fd >= 0, "cannot create shared-memory segment ", name, ": ", std::strerror(errno));
  Segment s;
  s.name_ = name;
  s.owner_ = true;
  s.linked_ = true;
  // Reserving the pages now turns a /dev/shm that is too small into an error here instead of a
  // SIGBUS in the middle of a collective.
  int err = ftruncate(fd, off_t(l.total_bytes)) == 0 ? 0 : errno;
  if (err == 0) err = posix_fallocate(fd, 0, off_t(l.total_bytes));
  if (err != 0) {
    close(fd);
    throw Error(str_cat("cannot reserve ", l.total_bytes, " bytes of shared memory for ", name,
                        ": ", std::strerror(err),
                        " (a container may need a larger /dev/shm, e.g. docker --shm-size)"));
  }
  void* p = mmap(nullptr, l.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  err = errno;
  close(fd);
  DI_REQUIRE(p != MAP_FAILED, "cannot map shared-memory segment ", name, ": ", std::strerror(err));
  s.base_ = p;
  s.bytes_ = l.total_bytes;

  Header* h = new (p) Header();
  h->magic = kMagic;
  h->version = kVersion;
  h->world_size = uint32_t(world_size);
  h->total_bytes = l.total_bytes;
  h->slot_bytes = slot_bytes;
  h->piece_bytes = piece_bytes;
  h->max_groups = max_groups;
  h->groups_offset = l.groups_offset;
  h->group_stride = l.group_stride;
  h->channel_offset = l.channel_offset;
  for (uint64_t g = 0; g < max_groups; ++g) new (s.group(g)) GroupArea();
  new (s.channel()) ChannelArea();
  h->next_group.store(1);  // area 0 is the world
  h->first_dead.store(-1);
  return s;
}

Segment Segment::attach(const std::string& name, int world_size) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  DI_REQUIRE(fd >= 0, "DEEPINFER_SHM_NAME=", name,
             ": cannot open the shared-memory segment: ", std::strerror(errno),
             " (it exists only while the leader is starting its ranks)");
  struct stat st {};
  if (fstat(fd, &st) != 0 || uint64_t(st.st_size) < sizeof(Header)) {
    close(fd);
    throw Error(str_cat("DEEPINFER_SHM_NAME=", name, ": the segment is too small to be one"));
  }
  void* p = mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  DI_REQUIRE(p != MAP_FAILED, "DEEPINFER_SHM_NAME=", name, ": cannot map: ", std::strerror(err));
  Segment s;
  s.base_ = p;
  s.bytes_ = size_t(st.st_size);
  s.name_ = name;
  const Header* h = s.header();
  DI_REQUIRE(h->magic == kMagic && h->version == kVersion, "DEEPINFER_SHM_NAME=", name,
             ": not a segment of this DeepInfer version (magic/version mismatch)");
  DI_REQUIRE(h->total_bytes == s.bytes_, "DEEPINFER_SHM_NAME=", name, ": header says ",
             h->total_bytes, " bytes but the segment has ", s.bytes_);
  DI_REQUIRE(int(h->world_size) == world_size, "DEEPINFER_WORLD_SIZE=", world_size,
             " but the segment ", name, " was made for ", h->world_size, " ranks");
  const Layout l = compute_layout(world_size, h->slot_bytes, h->piece_bytes, h->max_groups);
  DI_REQUIRE(l.total_bytes == h->total_bytes && l.group_stride == h->group_stride &&
                 l.channel_offset == h->channel_offset,
             "DEEPINFER_SHM_NAME=", name, ": inconsistent layout in the segment header");
  return s;
}

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    this->~Segment();
    base_ = std::exchange(o.base_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    name_ = std::move(o.name_);
    owner_ = std::exchange(o.owner_, false);
    linked_ = std::exchange(o.linked_, false);
  }
  return *this;
}

Segment::~Segment() {
  unlink_name();
  if (base_) munmap(base_, bytes_);
  base_ = nullptr;
}

void Segment::unlink_name() {
  if (owner_ && linked_) shm_unlink(name_.c_str());
  linked_ = false;
}

GroupArea* Segment::group(uint64_t index) const {
  const Header* h = header();
  DI_CHECK(index < h->max_groups);
  return reinterpret_cast<GroupArea*>(static_cast<uint8_t*>(base_) + h->groups_offset +
                                      index * h->group_stride);
}

uint8_t* Segment::slot(uint64_t group_index, int member, int buffer) const {
  const Header* h = header();
  const uint64_t slot_stride = round64(h->slot_bytes);
  return reinterpret_cast<uint8_t*>(group(group_index)) + round64(sizeof(GroupArea)) +
         (uint64_t(member) * 2 + uint64_t(buffer)) * slot_stride;
}

ChannelArea* Segment::channel() const {
  return reinterpret_cast<ChannelArea*>(static_cast<uint8_t*>(base_) + header()->channel_offset);
}

uint8_t* Segment::piece_data(int which) const {
  const Header* h = header();
  return static_cast<uint8_t*>(base_) + h->channel_offset + round64(sizeof(ChannelArea)) +
         uint64_t(which) * round64(h->piece_bytes);
}

// --- waits ---

void spin_pause(int iteration) {
  // A short spin catches ranks that arrive within microseconds of each other; yielding after
  // that lets a late rank run when there are more ranks than cores.
  if (iteration < 128) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  } else {
    sched_yield();
  }
}

void futex_sleep(Word& w, uint32_t seen) {
  w.sleepers.fetch_add(1, std::memory_order_seq_cst);
  timespec timeout{0, 5 * 1000 * 1000};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&w.value), FUTEX_WAIT, seen, &timeout, nullptr, 0);
  w.sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

void notify(Word& w) {
  w.value.fetch_add(1, std::memory_order_seq_cst);
  if (w.sleepers.load(std::memory_order_seq_cst) != 0)
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&w.value), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
            0);
}

uint64_t now_us() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000 + uint64_t(ts.tv_nsec) / 1000;
}

}  // namespace deepinfer::ranks::shm
