// Samples packed into rows (data.packing): whole samples placed in rows of model.seq_len positions
// by best-fit decreasing over buffers of samples, each sample's positions from 0, so the model
// attends within each sample only (Gpt::forward's positions), and no target crosses from one
// sample into the next: a sample's last token has none.
#pragma once

#include <cstddef>  // size_t
#include <cstdint>  // int32_t, int64_t, uint32_t
#include <memory>   // std::shared_ptr
#include <string>   // std::string
#include <vector>   // std::vector

#include "train/corpus/rows.h"     // Rows
#include "train/corpus/samples.h"  // Samples

namespace zeroth::corpus {

class Packed final : public Rows {
 public:
  // The samples a buffer at a time (`buffer` samples in their order), each buffer's longest first
  // into the row whose room is the smallest that holds it, else a new row. Every sample must be at
  // most width() tokens (Samples read with max_tokens = model.seq_len).
  Packed(std::shared_ptr<const Samples> samples, int width, size_t buffer = 4096);

  int64_t size() const override { return static_cast<int64_t>(first_.size()) - 1; }
  int width() const override { return width_; }
  int64_t fill(int64_t i, int32_t* tokens, int32_t* targets, int32_t* positions = nullptr) const override;
  int64_t counted(int64_t i) const override { return counted_[static_cast<size_t>(i)]; }
  int length(int64_t i) const override;
  size_t tokens() const override { return samples_->tokens(); }
  size_t host_bytes() const override;
  int max_token() const override { return samples_->max_token(); }
  std::string unit() const override { return "packed rows"; }
  bool packed() const override { return true; }

  // Row i's samples, in the order they lie in it.
  std::vector<uint32_t> samples_of(int64_t i) const;
  const Samples& samples() const { return *samples_; }
  // The share of the rows' positions that samples fill (the rest is padding).
  double fill_ratio() const;

 private:
  std::shared_ptr<const Samples> samples_;
  int width_;
  std::vector<uint32_t> order_;   // the samples, row after row
  std::vector<size_t> first_;     // row i's samples: order_[first_[i], first_[i + 1])
  std::vector<int64_t> counted_;  // per row
};

}  // namespace zeroth::corpus
