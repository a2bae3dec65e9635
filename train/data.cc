// Token files and the loader.
#include "train/data.h"

#include <fcntl.h>     // open
#include <sys/mman.h>  // mmap, munmap
#include <sys/stat.h>  // fstat
#include <unistd.h>    // close

#include <algorithm>   // std::sort
#include <cerrno>      // errno
#include <chrono>      // std::chrono::steady_clock
#include <cstdio>      // std::fprintf, std::rename
#include <mutex>       // std::mutex
#include <filesystem>  // std::filesystem
#include <cstring>     // std::strerror
#include <fstream>     // std::ifstream
#include <iterator>    // std::istreambuf_iterator

#include <fmt/format.h>  // fmt::format
#include <xxhash.h>      // XXH3_64bits_withSeed

#include "core/error.h"                // ZEROTH_THROW
#include "train/corpus/jsonl.h"        // jsonl_files
#include "train/corpus/packing.h"      // Packed
#include "train/text/chat_template.h"  // ChatTemplate
#include "train/text/tokenizer.h"      // Tokenizer, check_utf8

namespace zeroth {
namespace {

constexpr int32_t kBinMagic = 20240520, kBinMagic32 = 20240801;
constexpr int32_t kBinVersion = 1, kBinVersion32 = 7;
constexpr size_t kBinHeaderBytes = 256 * sizeof(int32_t);

// splitmix64: a portable stream of 64-bit values (std:: distributions differ between libraries).
uint64_t mix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

struct Mapping {
  void* addr = nullptr;
  size_t bytes = 0;
  ~Mapping() {
    if (addr != nullptr) munmap(addr, bytes);
  }
};

}  // namespace

TokenData TokenData::open_bin(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) ZEROTH_THROW(IoError, "open(\"{}\", O_RDONLY): {}", path, std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    ZEROTH_THROW(IoError, "fstat(\"{}\"): {}", path, std::strerror(err));
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  if (bytes < kBinHeaderBytes) {
    ::close(fd);
    ZEROTH_THROW(
        InvalidArgument,
        "{} is {} bytes, shorter than the 1024-byte header of an llm.c token file; set data.format to \"text\" for plain text", path,
        bytes);
  }
  auto map = std::make_shared<Mapping>();
  map->addr = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (map->addr == MAP_FAILED) {
    map->addr = nullptr;
    ZEROTH_THROW(IoError, "mmap(\"{}\", {} bytes): {}", path, bytes, std::strerror(err));
  }
  map->bytes = bytes;
  const auto* header = static_cast<const int32_t*>(map->addr);
  if (header[0] != kBinMagic && header[0] != kBinMagic32) {
    ZEROTH_THROW(
        InvalidArgument,
        "{} is not an llm.c token file: magic {} instead of {} (uint16 tokens) or {} (uint32); set data.format to \"text\" for "
        "plain text",
        path, header[0], kBinMagic, kBinMagic32);
  }
  const int width = header[0] == kBinMagic ? 2 : 4;
  if (header[1] != (width == 2 ? kBinVersion : kBinVersion32)) {
    ZEROTH_THROW(InvalidArgument, "{}: llm.c token file version {} with magic {}; zeroth reads version {} there", path, header[1],
                 header[0], width == 2 ? kBinVersion : kBinVersion32);
  }
  const size_t n = static_cast<uint32_t>(header[2]);
  if (kBinHeaderBytes + width * n != bytes) {
    ZEROTH_THROW(
        InvalidArgument,
        "{}: the header says {} tokens ({} bytes with the header) but the file has {} bytes; it is truncated or not a token file",
        path, n, kBinHeaderBytes + width * n, bytes);
  }
  TokenData t;
  t.width_ = width;
  t.data_ = static_cast<const char*>(map->addr) + kBinHeaderBytes;
  t.heap_bytes_ = width * n;
  t.size_ = n;
  t.storage_ = std::move(map);
  return t;
}

std::string read_texts(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> files;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec)) {
      if (e.is_regular_file() && !e.is_symlink()) files.push_back(e.path());
    }
    if (ec) ZEROTH_THROW(IoError, "listing {}: {}", path, ec.message());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  std::string all;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) ZEROTH_THROW(IoError, "open(\"{}\"): {}", f.string(), std::strerror(errno));
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (const size_t nul = bytes.find('\0'); nul != std::string::npos) {
      if (files.size() > 1) continue;
      ZEROTH_THROW(InvalidArgument,
                   "{} holds a NUL byte at offset {}: it is not text. Token files (llm.c's .bin) take data.format \"bin\"", f.string(),
                   nul);
    }
    all += bytes;
  }
  if (all.empty()) ZEROTH_THROW(InvalidArgument, "{} holds no text", path);
  return all;
}

