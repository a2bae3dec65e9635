// SentencePiece tokenization against SentencePiece's own command-line tools: a model trained at
// test time by Debian's spm_train on the fortunes; zeroth's ids for every line equal spm_encode's,
// its text for those ids equals spm_decode's, and a whole text is its lines' ids with the newline
// byte piece between them. The token files it writes hold the same ids (2 bytes each, or 4 when
// the vocabulary exceeds 65,536 ids, as llm.c's Llama 3 files say in their header). Bad input is a
// clear error.
#include <gtest/gtest.h>

#include <algorithm>  // std::count

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "train/data.h"
#include "train/text/tokenizer.h"
#include "tests/train/text_fixture.h"

namespace zeroth {
namespace {

namespace fs = std::filesystem;

using testing::shell;

class SentencePieceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fmt::format("{}/zeroth_spm_{}", ::testing::TempDir(), ::getpid());
    fs::create_directories(dir_);
    const std::string text = testing::fortunes_text();
    ASSERT_GT(text.size(), 100000u);
    text_ = text;
    std::ofstream(dir_ + "/text.txt", std::ios::binary) << text;
    shell(fmt::format("spm_train --input={0}/text.txt --model_prefix={0}/spm --vocab_size=2000 --byte_fallback=true "
                      "--character_coverage=1.0 --minloglevel=2 2>&1",
                      dir_));
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static std::string dir_, text_;
};
std::string SentencePieceTest::dir_, SentencePieceTest::text_;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

TEST_F(SentencePieceTest, IdsAndTextAreSpmEncodesAndSpmDecodes) {
  const auto tok = Tokenizer::open(dir_ + "/spm.model");
  EXPECT_EQ(tok->vocab_size(), 2000);
  const auto lines = lines_of(text_);
  // spm_encode and spm_decode, one line each, on every line of the text.
  const auto ids_text = lines_of(shell(fmt::format("spm_encode --model={0}/spm.model --output_format=id < {0}/text.txt", dir_)));
  ASSERT_EQ(ids_text.size(), lines.size());
  std::ofstream(dir_ + "/ids.txt") << shell(fmt::format("spm_encode --model={0}/spm.model --output_format=id < {0}/text.txt", dir_));
  const auto decoded = lines_of(shell(fmt::format("spm_decode --model={0}/spm.model --input_format=id < {0}/ids.txt", dir_)));
  ASSERT_EQ(decoded.size(), lines.size());
  const int newline = 3 + 10;  // <0x0A>: the byte pieces follow <unk>, <s>, </s>
  std::vector<int32_t> whole;
  size_t nonempty = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::vector<int32_t> want;
    std::istringstream in(ids_text[i]);
    for (int id; in >> id;) want.push_back(id);
    const auto got = tok->encode(lines[i]);
    ASSERT_EQ(got, want) << "line " << i << ": " << lines[i];
    ASSERT_EQ(tok->decode(got), decoded[i]) << "line " << i;
    whole.insert(whole.end(), got.begin(), got.end());
    whole.push_back(newline);
    nonempty += got.empty() ? 0 : 1;
  }
  EXPECT_GT(nonempty, 5000u);
  EXPECT_EQ(tok->encode(text_), whole);
  EXPECT_EQ(tok->decode(std::vector<int32_t>{newline}), "\n");
  // Where each token ends (SentencePiece's own offsets): the ranges tile the text, each newline
  // token is its byte, the text between two newlines encodes to the tokens between them, and a
  // line's pieces so far decode to its text up to the last one's end.
  const auto e = tok->encode_with_ends(text_);
  EXPECT_EQ(e.ids, whole);
  ASSERT_EQ(e.ends.size(), whole.size());
  size_t begin = 0, line_begin = 0, line_token = 0, checked = 0;
  for (size_t t = 0; t < whole.size(); ++t) {
    ASSERT_GE(e.ends[t], begin) << "token " << t;
    if (whole[t] == newline) {
      // A line of whitespace only encodes to nothing: its newline token holds it.
      const std::string range = text_.substr(begin, e.ends[t] - begin);
      ASSERT_TRUE(range.ends_with("\n") && range.find_first_not_of(" \t\n") == std::string::npos) << "token " << t << ": " << range;
      const std::vector<int32_t> line(whole.begin() + line_token, whole.begin() + t);
      const std::string text = text_.substr(line_begin, begin - line_begin);
      ASSERT_EQ(tok->encode(text), line) << "the line ending at token " << t;
      // On a line the model gives back as it is, each piece's end is where the text its pieces so
      // far decode to ends.
      if (tok->decode(line) == text) {
        for (size_t k = line_token; k < t; ++k) {
          const std::vector<int32_t> prefix(whole.begin() + line_token, whole.begin() + k + 1);
          ASSERT_EQ(tok->decode(prefix), text.substr(0, e.ends[k] - line_begin)) << "token " << k << " of the line: " << text;
          ++checked;
        }
      }
      line_begin = e.ends[t], line_token = t + 1;
    }
    begin = e.ends[t];
  }
  EXPECT_EQ(begin, text_.size());
  EXPECT_GT(checked, whole.size() / 2) << "most pieces are on lines the model gives back as they are";
}

