// Samples and their loss masks against closed forms written here: text as bytes, so each counted
// target is one byte of the rendered text, and the bytes that count must be exactly the assistant
// turns' contents with their end-of-turn marks (a ChatML template), the completion with the
// end-of-sequence text, or everything after the first byte; the rows padded with targets that do
// not count; samples cut to the window, skipped when nothing of them counts within it, or refused
// by name with data.truncate false.
#include <gtest/gtest.h>

#include <memory>  // std::make_shared
#include <string>  // std::string
#include <vector>  // std::vector

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tests/train/folder_fixture.h"
#include "tests/train/text_fixture.h"
#include "train/corpus/packing.h"
#include "train/corpus/samples.h"
#include "train/text/chat_template.h"
#include "train/text/tokenizer.h"

namespace zeroth::corpus {
namespace {

using testing::Folder;

// Qwen2.5's template without its tool branches: ChatML turns, a default system turn.
const char* kChatMl = R"({%- if messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>system\nBe brief.<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role != 'system' %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %})";

// The counted targets of sample i as text (bytes), and the bytes before each stretch of them.
std::string counted_text(const Samples& s, size_t i) {
  std::string out;
  const auto ids = s.ids(i);
  const auto trained = s.trained(i);
  for (size_t j = 0; j < ids.size(); ++j)
    if (trained[j]) out += static_cast<char>(ids[j]);
  return out;
}

// Sample i's bytes, those whose targets do not count as '.'.
std::string positions_counted(const Samples& s, size_t i) {
  std::string out;
  const auto ids = s.ids(i);
  const auto trained = s.trained(i);
  for (size_t j = 0; j < ids.size(); ++j) out += trained[j] ? static_cast<char>(ids[j]) : '.';
  return out;
}

std::string text_of(const Samples& s, size_t i) {
  std::string out;
  for (const int32_t id : s.ids(i)) out += static_cast<char>(id);
  return out;
}

struct Made {
  Folder dir;
  ChatTemplate chat;
  SampleOptions options;
  explicit Made(const std::string& name, size_t max_tokens = 4096)
      : dir(name), chat(kChatMl, "chatml", nlohmann::ordered_json{{"eos_token", "<eos>"}}) {
    options.max_tokens = max_tokens;
    options.chat_template = &chat;
    options.eos = "<eos>";
  }
  Samples read(const std::string& lines) {
    const auto bytes = Tokenizer::bytes();
    return Samples::read({dir.write("data.jsonl", lines)}, {}, *bytes, options);
  }
};

TEST(Samples, ConversationsCountTheAssistantsTurnsWithTheirEndMarks) {
  Made m("assistant");
  const Samples s = m.read(
      R"({"messages": [{"role": "user", "content": "Q: one?"}, {"role": "assistant", "content": "A: 1"}]})"
      "\n"
      R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "x"}, {"role": "assistant", "content": "é!"},)"
      R"( {"role": "user", "content": "y"}, {"role": "assistant", "content": ""}]})"
      "\n");
  ASSERT_EQ(s.size(), 2);
  EXPECT_EQ(s.loss_on(), LossOn::assistant);
  EXPECT_EQ(text_of(s, 0), "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nQ: one?<|im_end|>\n"
                           "<|im_start|>assistant\nA: 1<|im_end|>\n");
  EXPECT_EQ(counted_text(s, 0), "A: 1<|im_end|>\n");
  EXPECT_EQ(counted_text(s, 1), "é!<|im_end|>\n<|im_end|>\n");  // the empty turn still ends
  // Where they are: the system turn (31 bytes), the user's (29) and the assistant's header (22) do
  // not count, the answer and its mark do; then the next user turn and header, and the empty
  // answer's mark.
  EXPECT_EQ(positions_counted(s, 1), std::string(31 + 29 + 22, '.') + "é!<|im_end|>\n" + std::string(29 + 22, '.') + "<|im_end|>\n");
  EXPECT_EQ(s.counted(0), static_cast<int64_t>(std::string("A: 1<|im_end|>\n").size()));
  EXPECT_EQ(s.stats().counted, s.counted(0) + s.counted(1));
  EXPECT_EQ(s.source(1).substr(s.source(1).rfind(':')), ":2");
}

// A tokenizer whose tokens end where the test says, whatever the text: the counting rule on tokens
// wider than a byte, an empty one, and one across the prompt's end.
class FixedTokenizer final : public Tokenizer {
 public:
  explicit FixedTokenizer(std::vector<size_t> ends) : ends_(std::move(ends)) {}
  std::string decode(std::span<const int32_t> ids) const override { return std::string(ids.size(), 't'); }
  int vocab_size() const override { return 64; }
  std::string describe() const override { return "fixed"; }
  uint64_t fingerprint() const override { return 1; }

