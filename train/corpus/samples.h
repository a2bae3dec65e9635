// Training samples from JSON Lines records (train/corpus/jsonl.h), tokenized and marked where the
// loss trains: a conversation rendered by the tokenizer's chat template, a prompt followed by its
// completion, or a text; the last two end with the tokenizer's end-of-sequence token, as TRL's
// trainers end them. What counts (data.loss_on) is a set of byte spans of the rendered text (the
// assistant's turns as the template gives them, the completion, or everything), and a token counts
// where its bytes meet a span (Hugging Face's offset mapping), so the mask follows the tokenizer's
// own token boundaries.
#pragma once

#include <cstddef>  // size_t
#include <cstdint>  // int32_t, uint8_t, uint32_t
#include <span>     // std::span
#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

#include "train/corpus/jsonl.h"  // Fields, Shape, Skipped
#include "train/corpus/rows.h"   // Rows

namespace zeroth {
class ChatTemplate;
class Tokenizer;
}  // namespace zeroth

namespace zeroth::corpus {

// data.loss_on: `automatic` is the shape's own (assistant for conversations, completion for a prompt
// and its completion, all for texts).
enum class LossOn : uint8_t { automatic, assistant, completion, all };
const char* loss_on_name(LossOn l);

struct SampleOptions {
  LossOn loss_on = LossOn::automatic;
  // A sample's tokens beyond this (model.seq_len + 1) are cut when `truncate`, else the sample is
  // an error naming its file and line.
  size_t max_tokens = 0;
  bool truncate = true;
  const ChatTemplate* chat_template = nullptr;  // for conversations
  std::string eos;                              // after a completion or a text ("" when the tokenizer has none)
};

struct SampleStats {
  Skipped skipped;                              // conversations the reader skipped
  size_t truncated = 0;                         // samples cut to max_tokens
  size_t nothing_trained = 0;                   // samples skipped because no target of them counts (after the cut)
  size_t samples = 0, tokens = 0, counted = 0;  // the samples kept, their tokens, and the targets that count
};

// The samples as rows of max_tokens - 1 inputs: sample i alone in row i, its targets its next
// tokens where they count, padded to the width with targets that do not.
class Samples final : public Rows {
 public:
  // Every record of `files`, in order. InvalidArgument naming the file and line of a record the
  // template cannot render, of a loss_on the shape has no span for, or of a sample longer than
  // max_tokens without truncate.
  static Samples read(const std::vector<std::string>& files, const Fields& fields, const Tokenizer& tokenizer,
                      const SampleOptions& options);

  std::span<const int32_t> ids(size_t i) const;
  // 1 where token j counts as the target of the prediction from token j - 1 (j = 0: never).
  std::span<const uint8_t> trained(size_t i) const;
  // "file:line" of the record sample i came from.
  std::string source(size_t i) const;
  Shape shape() const { return shape_; }
  LossOn loss_on() const { return loss_on_; }
  const SampleStats& stats() const { return stats_; }
  // The last n samples, moved out (a validation split).
  Samples take_tail(size_t n);

  int64_t size() const override { return static_cast<int64_t>(begin_.size()) - 1; }
  int width() const override { return width_; }
  int64_t fill(int64_t i, int32_t* tokens, int32_t* targets, int32_t* positions = nullptr) const override;
  // Sample i's n tokens at tokens[0, n), the targets of the first n - 1 (those that count) at
  // targets[0, n - 1) and -1 at targets[n - 1]: what it takes in a packed row.
  int64_t place(size_t i, int32_t* tokens, int32_t* targets) const;
  int64_t counted(int64_t i) const override { return counted_[static_cast<size_t>(i)]; }
  int length(int64_t i) const override { return static_cast<int>(ids(static_cast<size_t>(i)).size()) - 1; }
  size_t tokens() const override { return ids_.size(); }
  size_t host_bytes() const override;
  int max_token() const override;
  std::string unit() const override { return "samples"; }

 private:
  void add(const std::vector<int32_t>& ids, const std::vector<uint8_t>& trained, uint32_t file, size_t line);

  std::vector<int32_t> ids_;
  std::vector<uint8_t> trained_;
  std::vector<size_t> begin_{0};
  std::vector<uint32_t> counted_;
  std::vector<std::pair<uint32_t, uint32_t>> sources_;  // file index, line
  std::vector<std::string> files_;
  Shape shape_ = Shape::text;
  LossOn loss_on_ = LossOn::all;
  int width_ = 0;
  SampleStats stats_;
};

}  // namespace zeroth::corpus
