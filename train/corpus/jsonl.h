// Training records from JSON Lines files (.jsonl, or .jsonl.gz through zlib): one object a line, in
// one of three shapes told apart by their keys (data.fields renames them): a conversation
// (`messages`: a list of {role, content}), a prompt and its completion, or a text. A line that is not
// one of them is an error naming the file, the line and the key; a conversation with no turn, or
// with no assistant turn, is counted and skipped.
#pragma once

#include <cstddef>  // size_t
#include <memory>   // std::unique_ptr
#include <string>   // std::string
#include <vector>   // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

namespace zeroth::corpus {

enum class Shape { messages, prompt_completion, text };
const char* shape_name(Shape s);

// The keys of each shape (data.fields).
struct Fields {
  std::string messages = "messages", prompt = "prompt", completion = "completion", text = "text";
};

struct Record {
  Shape shape = Shape::text;
  // The conversation's list of turns; {"prompt", "completion"} as strings; or the text as a string.
  nlohmann::ordered_json value;
  std::string file;
  size_t line = 0;  // 1-based
};

struct Skipped {
  size_t empty_conversations = 0, without_assistant = 0;
};

// `path`'s .jsonl and .jsonl.gz files: the file itself, or a folder's, in name order.
// InvalidArgument when there are none.
std::vector<std::string> jsonl_files(const std::string& path);

class JsonlReader {
 public:
  JsonlReader(std::vector<std::string> files, Fields fields = {});
  ~JsonlReader();
  JsonlReader(const JsonlReader&) = delete;
  JsonlReader& operator=(const JsonlReader&) = delete;

  // The next record; false after the last. Every record has the shape of the first.
  bool next(Record& out);
  const Skipped& skipped() const { return skipped_; }

 private:
  class LineSource;
  bool next_line(std::string& line);
  bool record_of(const nlohmann::ordered_json& j, Record& out);
  [[noreturn]] void fail(const std::string& what) const;

  std::vector<std::string> files_;
  Fields fields_;
  size_t file_ = 0, line_ = 0;
  std::unique_ptr<LineSource> source_;
  bool shape_known_ = false;
  Shape shape_ = Shape::text;
  Skipped skipped_;
};

}  // namespace zeroth::corpus
