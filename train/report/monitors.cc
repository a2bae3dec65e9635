#include "train/report/monitors.h"

#include <cerrno>      // errno
#include <filesystem>  // std::filesystem

#include <fmt/format.h>

#include "core/error.h"

namespace zeroth {

Monitors::Monitors(const MonitorConfig& config, bool resumed) : resumed_(resumed) {
  if (config.tensorboard.enabled) {
    const std::string dir = config.tensorboard.dir();
    // TensorBoard reads every event file in a folder as one run: a fresh run starts it empty.
    if (!resumed) {
      std::error_code ec;
      for (const auto& entry : std::filesystem::directory_iterator(dir, ec))
        if (entry.path().filename().string().starts_with("events.out.tfevents.")) std::filesystem::remove(entry.path(), ec);
    }
    events_ = std::make_unique<EventFile>(dir);
  }
  if (config.csv.enabled) {
    csv_dir_ = config.csv.dir();
    std::error_code ec;
    std::filesystem::create_directories(csv_dir_, ec);
    if (ec) ZEROTH_THROW(IoError, "cannot make the csv_monitor folder {}: {}", csv_dir_, ec.message());
  }
}

Monitors::~Monitors() {
  for (auto& [tag, file] : csv_) std::fclose(file);
}

std::FILE* Monitors::csv_file(const std::string& tag) {
  if (auto it = csv_.find(tag); it != csv_.end()) return it->second;
  std::string name = tag;
  for (char& ch : name)
    if (ch == '/' || ch == ' ') ch = '_';
  const std::string path = csv_dir_ + "/" + name + ".csv";
  const bool append = resumed_ && std::filesystem::exists(path) && std::filesystem::file_size(path) > 0;
  std::FILE* f = std::fopen(path.c_str(), append ? "a" : "w");
  if (f == nullptr) ZEROTH_THROW(IoError, "fopen({}) failed: {}", path, detail::errno_text(errno));
  csv_.emplace(tag, f);
  if (!append) std::fprintf(f, "step,%s\n", tag.substr(tag.rfind('/') + 1).c_str());
  return f;
}

void Monitors::write(int64_t samples, const Scalars& scalars) {
  if (events_ != nullptr) {
    std::vector<std::pair<std::string, float>> values;
    values.reserve(scalars.size());
    for (const auto& [tag, value] : scalars) values.emplace_back(tag, static_cast<float>(value));
    events_->write_scalars(samples, values);
  }
  if (csv_dir_.empty()) return;
  for (const auto& [tag, value] : scalars) {
    // The shortest text that reads back as the same double, as metrics.jsonl holds it.
    const std::string row = fmt::format("{},{}\n", samples, value);
    std::FILE* f = csv_file(tag);
    if (std::fputs(row.c_str(), f) < 0)
      ZEROTH_THROW(IoError, "writing {}/{}.csv failed: {}; the disk may be full", csv_dir_, tag, detail::errno_text(errno));
  }
}

void Monitors::flush() {
  if (events_ != nullptr) events_->flush();
  for (auto& [tag, file] : csv_) {
    if (std::fflush(file) != 0)
      ZEROTH_THROW(IoError, "writing the csv_monitor file of {} in {} failed: {}; the disk may be full", tag, csv_dir_,
                   detail::errno_text(errno));
  }
}

}  // namespace zeroth