 protected:
  std::vector<int32_t> encode_text(std::string_view, const EncodeProgress&, std::vector<size_t>* ends) const override {
    if (ends != nullptr) *ends = ends_;
    std::vector<int32_t> ids;
    for (size_t i = 0; i < ends_.size(); ++i) ids.push_back(static_cast<int32_t>(10 + i));
    return ids;
  }

 private:
  std::vector<size_t> ends_;
};

// "abcd" + "efghi": the completion's bytes [4, 9). Tokens [0, 3), [3, 5) (across the prompt's end:
// it meets the completion, so it counts, as Hugging Face's offset mapping puts it in), [5, 5)
// (empty, inside) and [5, 9).
TEST(Samples, ATokenCountsWhereItsBytesMeetTheSpan) {
  Made m("fixed");
  m.options.eos = "";
  const FixedTokenizer tok({3, 5, 5, 9});
  const Samples s = Samples::read({m.dir.write("data.jsonl", R"({"prompt": "abcd", "completion": "efghi"})"
                                                             "\n")},
                                  {}, tok, m.options);
  ASSERT_EQ(s.size(), 1);
  const auto trained = s.trained(0);
  EXPECT_EQ(std::vector<uint8_t>(trained.begin(), trained.end()), (std::vector<uint8_t>{0, 1, 1, 1}));
}

TEST(Samples, PromptsAndCompletionsCountTheCompletionAndTheEndOfSequence) {
  Made m("completion");
  const Samples s = m.read(R"({"prompt": "2+2=", "completion": "4"})"
                           "\n"
                           R"({"prompt": "", "completion": "ab"})"
                           "\n");
  EXPECT_EQ(text_of(s, 0), "2+2=4<eos>");
  EXPECT_EQ(counted_text(s, 0), "4<eos>");
  // The first byte has nothing before it to predict it from.
  EXPECT_EQ(counted_text(s, 1), "b<eos>");
  m.options.loss_on = LossOn::all;
  EXPECT_EQ(counted_text(m.read(R"({"prompt": "2+2=", "completion": "4"})"), 0), "+2=4<eos>");
  m.options.loss_on = LossOn::assistant;
  EXPECT_NE(testing::error_message([&] {
              m.read(R"({"prompt": "2+2=", "completion": "4"})");
            }).find("data.loss_on \"assistant\" has nothing to find in records of prompt and completion"),
            std::string::npos);
}

TEST(Samples, RowsPadWithTargetsThatDoNotCount) {
  Made m("rows", 9);  // rows of 8 inputs
  const Samples s = m.read(R"({"prompt": "ab", "completion": "cd"})"
                           "\n");
  ASSERT_EQ(s.width(), 8);
  std::vector<int32_t> tokens(8), targets(8);
  // "abcd<eos>" is 9 bytes: inputs a b c d < e o s, targets b c d < e o s > with the prompt's not counted.
  EXPECT_EQ(s.fill(0, tokens.data(), targets.data()), 7);
  EXPECT_EQ(tokens, (std::vector<int32_t>{'a', 'b', 'c', 'd', '<', 'e', 'o', 's'}));
  EXPECT_EQ(targets, (std::vector<int32_t>{kNotCounted, 'c', 'd', '<', 'e', 'o', 's', '>'}));
  const Samples shorter = m.read(R"({"text": "xy"})"
                                 "\n");
  EXPECT_EQ(shorter.fill(0, tokens.data(), targets.data()), 6);  // "xy<eos>": 6 targets, then padding
  EXPECT_EQ(tokens, (std::vector<int32_t>{'x', 'y', '<', 'e', 'o', 's', '>', '>'}));
  EXPECT_EQ(targets, (std::vector<int32_t>{'y', '<', 'e', 'o', 's', '>', kNotCounted, kNotCounted}));
}

