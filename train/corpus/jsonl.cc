#include "train/corpus/jsonl.h"

#include <zlib.h>  // gzopen, gzread, gzclose

#include <algorithm>   // std::sort
#include <cerrno>      // errno
#include <cstring>     // std::memchr
#include <filesystem>  // std::filesystem::directory_iterator

#include "core/error.h"  // ZEROTH_THROW

namespace zeroth::corpus {

const char* shape_name(Shape s) {
  switch (s) {
    case Shape::messages: return "messages";
    case Shape::prompt_completion: return "prompt and completion";
    case Shape::text: return "text";
  }
  return "?";
}

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool is_jsonl(const std::string& name) { return ends_with(name, ".jsonl") || ends_with(name, ".jsonl.gz"); }

}  // namespace

std::vector<std::string> jsonl_files(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    if (!is_jsonl(path)) ZEROTH_THROW(InvalidArgument, "{}: a JSON Lines file ends in .jsonl or .jsonl.gz", path);
    return {path};
  }
  if (!fs::is_directory(path, ec)) ZEROTH_THROW(InvalidArgument, "{}: no such file or folder", path);
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(path, ec))
    if (e.is_regular_file() && is_jsonl(e.path().filename().string())) files.push_back(e.path().string());
  if (ec) ZEROTH_THROW(InvalidArgument, "{}: cannot list the folder: {}", path, ec.message());
  if (files.empty()) ZEROTH_THROW(InvalidArgument, "{}: the folder holds no .jsonl or .jsonl.gz file", path);
  std::sort(files.begin(), files.end());
  return files;
}

// A file's bytes through zlib, which reads a plain file as it is and a gzip one inflated.
class JsonlReader::LineSource {
 public:
  explicit LineSource(const std::string& path) : path_(path), file_(gzopen(path.c_str(), "rb")) {
    if (file_ == nullptr) ZEROTH_THROW(IoError, "gzopen({}, \"rb\") failed: {}", path, detail::errno_text(errno));
    gzbuffer(file_, 1 << 18);
  }
  ~LineSource() { gzclose(file_); }
  LineSource(const LineSource&) = delete;
  LineSource& operator=(const LineSource&) = delete;

  bool next(std::string& line) {
    line.clear();
    while (true) {
      if (at_ == end_) {
        const int n = gzread(file_, buf_, sizeof buf_);
        if (n < 0) {
          int code = 0;
          const char* why = gzerror(file_, &code);
          ZEROTH_THROW(IoError, "gzread({}) failed: {}", path_, why != nullptr ? why : "unknown error");
        }
        if (n == 0) {
          // zlib ends a gzip file cut short as it ends a whole one, and says so only here.
          int code = Z_OK;
          gzerror(file_, &code);
          if (code == Z_BUF_ERROR) ZEROTH_THROW(IoError, "{}: the file ends before its gzip stream does (cut short?)", path_);
          return !line.empty();
        }
        at_ = 0;
        end_ = static_cast<size_t>(n);
      }
      const char* nl = static_cast<const char*>(std::memchr(buf_ + at_, '\n', end_ - at_));
      const size_t stop = nl != nullptr ? static_cast<size_t>(nl - buf_) : end_;
      line.append(buf_ + at_, stop - at_);
      at_ = stop;
      if (nl != nullptr) {
        ++at_;
        return true;
      }
    }
  }

 private:
  std::string path_;
  gzFile file_;
  char buf_[1 << 16];
  size_t at_ = 0, end_ = 0;
};

JsonlReader::JsonlReader(std::vector<std::string> files, Fields fields) : files_(std::move(files)), fields_(std::move(fields)) {}
JsonlReader::~JsonlReader() = default;

void JsonlReader::fail(const std::string& what) const { ZEROTH_THROW(InvalidArgument, "{}, line {}: {}", files_[file_], line_, what); }

bool JsonlReader::next_line(std::string& line) {
  while (file_ < files_.size()) {
    if (!source_) {
      source_ = std::make_unique<LineSource>(files_[file_]);
      line_ = 0;
    }
    if (source_->next(line)) {
      ++line_;
      return true;
    }
    source_.reset();
    ++file_;
  }
  return false;
}

bool JsonlReader::next(Record& out) {
  std::string line;
  while (next_line(line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // a blank line
    nlohmann::ordered_json j;
    try {
      j = nlohmann::ordered_json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      fail(std::string("not JSON: ") + e.what());
    }
    if (!j.is_object()) fail(std::string("a record must be a JSON object, got ") + j.type_name());
    if (record_of(j, out)) return true;
  }
  return false;
}

bool JsonlReader::record_of(const nlohmann::ordered_json& j, Record& out) {
  Shape shape;
  if (j.contains(fields_.messages)) {
    shape = Shape::messages;
  } else if (j.contains(fields_.prompt) || j.contains(fields_.completion)) {
    shape = Shape::prompt_completion;
  } else if (j.contains(fields_.text)) {
    shape = Shape::text;
  } else {
    fail("the record has none of the keys \"" + fields_.messages + "\", \"" + fields_.prompt + "\" and \"" + fields_.completion +
         "\", or \"" + fields_.text + "\" (data.fields names others)");
  }
  if (shape_known_ && shape != shape_) {
    fail(std::string("a record of ") + shape_name(shape) + " among records of " + shape_name(shape_) + ": the data holds one shape");
  }
  shape_known_ = true;
  shape_ = shape;
  out.shape = shape;
  out.file = files_[file_];
  out.line = line_;
  if (shape == Shape::text) {
    const auto& t = j[fields_.text];
    if (!t.is_string()) fail("\"" + fields_.text + "\" must be a string, got " + t.type_name());
    out.value = t;
    return true;
  }
  if (shape == Shape::prompt_completion) {
    for (const std::string* key : {&fields_.prompt, &fields_.completion}) {
      if (!j.contains(*key))
        fail("\"" + *key + "\" is missing beside \"" + (key == &fields_.prompt ? fields_.completion : fields_.prompt) + "\"");
      if (!j[*key].is_string()) fail("\"" + *key + "\" must be a string, got " + j[*key].type_name());
    }
    out.value = {{"prompt", j[fields_.prompt]}, {"completion", j[fields_.completion]}};
    return true;
  }
  const auto& turns = j[fields_.messages];
  if (!turns.is_array()) fail("\"" + fields_.messages + "\" must be a list of turns, got " + turns.type_name());
  bool assistant = false;
  for (size_t k = 0; k < turns.size(); ++k) {
    const auto& t = turns[k];
    const std::string where = fields_.messages + "[" + std::to_string(k) + "]";
    if (!t.is_object()) fail(where + " must be an object {\"role\", \"content\"}, got " + t.type_name());
    if (!t.contains("role") || !t["role"].is_string()) fail(where + ".role must be a string");
    const std::string role = t["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      fail(where + ".role \"" + role + "\" is none of system, user, assistant, tool");
    const bool content_ok = t.contains("content") && (t["content"].is_string() || t["content"].is_array() ||
                                                      (t["content"].is_null() && t.contains("tool_calls")));
    if (!content_ok) fail(where + ".content must be a string or a list of parts");
    assistant = assistant || role == "assistant";
  }
  if (turns.empty()) {
    ++skipped_.empty_conversations;
    return false;
  }
  if (!assistant) {
    ++skipped_.without_assistant;
    return false;
  }
  out.value = turns;
  return true;
}

}  // namespace zeroth::corpus
