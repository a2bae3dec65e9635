// Training data: token streams (llm.c's .bin files, text as bytes, a synthetic source for tests),
// JSON Lines samples (train/corpus/samples.h), and the data-parallel loader that cuts their rows
// into micro-batches.
//
// The loader is a pure function of (step, micro-step, rank): sample i of the run is row
// p = perm_epoch(i mod S) (for a token stream the window tokens[p * T, p * T + T + 1)), S rows per
// epoch, a permutation seeded by (seed, epoch). Optimizer step k takes samples [k G, (k + 1) G) with G = the global
// batch; rank r's micro-step m the slice starting at (r * gas + m) * micro. So every world size
// sees the same global batches, and a run resumes exactly from its step count.
#pragma once

#include <cstddef>      // size_t
#include <cstdint>      // int32_t, int64_t, uint16_t
#include <memory>       // std::shared_ptr
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include "train/config/train_config.h"  // TrainConfig
#include "train/corpus/rows.h"          // Rows
#include "train/corpus/samples.h"       // SampleStats
#include "train/text/chat_template.h"   // ChatTemplate
#include "train/text/tokenizer.h"       // Tokenizer

namespace zeroth {

class TokenData {
 public:
  // llm.c's format: a header of 256 int32 (magic 20240520, version 1, token count) then uint16
  // tokens, or (magic 20240801, version 7: llm.c's Llama 3 files) uint32 tokens; mapped, not
  // read. IoError / InvalidArgument naming the path and what is wrong.
  static TokenData open_bin(const std::string& path);
  // Text tokenized with `tokenizer` (a Tokenizer::open path), through a token file in `cache_dir`
  // named by the tokenizer's bytes and the text files' names, sizes and modification times:
  // written once (atomically, with a progress line on stderr when `progress`), then mapped like
  // any token file; the text is not read again while the file is there.
  static TokenData open_tokenized(const std::string& text, const std::string& tokenizer, const std::string& cache_dir,
                                  bool progress = true);
  // Every byte is a token (vocabulary 256). A folder: its text files, concatenated in name order.
  static TokenData open_text(const std::string& path);
  // A first-order Markov source: each token has 4 possible successors, chosen from the seed, so a
  // model can learn it down to ln 4 = 1.386 nats. Deterministic for (vocab, tokens, seed).
  static TokenData synthetic(int vocab, int64_t tokens, uint64_t seed);

  size_t size() const { return size_; }
  int32_t operator[](size_t i) const {
    return width_ == 2 ? static_cast<const uint16_t*>(data_)[i] : static_cast<int32_t>(static_cast<const uint32_t*>(data_)[i]);
  }
  // Tokens [begin, end), sharing the storage.
  TokenData slice(size_t begin, size_t end) const;
  int max_token() const;  // largest token id (scans the data)
  // Bytes of memory the whole storage holds (a slice's too): what was read into the heap, or a
  // mapped token file's tokens, whose pages are resident in each mapping once the loader has read
  // them (each rank maps the file).
  size_t heap_bytes() const { return heap_bytes_; }

 private:
  std::shared_ptr<const void> storage_;
  const void* data_ = nullptr;
  int width_ = 2;  // bytes per token
  size_t size_ = 0;
  size_t heap_bytes_ = 0;
};

// Windows of a token stream as rows: row i is the window tokens[i T, i T + T + 1), every target
// counting.
class WindowRows final : public corpus::Rows {
 public:
  // ConfigError naming `what` when the data holds no whole window.
  WindowRows(TokenData data, int seq_len, const char* what = "the data");
  int64_t size() const override { return windows_; }
  int width() const override { return T_; }
  int64_t fill(int64_t i, int32_t* tokens, int32_t* targets, int32_t* positions = nullptr) const override;
  int64_t counted(int64_t) const override { return T_; }
  size_t tokens() const override { return data_.size(); }
  size_t host_bytes() const override { return data_.heap_bytes(); }
  int max_token() const override { return data_.max_token(); }
  std::string unit() const override;

