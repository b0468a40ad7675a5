#include "core/format.h"

#include <gtest/gtest.h>

namespace deepinfer {
namespace {

TEST(Format, HumanBytes) {
  EXPECT_EQ(human_bytes(0), "0 B");
  EXPECT_EQ(human_bytes(1023), "1023 B");
  EXPECT_EQ(human_bytes(1024), "1.00 KiB");
  EXPECT_EQ(human_bytes(1536), "1.50 KiB");
  EXPECT_EQ(human_bytes(3.5 * (1 << 30)), "3.50 GiB");
  EXPECT_EQ(human_bytes(2048.0 * (1ull << 40)), "2048.00 TiB");
}

}  // namespace
}  // namespace deepinfer