TokenData TokenData::open_text(const std::string& path) {
  const std::string text = read_texts(path);
  auto v = std::make_shared<std::vector<uint16_t>>(reinterpret_cast<const unsigned char*>(text.data()),
                                                   reinterpret_cast<const unsigned char*>(text.data()) + text.size());
  TokenData t;
  t.data_ = v->data();
  t.size_ = v->size();
  t.heap_bytes_ = v->size() * sizeof(uint16_t);
  t.storage_ = std::move(v);
  return t;
}

TokenData TokenData::open_tokenized(const std::string& text_path, const std::string& tokenizer_path, const std::string& cache_dir,
                                    bool progress) {
  namespace fs = std::filesystem;
  // Ranks as threads of one process tokenize once; processes racing on the same file each rename a
  // whole file of the same tokens into place.
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  const auto tokenizer = Tokenizer::open(tokenizer_path);
  // The text's files by name, size and modification time: a cache hit reads no text.
  uint64_t stamp = tokenizer->fingerprint();
  std::error_code ec;
  std::vector<fs::path> files;
  if (fs::is_directory(text_path, ec)) {
    for (const auto& e : fs::directory_iterator(text_path, ec)) files.push_back(e.path());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(text_path);
  }
  for (const auto& f : files) {
    const std::string name = f.string();
    const auto size = fs::file_size(f, ec);
    const auto mtime = fs::last_write_time(f, ec).time_since_epoch().count();
    const int64_t facts[2] = {static_cast<int64_t>(size), static_cast<int64_t>(mtime)};
    stamp = XXH3_64bits_withSeed(name.data(), name.size(), stamp);
    stamp = XXH3_64bits_withSeed(facts, sizeof facts, stamp);
  }
  const std::string stem = fs::path(text_path).filename().string();
  const std::string path = (fs::path(cache_dir) / fmt::format("{}.{:016x}.bin", stem.empty() ? "text" : stem, stamp)).string();
  if (!fs::exists(path, ec)) {
    const std::string text = read_texts(text_path);
    check_utf8(text, text_path);
    fs::create_directories(cache_dir, ec);
    if (ec) ZEROTH_THROW(IoError, "create_directories(\"{}\"): {}", cache_dir, ec.message());
    const std::vector<int32_t> ids = tokenize_text(*tokenizer, text, text_path, progress);
    write_token_file(path, ids, tokenizer->vocab_size());
    if (progress) std::fprintf(stderr, "tokens cached in %s\n", path.c_str());
  }
  return open_bin(path);
}

std::vector<int32_t> tokenize_text(const Tokenizer& tokenizer, std::string_view text, const std::string& what, bool progress) {
  const auto t0 = std::chrono::steady_clock::now();
  Tokenizer::EncodeProgress report;
  if (progress) {
    report = [&](size_t done) {
      std::fprintf(stderr, "\rtokenizing %s with %s: %3.0f%%", what.c_str(), tokenizer.describe().c_str(),
                   text.empty() ? 100.0 : 100.0 * static_cast<double>(done) / static_cast<double>(text.size()));
    };
  }
  std::vector<int32_t> ids = tokenizer.encode(text, report);
  if (progress) {
    std::fprintf(stderr, " (%zu tokens in %.1f s)\n", ids.size(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return ids;
}

void write_token_file(const std::string& path, const std::vector<int32_t>& ids, int vocab_size) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size)
      ZEROTH_THROW(InvalidArgument, "{}: token {} is id {}, outside the vocabulary of {}", path, i, ids[i], vocab_size);
  }
  if (ids.size() > 0x7fffffffu) ZEROTH_THROW(InvalidArgument, "{}: {} tokens do not fit llm.c's header", path, ids.size());
  const bool wide = vocab_size > 65536;
  std::vector<int32_t> header(256, 0);
  header[0] = wide ? kBinMagic32 : kBinMagic;
  header[1] = wide ? kBinVersion32 : kBinVersion;
  header[2] = static_cast<int32_t>(ids.size());
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(header.data()), kBinHeaderBytes);
    if (wide) {
      out.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * 4));
    } else {
      std::vector<uint16_t> narrow(ids.begin(), ids.end());
      out.write(reinterpret_cast<const char*>(narrow.data()), static_cast<std::streamsize>(narrow.size() * 2));
    }
    if (!out.flush()) ZEROTH_THROW(IoError, "writing {}: {}", tmp, std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    ZEROTH_THROW(IoError, "rename(\"{}\", \"{}\"): {}", tmp, path, std::strerror(err));
  }
}

