// Byte-level BPE tokenization against Hugging Face's own tokenizers.js (npm
// @huggingface/tokenizers, run by node through tests/reference/bpe_reference.mjs): a tokenizer.json
// made at test time in Llama 3's form (its split pattern, ByteLevel, ignore_merges with a word the
// merges do not build, special added tokens, one taking the whitespace beside it) with Qwen2's NFC
// normalizer and 1,000 merges learned from the fortunes; zeroth's ids and decoded text equal
// tokenizers.js's on the fortunes and on text with emoji, CJK, digit runs, whitespace runs,
// combining marks, added tokens and pieces thousands of bytes long, and its decoding of ids that
// cut a character apart equals tokenizers.js's too. GPT-2's form (ByteLevel's own pattern and
// prefix space) and a literal Split pattern equal tokenizers.js's as well; the Split behaviours
// tokenizers.js lacks meet Hugging Face's documented example. Bad input is a clear error.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <set>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/data.h"
#include "train/text/tokenizer.h"
#include "tests/train/text_fixture.h"

namespace zeroth {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kReference = std::string(ZEROTH_SOURCE_DIR) + "/tests/reference/bpe_reference.mjs";
const std::string kNodeModules = std::string(ZEROTH_SOURCE_DIR) + "/.cache/node/node_modules";

using testing::shell;

std::string node(const std::string& args) {
  return shell(fmt::format("ZEROTH_NODE_MODULES={} node {} {}", kNodeModules, kReference, args));
}

using testing::error_message;

class BpeTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(fs::exists(kNodeModules + "/@huggingface/tokenizers/package.json"))
        << "tokenizers.js is not installed in " << kNodeModules << " (tools/install-deps.sh installs it)";
    dir_ = fmt::format("{}/zeroth_bpe_{}", ::testing::TempDir(), ::getpid());
    fs::create_directories(dir_);
    const std::string text = testing::fortunes_text();
    ASSERT_GT(text.size(), 100000u);
    text_ = text;
    std::ofstream(dir_ + "/text.txt", std::ios::binary) << text;
    node(fmt::format("train {0}/text.txt {0}/tokenizer.json 1000", dir_));
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // tokenizers.js on each input: a string is encoded (and its ids decoded), an array of ids decoded.
  static json reference(const json& inputs) {
    std::ofstream(dir_ + "/inputs.json") << inputs.dump();
    return json::parse(node(fmt::format("encode {0}/tokenizer.json {0}/inputs.json", dir_)));
  }
  static std::string dir_, text_;
};
std::string BpeTokenizerTest::dir_, BpeTokenizerTest::text_;

// encode_with_ends against the ids' own text: the ranges tile `input` in order, and each token's
// range is what `want(token, its text alone, its end)` says (nullopt: no check); a token whose text
// alone is not whole characters (U+FFFD) is checked only by the tiling.
void expect_ends(const Tokenizer& tok, const std::string& input, const std::string& what,
                 const std::function<std::optional<std::string>(size_t, const std::string&, size_t)>& want) {
  const auto e = tok.encode_with_ends(input);
  EXPECT_EQ(e.ids, tok.encode(input)) << what;
  ASSERT_EQ(e.ends.size(), e.ids.size()) << what;
  size_t begin = 0;
  for (size_t t = 0; t < e.ids.size(); ++t) {
    ASSERT_GE(e.ends[t], begin) << what << ", token " << t;
    const std::string own = tok.decode(std::vector<int32_t>{e.ids[t]});
    const auto range = want(t, own, e.ends[t]);
    if (range && own.find("\xef\xbf\xbd") == std::string::npos) {
      EXPECT_EQ(input.substr(begin, e.ends[t] - begin), *range) << what << ", token " << t;
    }
    begin = e.ends[t];
  }
  EXPECT_EQ(begin, input.size()) << what;
}

