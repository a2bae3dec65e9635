// The rows a run trains on and validates with, as the loader cuts them into micro-batches: windows
// of a token stream (train/data.h), or tokenized samples (train/corpus/samples.h), each row
// model.seq_len inputs and their targets.
#pragma once

#include <cstddef>  // size_t
#include <cstdint>  // int32_t, int64_t
#include <string>   // std::string

namespace zeroth::corpus {

// A target of kNotCounted adds nothing to the loss or its gradient (a prompt's tokens, padding).
inline constexpr int32_t kNotCounted = -1;

class Rows {
 public:
  virtual ~Rows() = default;
  virtual int64_t size() const = 0;
  // Inputs and targets per row: model.seq_len.
  virtual int width() const = 0;
  // Row i's width() inputs and targets; returns the targets that count. `positions` (null: not
  // wanted) gets each input's position in its sample, which restarts at 0 where a packed row's
  // next sample begins (Gpt::forward's positions).
  virtual int64_t fill(int64_t i, int32_t* tokens, int32_t* targets, int32_t* positions = nullptr) const = 0;
  // Whether a row may hold several samples, so the model needs the positions.
  virtual bool packed() const { return false; }
  // The targets of row i that count, without filling it.
  virtual int64_t counted(int64_t i) const = 0;
  // Row i's positions that hold tokens of its samples, from its start; the rest is padding, which
  // a batch of shorter rows may leave out.
  virtual int length(int64_t) const { return width(); }
  // Tokens the rows are made of, for the start box; the host memory they hold.
  virtual size_t tokens() const = 0;
  virtual size_t host_bytes() const = 0;
  virtual int max_token() const = 0;
  // What a row is, for messages: "sequences of 65 tokens", "samples".
  virtual std::string unit() const = 0;
};

}  // namespace zeroth::corpus
