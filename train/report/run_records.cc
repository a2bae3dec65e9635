#include "train/report/run_records.h"

#include <cmath>    // std::nan
#include <fstream>  // std::ifstream

#include "core/error.h"

namespace zeroth::report {

namespace {

using json = nlohmann::json;

// The top-level fields of one line as numbers, for json::sax_parse: no object is built. A nested
// value reads as NaN. The rare lines of another kind than a step's are read again as JSON.
class FlatLine : public nlohmann::json_sax<json> {
 public:
  StepTable::Fields fields;
  bool step_is_integer = false;

  void clear() {
    fields.clear();
    step_is_integer = false;
    depth_ = 0;
  }
  bool null() override { return value(std::nan("")); }
  bool boolean(bool v) override { return value(v ? 1 : 0); }
  bool number_integer(number_integer_t v) override { return integer(static_cast<double>(v)); }
  bool number_unsigned(number_unsigned_t v) override { return integer(static_cast<double>(v)); }
  bool number_float(number_float_t v, const string_t&) override { return value(v); }
  bool string(string_t&) override { return value(std::nan("")); }
  bool binary(binary_t&) override { return value(std::nan("")); }
  bool start_object(std::size_t) override { return open(); }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    if (depth_ == 1) fields.emplace_back(k, std::nan(""));
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  bool value(double v) {
    if (depth_ == 1 && !fields.empty()) fields.back().second = v;
    return true;
  }
  bool integer(double v) {
    if (depth_ == 1 && !fields.empty() && fields.back().first == "step") step_is_integer = true;
    return value(v);
  }
  bool open() {
    ++depth_;
    return true;
  }
  bool close() {
    --depth_;
    return true;
  }
  int depth_ = 0;
};

bool names(const StepTable::Fields& fields, const char* key) {
  for (const auto& [k, v] : fields)
    if (k == key) return true;
  return false;
}

double field(const StepTable::Fields& fields, const char* key) {
  for (const auto& [k, v] : fields)
    if (k == key) return v;
  return std::nan("");
}

}  // namespace

void StepTable::add(int64_t step, const Fields& fields) {
  const size_t row = rows_++;
  row_of_step_[step] = row;
  for (const auto& [key, value] : fields) {
    Column& c = columns_[key];
    c.values.resize(row + 1, std::nan(""));
    c.present.resize(row + 1, 0);
    c.values[row] = value;
    c.present[row] = 1;
  }
}

const StepTable::Column* StepTable::find(const std::string& key) const {
  const auto it = columns_.find(key);
  return it == columns_.end() ? nullptr : &it->second;
}

bool StepTable::has(const std::string& key) const {
  const Column* c = find(key);
  if (c == nullptr) return false;
  for (const auto& [step, row] : row_of_step_)
    if (in(*c, row)) return true;
  return false;
}

double StepTable::last(const std::string& key) const {
  const Column* c = find(key);
  if (c == nullptr || row_of_step_.empty()) return std::nan("");
  const size_t row = row_of_step_.rbegin()->second;
  return in(*c, row) ? c->values[row] : std::nan("");
}

std::vector<std::pair<int64_t, double>> StepTable::column(const std::string& key) const {
  std::vector<std::pair<int64_t, double>> out;
  const Column* c = find(key);
  if (c == nullptr) return out;
  for (const auto& [step, row] : row_of_step_)
    if (in(*c, row)) out.emplace_back(step, c->values[row]);
  return out;
}

RunRecords read_run_records(const std::string& dir) {
  std::ifstream in(dir + "/metrics.jsonl");
  if (!in) ZEROTH_THROW(IoError, "{}/metrics.jsonl cannot be read: give the folder of a zeroth run (its run.output_dir)", dir);
  RunRecords r;
  FlatLine flat;
  for (std::string line; std::getline(in, line);) {
    flat.clear();
    if (!json::sax_parse(line, &flat) || flat.fields.empty()) continue;  // a line cut short by a crash
    const bool structured = names(flat.fields, "start") || names(flat.fields, "summary") || names(flat.fields, "error") ||
                            names(flat.fields, "checkpoint");
    if (!structured) {
      if (!flat.step_is_integer) continue;
      const auto step = static_cast<int64_t>(field(flat.fields, "step"));
      if (names(flat.fields, "val_loss")) r.evals.add(step, flat.fields);
      else if (names(flat.fields, "loss")) r.steps.add(step, flat.fields);
      continue;
    }
    json m = json::parse(line, nullptr, false);
    if (m.contains("start")) {
      // A resumed or restarted run goes on in the same file: how an earlier attempt ended is past.
      r.start = std::move(m["start"]);
      r.summary = nullptr;
      r.error.clear();
    } else if (m.contains("summary")) r.summary = std::move(m["summary"]);
    else if (m.contains("error")) r.error = m["error"].is_string() ? m["error"].get<std::string>() : m["error"].dump();
  }
  return r;
}

}  // namespace zeroth::report
