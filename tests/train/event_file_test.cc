// The event file's CRC against the published check value; the file itself is read back by an
// independent reader in tests/tools/monitors_test.cc.
#include <gtest/gtest.h>

#include "train/report/event_file.h"

namespace zeroth {
namespace {

TEST(EventFile, Crc32cIsCastagnolisCheckValue) {
  // The CRC-32C of "123456789" (RFC 3720, appendix B.4).
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  // TFRecord's mask: rotated right by 15, plus a constant.
  const uint32_t c = 0xE3069283u;
  EXPECT_EQ(masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

}  // namespace
}  // namespace zeroth