 private:
  TokenData data_;
  int T_;
  int64_t windows_;
};

class Loader {
 public:
  // The training rows, permuted per epoch from `seed`. (Validation reads rows in order from the
  // start: TrainingRun::evaluate_windows.) ConfigError when one global batch would hold a row twice.
  Loader(std::shared_ptr<const corpus::Rows> rows, int micro_batch, int gradient_accumulation, int dp, int rank, uint64_t seed);
  Loader(TokenData data, int seq_len, int micro_batch, int gradient_accumulation, int dp, int rank, uint64_t seed)
      : Loader(std::make_shared<WindowRows>(std::move(data), seq_len), micro_batch, gradient_accumulation, dp, rank, seed) {}

  // Fills tokens and targets ([micro_batch, seq_len] each; a target of -1 does not count) for this
  // rank's micro-step `micro` of optimizer step `step`; returns the targets that count.
  int64_t batch(int64_t step, int micro, int32_t* tokens, int32_t* targets, int32_t* positions = nullptr);
  // The targets that count in optimizer step `step`'s whole global batch (every micro-step of
  // every rank): what its loss is the mean over. Every rank computes the same, reading no tokens.
  int64_t counted(int64_t step);
  // The longest row of step `step`'s global batch (Rows::length): its micro-batches' rows may be
  // cut to it. Every rank computes the same.
  int longest(int64_t step);
  int64_t windows_per_epoch() const { return windows_; }
  // The row the run takes as its sample `sample` (step k takes samples [k G, (k + 1) G)).
  int64_t row_of(int64_t sample) { return window(sample); }
  const corpus::Rows& rows() const { return *rows_; }
  // Samples (sequences) the whole run consumes per optimizer step.
  int64_t global_batch() const { return static_cast<int64_t>(micro_) * gas_ * dp_; }

 private:
  int64_t window(int64_t sample);  // sample index -> row index
  std::shared_ptr<const corpus::Rows> rows_;
  int T_, micro_, gas_, dp_, rank_;
  uint64_t seed_;
  int64_t windows_;
  int64_t epoch_ = -1;
  std::vector<int64_t> perm_;
};

// A run's data: the training rows and the held-out validation rows (data.val, or the last
// data.val_fraction of the training data), checked against the model's vocabulary. JSON Lines
// data also says what its reading skipped and cut.
struct DataSplits {
  std::shared_ptr<const corpus::Rows> train, val;
  bool has_val = false;
  std::shared_ptr<const corpus::Samples> train_samples;  // JSON Lines only
  const corpus::SampleStats* sample_stats = nullptr;     // JSON Lines only: the training samples'
  double packing_fill = 0;                               // data.packing: the training rows' share of positions filled
};

// The run's data and this data-parallel rank's training loader.
struct RunData {
  DataSplits splits;
  Loader train;
};
RunData open_run_data(const TrainConfig& config, int dp, int rank);

// The chat template of data.tokenizer's folder (its tokenizer_config.json), or the file
// data.chat_template names, which overrides it; null when there is neither.
std::unique_ptr<ChatTemplate> chat_template_of(const DataConfig& data);

// A text file, or a folder's text files concatenated in name order (e.g. /usr/share/games/fortunes:
// symbolic links and binary files, those holding a NUL byte, are skipped). IoError /
// InvalidArgument naming the file.
std::string read_texts(const std::string& path);

// `ids` as an llm.c token file at `path`: uint16 tokens, or llm.c's uint32 layout when the
// vocabulary exceeds 65,536 ids; written to .tmp and renamed. InvalidArgument for an id outside
// [0, vocab_size).
void write_token_file(const std::string& path, const std::vector<int32_t>& ids, int vocab_size);
// `text` through `tokenizer` in one pass (what open_tokenized caches and `zeroth tokenize` writes),
// with a progress line on stderr naming `what` when `progress`.
std::vector<int32_t> tokenize_text(const Tokenizer& tokenizer, std::string_view text, const std::string& what, bool progress);
// The host memory one rank's RunData holds: the tokens it read (text and synthetic data; a token
// file's mapping, as its pages become resident) and its training loader's window order. Opens the
// data to count it.
size_t run_data_host_bytes(const TrainConfig& config);

}  // namespace zeroth
