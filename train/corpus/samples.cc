#include "train/corpus/samples.h"

#include <algorithm>  // std::max_element, std::min

#include <fmt/format.h>  // fmt::format

#include "core/error.h"                // ZEROTH_THROW
#include "train/text/chat_template.h"  // ChatTemplate
#include "train/text/tokenizer.h"      // Tokenizer

namespace zeroth::corpus {

const char* loss_on_name(LossOn l) {
  switch (l) {
    case LossOn::automatic: return "automatic";
    case LossOn::assistant: return "assistant";
    case LossOn::completion: return "completion";
    case LossOn::all: return "all";
  }
  return "?";
}

namespace {

using Spans = std::vector<std::pair<size_t, size_t>>;

struct Rendered {
  std::string text;
  Spans spans;  // byte ranges the loss counts, in order
};

LossOn resolved(LossOn asked, Shape shape) {
  if (asked != LossOn::automatic) return asked;
  return shape == Shape::messages ? LossOn::assistant : shape == Shape::prompt_completion ? LossOn::completion : LossOn::all;
}

// The loss_on a shape has spans for; InvalidArgument naming the first record otherwise.
void check_loss_on(LossOn l, Shape shape, const Record& r) {
  const bool fits = l == LossOn::all || (l == LossOn::assistant && shape == Shape::messages) ||
                    (l == LossOn::completion && shape == Shape::prompt_completion);
  if (!fits) {
    ZEROTH_THROW(InvalidArgument,
                 "data.loss_on \"{}\" has nothing to find in records of {} ({}, line {}): \"assistant\" takes conversations, "
                 "\"completion\" prompt and completion records, \"all\" any",
                 loss_on_name(l), shape_name(shape), r.file, r.line);
  }
}

Rendered render(const Record& r, LossOn loss_on, const SampleOptions& o) {
  if (r.shape == Shape::messages) {
    if (o.chat_template == nullptr) {
      ZEROTH_THROW(InvalidArgument,
                   "a conversation needs a chat template: give data.tokenizer a folder whose tokenizer_config.json has one, or name "
                   "a template file in data.chat_template");
    }
    if (loss_on == LossOn::assistant) {
      ChatTemplate::Trained t = o.chat_template->render_assistant_spans(r.value);
      return {std::move(t.text), std::move(t.spans)};
    }
    std::string text = o.chat_template->render(r.value, false).text;
    const size_t n = text.size();
    return {std::move(text), {{0, n}}};
  }
  if (r.shape == Shape::prompt_completion) {
    const std::string prompt = r.value["prompt"].get<std::string>();
    std::string text = prompt + r.value["completion"].get<std::string>() + o.eos;
    const size_t n = text.size();
    return {std::move(text), {{loss_on == LossOn::all ? 0 : prompt.size(), n}}};
  }
  std::string text = r.value.get<std::string>() + o.eos;
  const size_t n = text.size();
  return {std::move(text), {{0, n}}};
}

// Token j (bytes [ends[j - 1], ends[j])) counts where it meets a span; the first token never does
// (nothing predicts it).
std::vector<uint8_t> trained_tokens(const std::vector<size_t>& ends, const Spans& spans) {
  std::vector<uint8_t> out(ends.size(), 0);
  size_t s = 0, begin = 0;
  for (size_t j = 0; j < ends.size(); begin = ends[j], ++j) {
    while (s < spans.size() && spans[s].second <= begin) ++s;
    const size_t end = std::max(ends[j], begin + 1);  // an empty range sits at its position
    if (j > 0 && s < spans.size() && spans[s].first < end) out[j] = 1;
  }
  return out;
}

}  // namespace

Samples Samples::read(const std::vector<std::string>& files, const Fields& fields, const Tokenizer& tokenizer,
                      const SampleOptions& options) {
  if (options.max_tokens < 2) ZEROTH_THROW(InvalidArgument, "samples of at most {} tokens hold no target", options.max_tokens);
  Samples out;
  out.files_ = files;
  out.width_ = static_cast<int>(options.max_tokens - 1);
  JsonlReader reader(files, fields);
  Record r;
  bool first = true;
  uint32_t file = 0;
  while (reader.next(r)) {
    if (first) {
      out.shape_ = r.shape;
      out.loss_on_ = resolved(options.loss_on, r.shape);
      check_loss_on(out.loss_on_, r.shape, r);
      first = false;
    }
    while (files[file] != r.file) ++file;
    Rendered rendered;
    try {
      rendered = render(r, out.loss_on_, options);
    } catch (const InvalidArgument& e) {
      ZEROTH_THROW(InvalidArgument, "{}, line {}: {}", r.file, r.line, e.what());
    }
    Tokenizer::Encoded e = tokenizer.encode_with_ends(rendered.text);
    std::vector<uint8_t> trained = trained_tokens(e.ends, rendered.spans);
    if (e.ids.size() > options.max_tokens) {
      if (!options.truncate) {
        ZEROTH_THROW(
            InvalidArgument,
            "{}, line {}: the sample is {} tokens, longer than model.seq_len + 1 = {}, and data.truncate is false: shorten it, "
            "raise model.seq_len, or set data.truncate to true to cut it",
            r.file, r.line, e.ids.size(), options.max_tokens);
      }
      e.ids.resize(options.max_tokens);
      trained.resize(options.max_tokens);
      ++out.stats_.truncated;
    }
    size_t counted = 0;
    for (const uint8_t t : trained) counted += t;
    if (counted == 0) {
      ++out.stats_.nothing_trained;
      continue;
    }
    out.add(e.ids, trained, file, r.line);
  }
  out.stats_.skipped = reader.skipped();
  if (out.size() == 0) {
    ZEROTH_THROW(InvalidArgument,
                 "{}: no sample to train on ({} conversations empty, {} without an assistant turn, {} with nothing to train left "
                 "within model.seq_len + 1 tokens)",
                 files.size() == 1 ? files[0] : files[0] + " ...", out.stats_.skipped.empty_conversations,
                 out.stats_.skipped.without_assistant, out.stats_.nothing_trained);
  }
  return out;
}

void Samples::add(const std::vector<int32_t>& ids, const std::vector<uint8_t>& trained, uint32_t file, size_t line) {
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  trained_.insert(trained_.end(), trained.begin(), trained.end());
  begin_.push_back(ids_.size());
  uint32_t counted = 0;
  for (const uint8_t t : trained) counted += t;
  counted_.push_back(counted);
  sources_.emplace_back(file, static_cast<uint32_t>(line));
  ++stats_.samples;
  stats_.tokens += ids.size();
  stats_.counted += counted;
}

std::span<const int32_t> Samples::ids(size_t i) const { return {ids_.data() + begin_[i], begin_[i + 1] - begin_[i]}; }

std::span<const uint8_t> Samples::trained(size_t i) const { return {trained_.data() + begin_[i], begin_[i + 1] - begin_[i]}; }

std::string Samples::source(size_t i) const { return fmt::format("{}:{}", files_[sources_[i].first], sources_[i].second); }

Samples Samples::take_tail(size_t n) {
  n = std::min(n, static_cast<size_t>(size()));
  const size_t keep = static_cast<size_t>(size()) - n;
  Samples tail;
  tail.files_ = files_, tail.shape_ = shape_, tail.loss_on_ = loss_on_, tail.width_ = width_;
  for (size_t i = keep; i < static_cast<size_t>(size()); ++i) {
    const auto ids = this->ids(i);
    const auto trained = this->trained(i);
    tail.add({ids.begin(), ids.end()}, {trained.begin(), trained.end()}, sources_[i].first, sources_[i].second);
  }
  const size_t cut = begin_[keep];
  stats_.samples -= n, stats_.tokens -= tail.stats_.tokens, stats_.counted -= tail.stats_.counted;
  ids_.resize(cut), trained_.resize(cut), begin_.resize(keep + 1), counted_.resize(keep), sources_.resize(keep);
  return tail;
}

int64_t Samples::place(size_t i, int32_t* tokens, int32_t* targets) const {
  const auto ids = this->ids(i);
  const auto trained = this->trained(i);
  const size_t n = ids.size();
  for (size_t t = 0; t < n; ++t) {
    tokens[t] = ids[t];
    targets[t] = t + 1 < n && trained[t + 1] ? ids[t + 1] : kNotCounted;
  }
  return counted_[i];
}

int64_t Samples::fill(int64_t i, int32_t* tokens, int32_t* targets, int32_t* positions) const {
  const auto ids = this->ids(static_cast<size_t>(i));
  const auto trained = this->trained(static_cast<size_t>(i));
  const size_t n = ids.size() - 1;  // inputs with a target
  for (size_t t = 0; t < static_cast<size_t>(width_); ++t) {
    // Padding repeats the last token; its targets do not count, and causal attention keeps it
    // out of the sample's own positions.
    tokens[t] = t < n ? ids[t] : ids[n];
    targets[t] = t < n && trained[t + 1] ? ids[t + 1] : kNotCounted;
    if (positions != nullptr) positions[t] = static_cast<int32_t>(t);
  }
  return counted(i);
}

size_t Samples::host_bytes() const {
  return ids_.capacity() * sizeof(int32_t) + trained_.capacity() + begin_.capacity() * sizeof(size_t) +
         counted_.capacity() * sizeof(uint32_t) + sources_.capacity() * sizeof(sources_[0]);
}

int Samples::max_token() const { return ids_.empty() ? 0 : *std::max_element(ids_.begin(), ids_.end()); }

}  // namespace zeroth::corpus
