// What a run's metrics.jsonl holds, read for the report: the step and validation records as
// columns of numbers by step (the last record of each step kept: a resumed or restarted run records
// again the steps it redoes), and the records that carry structure (start, summary, error) as
// JSON. Step records are read without building a JSON object per line: a run of
// 100k steps is read in a fraction of a second.
#pragma once

#include <cstdint>  // int64_t
#include <map>      // std::map
#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

#include <nlohmann/json.hpp>

namespace zeroth::report {

// Records by step, one column per key. A key a record lacks is absent from its row; a value that
// is not a number (null for a non-finite loss) reads as NaN; true and false as 1 and 0.
class StepTable {
 public:
  using Fields = std::vector<std::pair<std::string, double>>;

  // The record of `step`, replacing an earlier one of the same step whole.
  void add(int64_t step, const Fields& fields);

  bool empty() const { return row_of_step_.empty(); }
  int64_t last_step() const { return row_of_step_.empty() ? 0 : row_of_step_.rbegin()->first; }
  // Whether any kept record has `key`.
  bool has(const std::string& key) const;
  // `key` of the last step's record; NaN where that record lacks it.
  double last(const std::string& key) const;
  // (step, value) of every kept record that has `key`, in step order.
  std::vector<std::pair<int64_t, double>> column(const std::string& key) const;

 private:
  struct Column {
    std::vector<double> values;
    std::vector<char> present;
  };
  const Column* find(const std::string& key) const;
  bool in(const Column& c, size_t row) const { return row < c.present.size() && c.present[row]; }

  std::map<int64_t, size_t> row_of_step_;
  std::map<std::string, Column> columns_;
  size_t rows_ = 0;
};

struct RunRecords {
  StepTable steps, evals;
  nlohmann::json start, summary;  // null when the file holds none
  std::string error;              // the last error record since the last start: how a failed run ended
};

// Reads `dir`/metrics.jsonl. Lines cut short by a crash are skipped. IoError when it cannot be read.
RunRecords read_run_records(const std::string& dir);

}  // namespace zeroth::report
