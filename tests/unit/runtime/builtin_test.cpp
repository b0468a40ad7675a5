// Synthetic checkpoints in a shared cache: several test processes may create the same one at the
// same time while others already read it, so a cache fill must never replace a complete copy.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

#include "io_test_util.h"
#include "runtime/builtin.h"

namespace deepinfer {
namespace {

using namespace testing_io;

ino_t inode(const fs::path& p) {
  struct stat st {};
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return st.st_ino;
}

TEST(MakeTinyCheckpoint, ACacheFillKeepsTheCopyOthersReadAndAPlainOneReplacesIt) {
  ScratchDir scratch;
  const fs::path dir = scratch / "tiny";
  TinyCheckpoint a;
  make_tiny_checkpoint(dir.string(), a);
  const fs::path index = dir / "model.safetensors.index.json";
  const fs::path shard = dir / "model-00001-of-00007.safetensors";
  const ino_t config0 = inode(dir / "config.json"), index0 = inode(index);
  const std::string weights_a = read_text(shard.string());

  TinyCheckpoint b;
  b.seed = 5;  // other weights, so a replacement would show
  make_tiny_checkpoint(dir.string(), b, /*keep_existing=*/true);
  EXPECT_EQ(inode(dir / "config.json"), config0);
  EXPECT_EQ(inode(index), index0);
  EXPECT_EQ(read_text(shard.string()), weights_a);
  // Nothing is left beside it: the discarded copy's temporary directory is gone.
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(scratch.path())) ++entries;
  EXPECT_EQ(entries, 1);

  // An incomplete directory (no config.json) is no checkpoint: a cache fill replaces it.
  fs::remove(dir / "config.json");
  make_tiny_checkpoint(dir.string(), b, /*keep_existing=*/true);
  EXPECT_TRUE(fs::exists(dir / "config.json"));
  const std::string weights_b = read_text(shard.string());
  EXPECT_NE(weights_b, weights_a);

  // Without keep_existing (`deepinfer make-tiny --out`), the directory is replaced.
  make_tiny_checkpoint(dir.string(), a);
  EXPECT_EQ(read_text(shard.string()), weights_a);
}

}  // namespace
}  // namespace deepinfer
