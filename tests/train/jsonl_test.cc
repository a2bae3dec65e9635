// JSON Lines records against the files written here: plain and gzip files of a folder in name
// order, each shape and its errors naming the file, the line and the key, and the conversations
// skipped (none left, or no assistant turn) counted.
#include <gtest/gtest.h>

#include <unistd.h>  // getpid
#include <zlib.h>    // gzopen, gzwrite

#include <cstdlib>     // std::system
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ofstream
#include <string>      // std::string
#include <vector>      // std::vector

#include <fmt/format.h>

#include "core/error.h"
#include "tests/train/folder_fixture.h"
#include "train/corpus/jsonl.h"

namespace zeroth::corpus {
namespace {

namespace fs = std::filesystem;
using testing::Folder;

std::string error_of(const std::string& path, Fields fields = {}) {
  try {
    JsonlReader reader(jsonl_files(path), fields);
    Record r;
    while (reader.next(r)) {
    }
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    return m.substr(0, m.rfind(" ["));
  }
  return "(no error)";
}

TEST(Jsonl, ReadsAFoldersPlainAndGzipFilesInNameOrder) {
  Folder dir("order");
  dir.write("b.jsonl.gz", R"({"messages": [{"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2"}]})"
                          "\n\n"
                          R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "no answer"}]})"
                          "\n");
  dir.write("a.jsonl", R"({"messages": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1", "extra": 1}]})"
                       "\n"
                       R"({"messages": []})"
                       "\n"
                       R"({"messages": [{"role": "user", "content": "Q3"}, {"role": "assistant", "content": "A3"}]})");
  dir.write("notes.txt", "not read");
  JsonlReader reader(jsonl_files(dir.path()));
  std::vector<std::string> answers, places;
  Record r;
  while (reader.next(r)) {
    EXPECT_EQ(r.shape, Shape::messages);
    answers.push_back(r.value[1]["content"].get<std::string>());
    places.push_back(fmt::format("{}:{}", fs::path(r.file).filename().string(), r.line));
  }
  EXPECT_EQ(answers, (std::vector<std::string>{"A1", "A3", "A2"}));
  EXPECT_EQ(places, (std::vector<std::string>{"a.jsonl:1", "a.jsonl:3", "b.jsonl.gz:1"}));
  EXPECT_EQ(reader.skipped().empty_conversations, 1u);
  EXPECT_EQ(reader.skipped().without_assistant, 1u);
}

TEST(Jsonl, EachShapeByItsKeysAndRenamedByFields) {
  Folder dir("shapes");
  const std::string pc = dir.write("pc.jsonl", R"({"prompt": "2+2=", "completion": "4"})");
  const std::string text = dir.write("text.jsonl", R"({"body": "plain text", "id": 7})");
  JsonlReader a({pc});
  Record r;
  ASSERT_TRUE(a.next(r));
  EXPECT_EQ(r.shape, Shape::prompt_completion);
  EXPECT_EQ(r.value["completion"], "4");
  Fields renamed;
  renamed.text = "body";
  JsonlReader b({text}, renamed);
  ASSERT_TRUE(b.next(r));
  EXPECT_EQ(r.shape, Shape::text);
  EXPECT_EQ(r.value, "plain text");
  EXPECT_FALSE(b.next(r));
}

TEST(Jsonl, ABadLineIsAnErrorNamingTheFileTheLineAndTheKey) {
  Folder dir("errors");
  auto bad = [&](const std::string& second_line) {
    const std::string p = dir.write("d.jsonl",
                                    std::string(
                                        R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})") +
                                        "\n" + second_line + "\n");
    return error_of(p);
  };
  const std::string p = dir.path() + "/d.jsonl";
  EXPECT_EQ(bad(R"({"messages": [{"role": "user", "content": "q"}, {"role": "bot", "content": "a"}]})"),
            p + ", line 2: messages[1].role \"bot\" is none of system, user, assistant, tool");
  EXPECT_EQ(bad(R"({"messages": [{"role": "user"}]})"), p + ", line 2: messages[0].content must be a string or a list of parts");
  EXPECT_EQ(bad(R"({"messages": "hi"})"), p + ", line 2: \"messages\" must be a list of turns, got string");
  EXPECT_EQ(bad(R"({"text": "t"})"), p + ", line 2: a record of text among records of messages: the data holds one shape");
  EXPECT_EQ(bad(R"({"prompt": "p"})"),
            p + ", line 2: a record of prompt and completion among records of messages: the data holds one shape");
  EXPECT_EQ(bad(R"(["a list"])"), p + ", line 2: a record must be a JSON object, got array");
  EXPECT_EQ(bad(R"({"conversation": []})"), p + ", line 2: the record has none of the keys \"messages\", \"prompt\" and "
                                                "\"completion\", or \"text\" (data.fields names others)");
  const std::string not_json = bad(R"({"messages": [)");
  EXPECT_EQ(not_json.rfind(p + ", line 2: not JSON: ", 0), 0u) << not_json;
  EXPECT_EQ(error_of(dir.write("pc.jsonl", R"({"prompt": "p"})")),
            dir.path() + "/pc.jsonl, line 1: \"completion\" is missing beside \"prompt\"");
  // A gzip file cut short is an error, not the end of its records.
  const std::string whole = dir.write("cut.jsonl.gz",
                                      std::string(R"({"text": "a record long enough to be cut in the middle"})") + "\n");
  fs::resize_file(whole, fs::file_size(whole) - 6);
  try {
    JsonlReader reader({whole});
    Record r;
    while (reader.next(r)) {
    }
    ADD_FAILURE() << "a gzip file cut short read as whole";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("cut.jsonl.gz: the file ends before its gzip stream does"), std::string::npos) << e.what();
  }
  Folder empty("empty");
  EXPECT_EQ(error_of(empty.path()), empty.path() + ": the folder holds no .jsonl or .jsonl.gz file");
  EXPECT_EQ(error_of(empty.path() + "/missing.jsonl"), empty.path() + "/missing.jsonl: no such file or folder");
}

// tools/riddles-chat.sh's conversations from Debian's riddles, read back: the example data of chat
// fine-tuning. A fortune of two question-and-answer pairs is one conversation of four turns.
TEST(Jsonl, TheRiddlesScriptWritesConversationsTheReaderTakes) {
  Folder dir("riddles");
  const std::string out = dir.path() + "/riddles-chat.jsonl";
  ASSERT_EQ(std::system(fmt::format("{}/tools/riddles-chat.sh {} 2>/dev/null >/dev/null", ZEROTH_SOURCE_DIR, out).c_str()), 0);
  JsonlReader reader(jsonl_files(out));
  Record r;
  size_t conversations = 0, four_turns = 0;
  bool elephant = false;
  while (reader.next(r)) {
    ++conversations;
    for (size_t k = 0; k < r.value.size(); ++k) EXPECT_EQ(r.value[k]["role"], k % 2 ? "assistant" : "user") << r.line;
    four_turns += r.value.size() == 4;
    elephant = elephant || (r.value[0]["content"] == "How do you stop an elephant from charging?" &&
                            r.value[1]["content"] == "Take away his credit cards.");
  }
  EXPECT_GE(conversations, 100u);
  EXPECT_GE(four_turns, 1u);
  EXPECT_TRUE(elephant);
  EXPECT_EQ(reader.skipped().without_assistant, 0u);
}

}  // namespace
}  // namespace zeroth::corpus
