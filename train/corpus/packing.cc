#include "train/corpus/packing.h"

#include <algorithm>  // std::stable_sort, std::min
#include <map>        // std::multimap

#include "core/error.h"  // ZEROTH_THROW

namespace zeroth::corpus {

Packed::Packed(std::shared_ptr<const Samples> samples, int width, size_t buffer) : samples_(std::move(samples)), width_(width) {
  const size_t n = static_cast<size_t>(samples_->size());
  std::vector<std::vector<uint32_t>> rows;
  std::vector<size_t> used;
  for (size_t lo = 0; lo < n; lo += buffer) {
    const size_t hi = std::min(n, lo + buffer);
    std::vector<uint32_t> order;
    for (size_t i = lo; i < hi; ++i) order.push_back(static_cast<uint32_t>(i));
    std::stable_sort(order.begin(), order.end(),
                     [&](uint32_t a, uint32_t b) { return samples_->ids(a).size() > samples_->ids(b).size(); });
    // Rows of this buffer by their room left; the smallest room that holds a sample takes it.
    std::multimap<size_t, size_t> room;
    for (const uint32_t i : order) {
      const size_t len = samples_->ids(i).size();
      if (len > static_cast<size_t>(width_))
        ZEROTH_THROW(InvalidArgument, "sample {} ({}) is {} tokens, more than a packed row's {}", i, samples_->source(i), len, width_);
      auto it = room.lower_bound(len);
      size_t row = 0;
      if (it == room.end()) {
        row = rows.size();
        rows.emplace_back();
        used.push_back(0);
      } else {
        row = it->second;
        room.erase(it);
      }
      rows[row].push_back(i);
      used[row] += len;
      if (used[row] < static_cast<size_t>(width_)) room.emplace(width_ - used[row], row);
    }
  }
  first_.push_back(0);
  for (const auto& r : rows) {
    int64_t c = 0;
    for (const uint32_t i : r) {
      order_.push_back(i);
      c += samples_->counted(i);
    }
    first_.push_back(order_.size());
    counted_.push_back(c);
  }
}

std::vector<uint32_t> Packed::samples_of(int64_t i) const {
  return {order_.begin() + static_cast<std::ptrdiff_t>(first_[i]), order_.begin() + static_cast<std::ptrdiff_t>(first_[i + 1])};
}

int64_t Packed::fill(int64_t i, int32_t* tokens, int32_t* targets, int32_t* positions) const {
  int at = 0;
  for (size_t k = first_[i]; k < first_[i + 1]; ++k) {
    const uint32_t s = order_[k];
    const int n = static_cast<int>(samples_->ids(s).size());
    samples_->place(s, tokens + at, targets + at);
    if (positions != nullptr)
      for (int t = 0; t < n; ++t) positions[at + t] = t;
    at += n;
  }
  // The room left is one more sample of padding: it attends to itself only and counts nothing.
  for (int t = at; t < width_; ++t) {
    tokens[t] = at > 0 ? tokens[at - 1] : 0;
    targets[t] = kNotCounted;
    if (positions != nullptr) positions[t] = t - at;
  }
  return counted(i);
}

int Packed::length(int64_t i) const {
  size_t used = 0;
  for (size_t k = first_[i]; k < first_[i + 1]; ++k) used += samples_->ids(order_[k]).size();
  return static_cast<int>(used);
}

size_t Packed::host_bytes() const {
  return samples_->host_bytes() + order_.capacity() * sizeof(uint32_t) + first_.capacity() * sizeof(size_t) +
         counted_.capacity() * sizeof(int64_t);
}

double Packed::fill_ratio() const {
  return size() == 0 ? 0.0 : static_cast<double>(samples_->tokens()) / (static_cast<double>(size()) * width_);
}

}  // namespace zeroth::corpus
