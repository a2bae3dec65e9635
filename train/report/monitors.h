// DeepSpeed's file monitors, written by rank 0: `tensorboard` (an event file TensorBoard reads)
// and `csv_monitor` (one CSV file per tag, "step,<last part of the tag>" then a row per record).
// Both take DeepSpeed's tags (Train/Samples/train_loss, Train/Samples/lr, ...) at DeepSpeed's x,
// the samples trained so far.
#pragma once

#include <cstdio>   // std::FILE
#include <map>      // std::map
#include <memory>   // std::unique_ptr
#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

#include "train/report/event_file.h"    // EventFile
#include "train/config/train_config.h"  // MonitorConfig

namespace zeroth {

using Scalars = std::vector<std::pair<std::string, double>>;

class Monitors {
 public:
  // `resumed`: the run continues one whose files are there, so CSV files are appended to (a new
  // event file is TensorBoard's own way); otherwise this run's files replace the last run's.
  Monitors(const MonitorConfig& config, bool resumed);
  ~Monitors();
  Monitors(const Monitors&) = delete;
  Monitors& operator=(const Monitors&) = delete;

  bool enabled() const { return events_ != nullptr || !csv_dir_.empty(); }
  void write(int64_t samples, const Scalars& scalars);
  // Written through to the files (each print, and the end).
  void flush();

 private:
  std::FILE* csv_file(const std::string& tag);

  std::unique_ptr<EventFile> events_;
  std::string csv_dir_;
  bool resumed_ = false;
  std::map<std::string, std::FILE*> csv_;  // by tag
};

}  // namespace zeroth