// A chat template writes the control pieces as text (Llama 2's "<s>[INST] ... [/INST] ...</s>"):
// they are their ids (1 and 2 after <unk>), as Hugging Face's LlamaTokenizer takes them, and the
// stretches between are encoded alone; each control piece ends where its text does.
TEST_F(SentencePieceTest, ControlPiecesInTheTextAreTheirIds) {
  const auto tok = Tokenizer::open(dir_ + "/spm.model");
  const std::string text = "<s>[INST] what has keys? [/INST] A piano.</s><s>[INST] more";
  const auto e = tok->encode_with_ends(text);
  EXPECT_EQ(e.ids, tok->encode(text));
  std::vector<int32_t> want = {1};
  for (const int32_t id : tok->encode("[INST] what has keys? [/INST] A piano.")) want.push_back(id);
  want.push_back(2);
  want.push_back(1);
  for (const int32_t id : tok->encode("[INST] more")) want.push_back(id);
  EXPECT_EQ(e.ids, want);
  ASSERT_EQ(e.ends.size(), want.size());
  EXPECT_EQ(e.ends[0], 3u);
  const size_t close = text.find("</s>") + 4;
  EXPECT_EQ(std::count(e.ends.begin(), e.ends.end(), close), 1);
  EXPECT_EQ(e.ends.back(), text.size());
}

TEST_F(SentencePieceTest, TokenFilesHoldTheIdsAtTheirWidth) {
  // A model folder (tokenizer.model in it) tokenizes the text into a cached token file, once.
  fs::create_directories(dir_ + "/folder");
  fs::copy_file(dir_ + "/spm.model", dir_ + "/folder/tokenizer.model", fs::copy_options::overwrite_existing);
  const auto want = Tokenizer::open(dir_ + "/folder")->encode(text_);
  const TokenData data = TokenData::open_tokenized(dir_ + "/text.txt", dir_ + "/folder", dir_ + "/cache", false);
  ASSERT_EQ(data.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(data[i], want[i]) << "token " << i;
  std::vector<fs::path> cached;
  for (const auto& e : fs::directory_iterator(dir_ + "/cache")) cached.push_back(e.path());
  ASSERT_EQ(cached.size(), 1u);
  EXPECT_EQ(fs::file_size(cached[0]), 1024 + 2 * want.size());  // 2-byte tokens under 65,536
  const auto written = fs::last_write_time(cached[0]);
  TokenData::open_tokenized(dir_ + "/text.txt", dir_ + "/folder", dir_ + "/cache", false);
  EXPECT_EQ(fs::last_write_time(cached[0]), written) << "the cached tokens were written again";
  // Another text (the same name, one more line) is tokenized anew, beside the first.
  std::ofstream(dir_ + "/text.txt", std::ios::binary | std::ios::app) << "One more line.\n";
  const TokenData longer = TokenData::open_tokenized(dir_ + "/text.txt", dir_ + "/folder", dir_ + "/cache", false);
  EXPECT_EQ(longer.size(), want.size() + Tokenizer::open(dir_ + "/folder")->encode("One more line.\n").size());
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_ + "/cache"), fs::directory_iterator{}), 2);
  std::ofstream(dir_ + "/text.txt", std::ios::binary) << text_;  // as the other tests read it

  // A vocabulary past 65,536 ids takes 4 bytes a token, in llm.c's Llama 3 layout (magic
  // 20240801, version 7).
  const std::vector<int32_t> wide = {0, 65535, 65536, 128255, 7};
  write_token_file(dir_ + "/wide.bin", wide, 128256);
  std::ifstream in(dir_ + "/wide.bin", std::ios::binary);
  int32_t header[3];
  in.read(reinterpret_cast<char*>(header), sizeof header);
  EXPECT_EQ(header[0], 20240801);
  EXPECT_EQ(header[1], 7);
  EXPECT_EQ(header[2], 5);
  EXPECT_EQ(fs::file_size(dir_ + "/wide.bin"), 1024u + 4 * wide.size());
  const TokenData back = TokenData::open_bin(dir_ + "/wide.bin");
  ASSERT_EQ(back.size(), wide.size());
  for (size_t i = 0; i < wide.size(); ++i) EXPECT_EQ(back[i], wide[i]);
  EXPECT_THROW(write_token_file(dir_ + "/negative.bin", {1, -2}, 10), InvalidArgument);
  EXPECT_THROW(write_token_file(dir_ + "/past.bin", {1, 10}, 10), InvalidArgument);
}

TEST_F(SentencePieceTest, BadInputIsAClearError) {
  EXPECT_NE(testing::error_message([&] { Tokenizer::open(dir_ + "/missing.model"); }).find("does not exist"), std::string::npos);
  EXPECT_NE(testing::error_message([&] { Tokenizer::open(dir_ + "/text.txt"); }).find("is not a SentencePiece model"),
            std::string::npos);
  const auto tok = Tokenizer::open(dir_ + "/spm.model");
  const std::string bad = std::string("caf") + static_cast<char>(0xE9) + " au lait";
  EXPECT_NE(testing::error_message([&] { tok->encode(bad); }).find("is not UTF-8: byte 3 (0xe9)"), std::string::npos)
      << testing::error_message([&] { tok->encode(bad); });
  EXPECT_NE(testing::error_message([&] {
              tok->decode(std::vector<int32_t>{5, 2000});
            }).find("id 2000 is outside the vocabulary of 2000"),
            std::string::npos);
}

}  // namespace
}  // namespace zeroth