TEST_F(BpeTokenizerTest, IdsAndTextAreTokenizersJs) {
  const auto tok = Tokenizer::open(dir_ + "/tokenizer.json");
  EXPECT_EQ(tok->vocab_size(), 256 + 1000 + 1 + 5);  // bytes, merges, " qwerty", the added tokens
  const std::vector<std::string> inputs = {
      text_,
      "Hello World! It's, they'RE, we'll, I'M, you'D: contractions in either case",
      "qwerty, say qwerty, say qwertyuiop",  // the vocabulary's whole word, alone only
      "emoji 😀👍🏽 and a family 👨‍👩‍👧 of joiners; flags 🇫🇷🇯🇵",
      "中文字符和日本語のテキスト、한국어 텍스트。",
      "digit runs 1234567 12,345.678 ٣٤٥ and 3.14159265358979",
      "whitespace\truns  \t \n\n\n  after\r\n\r\nlines   \u00a0nbsp\u3000ideographic   ",
      "   ",
      "\n",
      "combining: e\u0301 vs \u00e9, A\u030a vs \u00c5, \u1e9b\u0323",
      "<|begin_of_text|>special<|eot_id|><|eot_id|> in text, and azerothb, zeroth's zeroth",
      "<|begin_of_text|",
      "",
      "a <mask>  b, x\u3000<mask>\u3000y, <mask>",  // the mask's whitespace, ASCII and not, goes into it
      std::string(5000, 'a') + std::string(3000, ' ') + "x" + std::string(2000, '\n') + std::string(4000, '7'),
  };
  const json want = reference(inputs);
  ASSERT_EQ(want.size(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto ids = tok->encode(inputs[i]);
    const auto want_ids = want[i]["ids"].get<std::vector<int32_t>>();
    const std::string what = i == 0 ? "the fortunes" : "\"" + inputs[i] + "\"";
    EXPECT_EQ(ids, want_ids) << what;
    EXPECT_EQ(tok->decode(want_ids), want[i]["text"].get<std::string>()) << what;
    // Where each token ends: NFC changes the combining input, so its tokens all end where that
    // stretch, the whole input, ends; a <mask> holds the whitespace lstrip/rstrip take beside it.
    const std::vector<std::string> masks = {" <mask>  ", "\u3000<mask>\u3000", " <mask>"};
    size_t mask = 0;
    expect_ends(*tok, inputs[i], what, [&](size_t t, const std::string& own, size_t end) -> std::optional<std::string> {
      if (inputs[i].starts_with("combining")) {
        EXPECT_EQ(end, inputs[i].size()) << what << ", token " << t;
        return std::nullopt;
      }
      if (own == "<mask>") return masks.at(mask++);
      return own;
    });
    if (inputs[i].starts_with("a <mask>")) {
      EXPECT_EQ(mask, masks.size());
    }
  }
  // The fortunes take several tokens a word, and the rarer inputs fall back to bytes.
  const auto fortunes = want[0]["ids"].get<std::vector<int32_t>>();
  EXPECT_GT(fortunes.size(), text_.size() / 5);
  EXPECT_LT(fortunes.size(), text_.size() / 2);
}

TEST_F(BpeTokenizerTest, IdsThatCutACharacterDecodeAsTokenizersJs) {
  const auto tok = Tokenizer::open(dir_ + "/tokenizer.json");
  const auto emoji = tok->encode("😀é中");  // one byte token each: 4 + 2 + 3
  ASSERT_EQ(emoji.size(), 9u);
  const std::vector<std::vector<int32_t>> cuts = {
      {emoji.begin() + 1, emoji.end()},                          // a character's first byte gone
      {emoji.begin(), emoji.begin() + 3},                        // its last
      {emoji[4], emoji[0], emoji[6], emoji[7], emoji[5]},        // bytes out of order
      {emoji[0], 1257, emoji[1], emoji[2], emoji[3], emoji[4]},  // a special token inside a character
  };
  std::ofstream(dir_ + "/ids.json") << json(cuts).dump();
  const json want = json::parse(node(fmt::format("decode {0}/tokenizer.json {0}/ids.json", dir_)));
  ASSERT_EQ(want.size(), cuts.size());
  for (size_t i = 0; i < cuts.size(); ++i) {
    EXPECT_EQ(tok->decode(cuts[i]), want[i].get<std::string>()) << "cut " << i;
    EXPECT_NE(want[i].get<std::string>().find("\xEF\xBF\xBD"), std::string::npos) << "cut " << i << " decodes whole";
  }
}

TEST_F(BpeTokenizerTest, FolderAndTokenFile) {
  // A folder with only a tokenizer.json (Llama 3's, Qwen's) opens it; the data pipeline's cached
  // token file holds its ids.
  fs::create_directories(dir_ + "/folder");
  fs::copy_file(dir_ + "/tokenizer.json", dir_ + "/folder/tokenizer.json", fs::copy_options::overwrite_existing);
  const auto tok = Tokenizer::open(dir_ + "/folder");
  EXPECT_NE(tok->describe().find("byte-level BPE, 1262 tokens, 1000 merges"), std::string::npos) << tok->describe();
  // Three times the fortunes (1.1 MiB): one pass, not pieces a newline run could span.
  const std::string text = text_ + text_ + text_;
  std::ofstream(dir_ + "/text3.txt", std::ios::binary) << text;
  const auto want = tok->encode(text);
  const TokenData data = TokenData::open_tokenized(dir_ + "/text3.txt", dir_ + "/folder", dir_ + "/cache", false);
  ASSERT_EQ(data.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(data[i], want[i]) << "token " << i;
}

TEST_F(BpeTokenizerTest, OtherLayoutsAreTokenizersJsToo) {
  const json good = json::parse(std::ifstream(dir_ + "/tokenizer.json"));
  // GPT-2's form: ByteLevel alone, with its own pattern, and a space put before the text.
  json gpt2 = good;
  gpt2["normalizer"] = nullptr;
  gpt2["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  // A literal pattern cut out before Llama 3's: "::" as pieces of their own.
  json literal = good;
  literal["pre_tokenizer"]["pretokenizers"].insert(
      literal["pre_tokenizer"]["pretokenizers"].begin(),
      json{{"type", "Split"}, {"pattern", {{"String", "::"}}}, {"behavior", "Isolated"}, {"invert", false}});
  const std::vector<std::string> inputs = {
      text_.substr(0, 20000),
      "std::vector<int>::iterator it; a::b:::c",
      "Hello world  and   more\n\nlines",
      " leading space, it's 1234567 emoji 😀 中文",
      "",
  };
  for (const auto& [name, j] : {std::pair{"gpt2", gpt2}, std::pair{"literal", literal}}) {
    const std::string path = dir_ + "/" + name + ".json";
    std::ofstream(path) << j.dump();
    const auto tok = Tokenizer::open(path);
    std::ofstream(dir_ + "/inputs.json") << json(inputs).dump();
    const json want = json::parse(node(fmt::format("encode {} {}/inputs.json", path, dir_)));
    ASSERT_EQ(want.size(), inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      const auto want_ids = want[i]["ids"].get<std::vector<int32_t>>();
      EXPECT_EQ(tok->encode(inputs[i]), want_ids) << name << ": \"" << inputs[i].substr(0, 80) << "\"";
      EXPECT_EQ(tok->decode(want_ids), want[i]["text"].get<std::string>()) << name;
      // GPT-2's space put before the text belongs to the first token, which holds no byte of it.
      const bool prefixed = std::string(name) == "gpt2" && !inputs[i].starts_with(" ");
      expect_ends(*tok, inputs[i], name, [&](size_t t, const std::string& own, size_t) -> std::optional<std::string> {
        return prefixed && t == 0 ? own.substr(1) : own;
      });
    }
  }
}

// The five ways a Split cuts (tokenizers.js has two), against Hugging Face's documentation of
// SplitDelimiterBehavior on its own example, "the-final--countdown" split at "-". Every piece is a
// whole word of the vocabulary (ignore_merges), so the ids spell the pieces.
TEST_F(BpeTokenizerTest, SplitBehavioursAreHuggingFacesDocumentedOnes) {
  const json good = json::parse(std::ifstream(dir_ + "/tokenizer.json"));
  const std::vector<std::pair<std::string, std::vector<std::string>>> behaviours = {
      {"Isolated", {"the", "-", "final", "-", "-", "countdown"}},   {"Removed", {"the", "final", "countdown"}},
      {"MergedWithPrevious", {"the-", "final-", "-", "countdown"}}, {"MergedWithNext", {"the", "-final", "-", "-countdown"}},
      {"Contiguous", {"the", "-", "final", "--", "countdown"}},
  };
  json j = good;
  j["added_tokens"] = json::array();
  std::set<std::string> words;
  for (const auto& [_, pieces] : behaviours) words.insert(pieces.begin(), pieces.end());
  for (const auto& w : words)
    if (!j["model"]["vocab"].contains(w)) j["model"]["vocab"][w] = static_cast<int>(j["model"]["vocab"].size());
  for (const auto& [behaviour, pieces] : behaviours) {
    j["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers",
                           {{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behaviour}, {"invert", false}},
                            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
    const std::string path = dir_ + "/split.json";
    std::ofstream(path) << j.dump();
    const auto tok = Tokenizer::open(path);
    std::vector<std::string> got;
    for (const int32_t id : tok->encode("the-final--countdown")) got.push_back(tok->decode(std::vector<int32_t>{id}));
    EXPECT_EQ(got, pieces) << behaviour;
  }
}

TEST_F(BpeTokenizerTest, BadInputIsAClearError) {
  const json good = json::parse(std::ifstream(dir_ + "/tokenizer.json"));
  auto with = [&](const std::string& name, const auto& change) {
    json j = good;
    change(j);
    std::ofstream(dir_ + "/" + name) << j.dump();
    return error_message([&] { Tokenizer::open(dir_ + "/" + name); });
  };
  EXPECT_NE(with(
                "nfkc.json",
                [](json& j) {
    j["normalizer"] = {{"type", "NFKC"}};
                })
                .find("the normalizer {\"type\":\"NFKC\"} is not one"),
            std::string::npos);
  EXPECT_NE(with("fallback.json", [](json& j) { j["model"]["byte_fallback"] = true; }).find("byte_fallback is set"),
            std::string::npos);
  EXPECT_NE(with("wordpiece.json", [](json& j) { j["model"]["type"] = "WordPiece"; }).find("model.type is \"WordPiece\""),
            std::string::npos);
  EXPECT_NE(with(
                "digits.json",
                [](json& j) {
    j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Digits"}};
                })
                .find("the pre-tokenizer {\"type\":\"Digits\"} is not one zeroth applies"),
            std::string::npos);
  EXPECT_NE(
      with("prefix.json", [](json& j) { j["model"]["continuing_subword_prefix"] = "##"; }).find("continuing_subword_prefix is \"##\""),
      std::string::npos);
  EXPECT_NE(with("huge_id.json", [](json& j) { j["model"]["vocab"]["far"] = 2000000000; }).find("the id 2000000000, outside 0 .."),
            std::string::npos);
  EXPECT_NE(
      with("clash.json", [](json& j) { j["added_tokens"][0]["id"] = 38; }).find("has the id 38, which model.vocab gives to \"&\""),
      std::string::npos);
  EXPECT_NE(with("behaviour.json", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways"; })
                .find("a Split's behavior is \"Sideways\", none of Hugging Face's five"),
            std::string::npos);
  EXPECT_NE(with("no_bytes.json", [](json& j) { j["model"]["vocab"].erase("A"); }).find("no token for the byte 0x41"),
            std::string::npos);
  EXPECT_NE(with("bad_regex.json", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; })
                .find("pcre2_compile of the pattern \"(unclosed\""),
            std::string::npos);
  EXPECT_NE(with("decoder.json", [](json& j) { j["decoder"] = nullptr; }).find("a byte-level BPE tokenizer decodes with ByteLevel"),
            std::string::npos);
  std::ofstream(dir_ + "/not.json") << "{ not json";
  EXPECT_NE(error_message([&] { Tokenizer::open(dir_ + "/not.json"); }).find("is not JSON"), std::string::npos);
  EXPECT_NE(error_message([&] { Tokenizer::open(dir_ + "/missing.json"); }).find("does not exist"), std::string::npos);
  fs::create_directories(dir_ + "/empty");
  EXPECT_NE(error_message([&] { Tokenizer::open(dir_ + "/empty"); }).find("holds neither tokenizer.model"), std::string::npos);
  const auto tok = Tokenizer::open(dir_ + "/tokenizer.json");
  EXPECT_NE(error_message([&] { tok->encode(std::string("caf") + static_cast<char>(0xE9)); }).find("is not UTF-8: byte 3"),
            std::string::npos);
  EXPECT_NE(error_message([&] {
              tok->decode(std::vector<int32_t>{5, 1262});
            }).find("id 1262 is outside the vocabulary of 1262"),
            std::string::npos);
}

}  // namespace
}  // namespace zeroth
