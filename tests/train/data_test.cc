// Training data: what is refused before a run starts, and how.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "core/error.h"
#include "train/data.h"

namespace zeroth {
namespace {

std::string temp(const std::string& name) { return ::testing::TempDir() + "data_" + name; }

std::string message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "accepted";
}

TEST(TextData, AFileWithANulByteIsRefusedPointingAtTheBinFormat) {
  {
    std::ofstream out(temp("tokens.txt"), std::ios::binary);
    out << "plain text" << '\0' << "more";
  }
  const std::string m = message([] { TokenData::open_text(temp("tokens.txt")); });
  EXPECT_NE(m.find("holds a NUL byte at offset 10: it is not text"), std::string::npos) << m;
  EXPECT_NE(m.find("data.format \"bin\""), std::string::npos) << m;
  // In a folder of texts a binary file is skipped, the texts are read.
  std::filesystem::create_directories(temp("folder"));
  std::filesystem::copy_file(temp("tokens.txt"), temp("folder") + "/b.bin", std::filesystem::copy_options::overwrite_existing);
  std::ofstream(temp("folder") + "/a.txt") << "hello";
  EXPECT_EQ(TokenData::open_text(temp("folder")).size(), 5u);
}

TEST(Loader, DataSmallerThanOneGlobalBatchIsRefusedWithTheNumbers) {
  const TokenData data = TokenData::synthetic(16, 10 * 8 + 1, 1);  // 10 sequences of 8 + 1 tokens
  EXPECT_NO_THROW(Loader(data, 8, 5, 1, 2, 0, 1));                 // a batch of exactly 10
  const std::string m = message([&] { Loader(data, 8, 2, 3, 2, 0, 1); });
  EXPECT_NE(m.find("the training data has 10 sequences of 9 tokens, but one batch takes 12 (2 per micro-batch x 3 accumulation steps "
                   "x 2 ranks)"),
            std::string::npos)
      << m;
}

}  // namespace
}  // namespace zeroth