TokenData TokenData::synthetic(int vocab, int64_t tokens, uint64_t seed) {
  if (vocab < 2 || vocab > 65536) ZEROTH_THROW(InvalidArgument, "synthetic data: vocabulary {} outside [2, 65536]", vocab);
  uint64_t state = seed * 0x2545f4914f6cdd1dULL + 17;
  std::vector<uint16_t> next(static_cast<size_t>(vocab) * 4);
  for (auto& n : next) n = static_cast<uint16_t>(mix(state) % static_cast<uint64_t>(vocab));
  auto v = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(tokens));
  uint16_t cur = 0;
  for (auto& tok : *v) {
    tok = cur;
    cur = next[static_cast<size_t>(cur) * 4 + mix(state) % 4];
  }
  TokenData t;
  t.data_ = v->data();
  t.size_ = v->size();
  t.heap_bytes_ = v->size() * sizeof(uint16_t);
  t.storage_ = std::move(v);
  return t;
}

TokenData TokenData::slice(size_t begin, size_t end) const {
  if (begin > end || end > size_) ZEROTH_THROW(InvalidArgument, "token slice [{}, {}) outside {} tokens", begin, end, size_);
  TokenData t = *this;
  t.data_ = static_cast<const char*>(data_) + begin * width_;
  t.size_ = end - begin;
  return t;
}

int TokenData::max_token() const {
  int m = 0;
  for (size_t i = 0; i < size_; ++i) m = std::max(m, (*this)[i]);
  return m;
}

WindowRows::WindowRows(TokenData data, int seq_len, const char* what) : data_(std::move(data)), T_(seq_len) {
  windows_ = data_.size() > 0 ? static_cast<int64_t>((data_.size() - 1) / T_) : 0;
  if (windows_ < 1) {
    ZEROTH_THROW(
        ConfigError,
        "{} has {} tokens, fewer than one sequence of model.seq_len + 1 = {} tokens; use more data or a shorter model.seq_len", what,
        data_.size(), T_ + 1);
  }
}

int64_t WindowRows::fill(int64_t i, int32_t* tokens, int32_t* targets, int32_t* positions) const {
  const size_t start = static_cast<size_t>(i) * T_;
  for (int t = 0; t < T_; ++t) {
    tokens[t] = data_[start + t];
    targets[t] = data_[start + t + 1];
    if (positions != nullptr) positions[t] = t;
  }
  return T_;
}

std::string WindowRows::unit() const { return fmt::format("sequences of {} tokens", T_ + 1); }

Loader::Loader(std::shared_ptr<const corpus::Rows> rows, int micro_batch, int gradient_accumulation, int dp, int rank, uint64_t seed)
    : rows_(std::move(rows)),
      T_(rows_->width()),
      micro_(micro_batch),
      gas_(gradient_accumulation),
      dp_(dp),
      rank_(rank),
      seed_(seed),
      windows_(rows_->size()) {
  // One batch never holds the same row twice.
  if (windows_ < global_batch()) {
    ZEROTH_THROW(ConfigError,
                 "the training data has {} {}, but one batch takes {} ({} per micro-batch x {} accumulation steps x {} ranks): they "
                 "would repeat inside a batch; use more data, a shorter model.seq_len or a smaller batch",
                 windows_, rows_->unit(), global_batch(), micro_, gas_, dp_);
  }
}