TEST(Samples, LongSamplesAreCutOrSkippedOrRefusedByName) {
  Made m("long", 100);
  const std::string long_answer =
      R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a long answer"}]})";
  const std::string late = R"({"messages": [{"role": "user", "content": ")" + std::string(40, 'q') +
                           R"("}, {"role": "assistant", "content": "a"}]})";
  const Samples s = m.read(long_answer + "\n" + late + "\n" + long_answer + "\n");
  // The system turn (39 bytes), the user's (29) and the assistant's header (22) leave 10 bytes of the
  // first answer in the window; the second's user turn (68 bytes) fills it before its answer.
  EXPECT_EQ(s.size(), 2);
  EXPECT_EQ(s.stats().truncated, 3u);
  EXPECT_EQ(s.stats().nothing_trained, 1u);
  EXPECT_EQ(s.ids(0).size(), 100u);
  EXPECT_EQ(counted_text(s, 0), "a long ans");
  m.options.truncate = false;
  m.options.max_tokens = 110;  // the short one (102 tokens) fits
  const std::string short_one = R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})";
  const std::string e = testing::error_message([&] { m.read(short_one + "\n" + long_answer + "\n"); });
  EXPECT_NE(e.find("data.jsonl, line 2: the sample is"), std::string::npos) << e;
  EXPECT_NE(e.find("is 114 tokens, longer than model.seq_len + 1 = 110, and data.truncate is false"), std::string::npos) << e;
}

TEST(Samples, TheTailIsTakenOutForValidation) {
  Made m("tail");
  Samples s = m.read(R"({"text": "one"})"
                     "\n"
                     R"({"text": "two"})"
                     "\n"
                     R"({"text": "three"})"
                     "\n");
  const Samples tail = s.take_tail(1);
  EXPECT_EQ(s.size(), 2);
  EXPECT_EQ(tail.size(), 1);
  EXPECT_EQ(text_of(s, 1), "two<eos>");
  EXPECT_EQ(text_of(tail, 0), "three<eos>");
  // Every byte but each sample's first counts: 7 + 7 left, 9 in the tail.
  EXPECT_EQ(s.stats().counted, 14u);
  EXPECT_EQ(s.stats().samples, 2u);
  EXPECT_EQ(tail.stats().counted, 9u);
}

// Best-fit decreasing worked by hand for samples of 9, 8, 6, 5, 4, 3 and 2 bytes (n - 1 bytes of
// prompt, one of completion) in rows of 11: 9, 8 and 6 open rows (room 2, 3 and 5), 5 fills the
// third, 4 fits neither room left and opens a fourth (room 7), 3 fills the second, 2 the first.
TEST(Samples, PackedRowsAreBestFitDecreasingWithPositionsFromEachSample) {
  Made m("packed", 11);
  m.options.eos = "";
  std::string lines;
  for (const int n : {5, 9, 3, 8, 2, 6, 4})
    lines += R"({"prompt": ")" + std::string(static_cast<size_t>(n - 1), 'p') +
             R"(", "completion": "c"})"
             "\n";
  auto samples = std::make_shared<Samples>(m.read(lines));
  ASSERT_EQ(samples->size(), 7);
  const Packed packed(samples, 11);
  ASSERT_EQ(packed.size(), 4);
  auto lengths = [&](int64_t row) {
    std::vector<size_t> out;
    for (const uint32_t i : packed.samples_of(row)) out.push_back(samples->ids(i).size());
    return out;
  };
  EXPECT_EQ(lengths(0), (std::vector<size_t>{9, 2}));
  EXPECT_EQ(lengths(1), (std::vector<size_t>{8, 3}));
  EXPECT_EQ(lengths(2), (std::vector<size_t>{6, 5}));
  EXPECT_EQ(lengths(3), (std::vector<size_t>{4}));
  EXPECT_DOUBLE_EQ(packed.fill_ratio(), 37.0 / 44.0);
  // Row 2: "pppppc" then "ppppc"; each sample's last token targets nothing of the next, and only the
  // completions count. Row 3: "pppc", then padding that attends to itself and counts nothing.
  std::vector<int32_t> tokens(11), targets(11), positions(11);
  EXPECT_EQ(packed.fill(2, tokens.data(), targets.data(), positions.data()), 2);
  EXPECT_EQ(tokens, (std::vector<int32_t>{'p', 'p', 'p', 'p', 'p', 'c', 'p', 'p', 'p', 'p', 'c'}));
  const int32_t x = kNotCounted;
  EXPECT_EQ(targets, (std::vector<int32_t>{x, x, x, x, 'c', x, x, x, x, 'c', x}));
  EXPECT_EQ(positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4}));
  EXPECT_EQ(packed.fill(3, tokens.data(), targets.data(), positions.data()), 1);
  EXPECT_EQ(tokens, (std::vector<int32_t>{'p', 'p', 'p', 'c', 'c', 'c', 'c', 'c', 'c', 'c', 'c'}));
  EXPECT_EQ(targets, (std::vector<int32_t>{x, x, 'c', x, x, x, x, x, x, x, x}));
  EXPECT_EQ(positions, (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6}));
  int64_t counted = 0;
  for (int64_t r = 0; r < packed.size(); ++r) counted += packed.counted(r);
  EXPECT_EQ(counted, 7);
}

}  // namespace
}  // namespace zeroth::corpus