int64_t Loader::window(int64_t sample) {
  const int64_t epoch = sample / windows_;
  if (epoch != epoch_) {
    perm_.resize(windows_);
    for (int64_t i = 0; i < windows_; ++i) perm_[i] = i;
    uint64_t state = seed_ ^ (0x632be59bd9b4e019ULL * static_cast<uint64_t>(epoch + 1));
    for (int64_t i = windows_ - 1; i > 0; --i) std::swap(perm_[i], perm_[mix(state) % static_cast<uint64_t>(i + 1)]);
    epoch_ = epoch;
  }
  return perm_[sample % windows_];
}

int64_t Loader::batch(int64_t step, int micro, int32_t* tokens, int32_t* targets, int32_t* positions) {
  const int64_t first = step * global_batch() + static_cast<int64_t>(rank_ * gas_ + micro) * micro_;
  int64_t counted = 0;
  for (int b = 0; b < micro_; ++b) {
    const size_t at = static_cast<size_t>(b) * T_;
    counted += rows_->fill(window(first + b), tokens + at, targets + at, positions != nullptr ? positions + at : nullptr);
  }
  return counted;
}

int Loader::longest(int64_t step) {
  int n = 0;
  for (int64_t i = 0; i < global_batch(); ++i) n = std::max(n, rows_->length(window(step * global_batch() + i)));
  return n;
}

int64_t Loader::counted(int64_t step) {
  int64_t n = 0;
  for (int64_t i = 0; i < global_batch(); ++i) n += rows_->counted(window(step * global_batch() + i));
  return n;
}

namespace {

std::string tokenizer_folder(const DataConfig& d) {
  namespace fs = std::filesystem;
  if (d.tokenizer.empty()) return "";
  return (fs::is_directory(d.tokenizer) ? fs::path(d.tokenizer) : fs::path(d.tokenizer).parent_path()).string();
}

}  // namespace

std::unique_ptr<ChatTemplate> chat_template_of(const DataConfig& d) {
  const std::string folder = tokenizer_folder(d);
  const bool configured = !folder.empty() && std::filesystem::exists(std::filesystem::path(folder) / "tokenizer_config.json");
  // A folder without a template (a base model's) still gives its special tokens to a named one.
  if (configured && (!d.chat_template.empty() || ChatTemplate::folder_has_template(folder)))
    return std::make_unique<ChatTemplate>(ChatTemplate::from_folder(folder, d.chat_template));
  if (!d.chat_template.empty()) return std::make_unique<ChatTemplate>(ChatTemplate::from_file(d.chat_template));
  return nullptr;
}

namespace {

// The samples of a JSON Lines split (data.train or data.val).
corpus::Samples read_samples(const TrainConfig& c, const std::string& path, const char* key) {
  const auto& d = c.data;
  std::unique_ptr<Tokenizer> tokenizer = d.tokenizer.empty() ? Tokenizer::bytes() : Tokenizer::open(d.tokenizer);
  const std::unique_ptr<ChatTemplate> chat = chat_template_of(d);
  corpus::SampleOptions o;
  o.loss_on = d.loss_on;
  // A row alone holds seq_len inputs and the target of the last; packed, a sample takes as many
  // positions as it has tokens.
  o.max_tokens = static_cast<size_t>(c.model.seq_len) + (d.packing ? 0 : 1);
  o.truncate = d.truncate;
  o.chat_template = chat.get();
  // The end-of-sequence text after a completion or a text: the tokenizer folder's, template or not.
  const auto special = ChatTemplate::special_tokens_of(tokenizer_folder(d));
  o.eos = special.contains("eos_token") ? special["eos_token"].get<std::string>() : "";
  try {
    return corpus::Samples::read(corpus::jsonl_files(path), d.fields, *tokenizer, o);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("{} = {}: {}", key, path, e.what()));
  }
}

// JSON Lines data: data.val's samples, or the last data.val_fraction of the training samples.
DataSplits load_samples(const TrainConfig& c) {
  const auto& d = c.data;
  auto train = std::make_shared<corpus::Samples>(read_samples(c, d.train, "data.train"));
  DataSplits s;
  if (!d.val.empty()) {
    s.val = std::make_shared<corpus::Samples>(read_samples(c, d.val, "data.val"));
    s.has_val = true;
  } else if (d.val_fraction > 0) {
    const auto n_val = std::max<size_t>(1, static_cast<size_t>(static_cast<double>(train->size()) * d.val_fraction));
    if (n_val >= static_cast<size_t>(train->size())) {
      ZEROTH_THROW(ConfigError,
                   "{}: {} samples are too few to hold out data.val_fraction = {} and still train; give more data, a data.val file, "
                   "or data.val_fraction = 0",
                   d.train, train->size(), d.val_fraction);
    }
    s.val = std::make_shared<corpus::Samples>(train->take_tail(n_val));
    s.has_val = true;
  }
  s.sample_stats = &train->stats();
  s.train_samples = train;
  if (d.packing) {
    auto packed = std::make_shared<corpus::Packed>(train, c.model.seq_len);
    s.packing_fill = packed->fill_ratio();
    s.train = std::move(packed);
    if (s.has_val) s.val = std::make_shared<corpus::Packed>(std::static_pointer_cast<const corpus::Samples>(s.val), c.model.seq_len);
  } else {
    s.train = std::move(train);
  }
  return s;
}

DataSplits load_data(const TrainConfig& c) {
  const auto& d = c.data;
  DataSplits s;
  if (d.format == DataFormat::jsonl) {
    s = load_samples(c);
  } else {
    // The key that named the file leads any error opening it.
    auto open = [&](const std::string& path, const char* key) {
      try {
        if (d.format == DataFormat::bin) return TokenData::open_bin(path);
        if (!d.tokenizer.empty()) return TokenData::open_tokenized(path, d.tokenizer, c.run.output_dir + "/tokens");
        return TokenData::open_text(path);
      } catch (const IoError& e) {
        throw IoError(fmt::format("{} = {}: {}", key, path, e.what()));
      }
    };
    const int T = c.model.seq_len;
    TokenData all = d.format == DataFormat::synthetic ? TokenData::synthetic(d.vocab_size, d.synthetic_tokens, c.run.seed)
                                                      : open(d.train, "data.train");
    if (!d.val.empty()) {
      s.train = std::make_shared<WindowRows>(all, T);
      s.val = std::make_shared<WindowRows>(open(d.val, "data.val"), T, "the validation data (data.val)");
      s.has_val = true;
    } else if (d.val_fraction > 0) {
      // The tail is held out; at least one sequence of it.
      const size_t need = static_cast<size_t>(T) + 1;
      size_t n_val = std::max(need, static_cast<size_t>(static_cast<double>(all.size()) * d.val_fraction));
      if (n_val + need > all.size()) {
        ZEROTH_THROW(ConfigError,
                     "{}: {} tokens are too few to hold out data.val_fraction = {} and still train on sequences of {} tokens; give "
                     "more data, a data.val file, or data.val_fraction = 0",
                     d.train.empty() ? "synthetic data" : d.train, all.size(), d.val_fraction, need);
      }
      s.train = std::make_shared<WindowRows>(all.slice(0, all.size() - n_val), T);
      s.val = std::make_shared<WindowRows>(all.slice(all.size() - n_val, all.size()), T, "the validation data (data.val_fraction)");
      s.has_val = true;
    } else {
      s.train = std::make_shared<WindowRows>(all, T);
    }
  }
  const int vmax = std::max(s.train->max_token(), s.has_val ? s.val->max_token() : 0);
  if (vmax >= c.model.vocab_size) {
    ZEROTH_THROW(ConfigError, "the data holds token id {} but model.vocab_size is {}; raise model.vocab_size above {}", vmax,
                 c.model.vocab_size, vmax);
  }
  return s;
}

}  // namespace

size_t run_data_host_bytes(const TrainConfig& config) {
  const DataSplits data = load_data(config);
  // Validation held out of a token stream shares its storage.
  const bool shared = config.data.format != DataFormat::jsonl && config.data.val.empty();
  const size_t bytes = data.train->host_bytes() + (data.has_val && !shared ? data.val->host_bytes() : 0);
  return bytes + static_cast<size_t>(data.train->size()) * sizeof(int64_t);
}

RunData open_run_data(const TrainConfig& config, int dp, int rank) {
  const int mb = static_cast<int>(config.micro_batch_size);
  DataSplits data = load_data(config);
  Loader train_loader(data.train, mb, static_cast<int>(config.engine.gradient_accumulation_steps), dp, rank, config.run.seed);
  return {std::move(data), std::move(train_loader)};
}

}  // namespace zeroth
