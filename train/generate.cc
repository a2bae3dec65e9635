#include "train/generate.h"

#include <algorithm>  // std::sort, std::max_element
#include <chrono>     // std::chrono::steady_clock
#include <cmath>      // std::exp
#include <numeric>    // std::iota
#include <random>     // std::mt19937_64

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "comm/local/local_comm.h"         // run_local_ranks
#include "core/error.h"                    // ZEROTH_THROW
#include "core/log.h"                      // ZLOG_WARN
#include "engine/checkpoint/checkpoint.h"  // ckpt::load
#include "engine/engine.h"                 // Engine
#include "models/decoder/gpt.h"            // Gpt
#include "train/data.h"                    // chat_template_of
#include "train/text/tokenizer.h"          // Tokenizer
#include "train/trainer.h"                 // plan_stage, load_initial_weights

namespace zeroth {
namespace {

// How many bytes at the end of `s` begin a UTF-8 character that is not whole yet.
size_t incomplete_tail(const std::string& s) {
  for (size_t back = 1; back <= std::min<size_t>(3, s.size()); ++back) {
    const auto c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t need = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

}  // namespace

int32_t sample_token(const std::vector<float>& logits, int vocab, const GenerateOptions& o, double draw) {
  if (o.temperature <= 0) return static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + vocab) - logits.begin());
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  // Most likely first; equals by id, so a draw picks the same token on every machine.
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const size_t keep = o.top_k > 0 ? std::min<size_t>(o.top_k, order.size()) : order.size();
  std::vector<double> p(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += p[i] = std::exp((logits[order[i]] - logits[order[0]]) / o.temperature);
  size_t cut = keep;
  if (o.top_p < 1.0) {
    double mass = 0;
    for (cut = 0; cut < keep && mass < o.top_p * sum;) mass += p[cut++];
  }
  double total = 0;
  for (size_t i = 0; i < cut; ++i) total += p[i];
  double at = draw * total;
  for (size_t i = 0; i < cut; ++i) {
    if ((at -= p[i]) < 0) return order[i];
  }
  return order[cut - 1];
}

namespace {

// Where a chat reply ends: its text, and its id when it is one token (a SentencePiece model's </s>
// is a control piece, which its decoding leaves out of the text).
struct Stop {
  std::string text;
  int32_t id = -1;
};

// The text the prompt's tokens are: the prompt, or with o.chat the template's rendering of it as a
// user's message with the generation prompt, and where the reply ends.
std::string prompt_text(const DataConfig& data, const Tokenizer& tok, const GenerateOptions& o, Stop* stop) {
  if (!o.chat) return o.prompt.empty() ? "\n" : o.prompt;
  const auto chat = chat_template_of(data);
  if (chat == nullptr) {
    ZEROTH_THROW(ConfigError, "--chat needs a chat template: data.tokenizer's folder with one in its tokenizer_config.json, or a "
                              "template file in data.chat_template");
  }
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
  messages.push_back({{"role", "user"}, {"content", o.prompt}});
  stop->text = chat->end_of_turn();
  const std::vector<int32_t> ids = stop->text.empty() ? std::vector<int32_t>{} : tok.encode(stop->text);
  if (ids.size() == 1) stop->id = ids[0];
  return chat->render(messages, true).text;
}

// The config of one rank holding the whole model at stage 0, nothing offloaded, no optimizer state.
TrainConfig decoding_config(const TrainConfig& given) {
  TrainConfig config = given;
  // One rank holds the whole model: the layout of the run that trained it does not matter.
  config.run.world_size = 1;
  config.parallel.pipeline = 1;
  config.parallel.tensor = 1;
  config.parallel.expert = 1;
  config.parallel.sequence = 1;
  config.parallel.context = 1;
  config.parallel.sequence_parallel = false;
  config.parallel.virtual_stages = 1;
  config.parallel.partition_counts.clear();
  // Decoding needs the weights alone: no optimizer state (SGD without momentum keeps none), nothing
  // offloaded, one rank's plain stage 0.
  config.engine.optimizer = OptimizerParams{};
  config.engine.optimizer.kind = OptimizerKind::sgd;
  config.engine.optimizer.momentum = 0;
  config.engine.zero.stage = 0;
  config.engine.zero.offload_optimizer = OffloadConfig::defaults(false);
  config.engine.zero.offload_param = OffloadConfig::defaults(true);
  config.engine.gradient_accumulation_steps = 1;
  config.micro_batch_size = 1, config.train_batch_size = 1;
  return config;
}

}  // namespace

GenerateResult generate(const TrainConfig& given, const GenerateOptions& o, const std::function<void(std::string_view)>& on_text) {
  const TrainConfig config = decoding_config(given);
  if (config.data.tokenizer.empty() && config.data.format != DataFormat::text && config.data.format != DataFormat::jsonl) {
    ZEROTH_THROW(ConfigError, "zeroth generate turns text into token ids with data.tokenizer, or as bytes for data.format \"text\" "
                              "and \"jsonl\"; this config has neither");
  }
  const auto tok = config.data.tokenizer.empty() ? Tokenizer::bytes() : Tokenizer::open(config.data.tokenizer);
  if (o.max_new_tokens < 1) ZEROTH_THROW(InvalidArgument, "--max-new-tokens must be at least 1, got {}", o.max_new_tokens);
  if (o.top_k < 0 || !(o.top_p > 0 && o.top_p <= 1) || !(o.temperature >= 0))
    ZEROTH_THROW(InvalidArgument, "sampling needs temperature >= 0, top-k >= 0 and top-p in (0, 1]");
  GenerateResult r;
  Stop stop;
  r.rendered = prompt_text(config.data, *tok, o, &stop);
  r.prompt_ids = tok->encode(r.rendered);
  const int P = static_cast<int>(r.prompt_ids.size()), T = config.model.seq_len;
  if (P >= T) ZEROTH_THROW(InvalidArgument, "the prompt is {} tokens; the model knows {} positions (model.seq_len): shorten it", P, T);
  r.max_new_tokens = std::min(o.max_new_tokens, T - P);
  const int vocab = std::min(tok->vocab_size(), config.model.vocab_size);
  run_local_ranks(1, [&](Communicator& comm) {
    auto device = make_device(config.run.device, {.memory_budget = config.run.device_memory});
    Engine engine(*device, comm, config.engine);
    Gpt gpt(engine, config.model);
    StagePlan planned = plan_stage(config, 0, 0);
    const bool fresh = config.run.resume.empty() && config.run.init_from.empty();
    engine.finalize(std::move(planned.plan), planned.model, fresh);
    if (!config.run.resume.empty()) ckpt::load(engine, config.run.resume, nullptr, true);
    else if (!config.run.init_from.empty()) load_initial_weights(engine, config);
    else ZLOG_WARN("no run.init_from or --resume: generating from a fresh initialization");
    std::vector<float> logits(config.model.vocab_size);
    std::mt19937_64 rng(o.seed);
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    const auto t0 = std::chrono::steady_clock::now();
    gpt.begin_decoding(P + r.max_new_tokens);
    gpt.decode(r.prompt_ids.data(), P, logits.data());
    // The new text is the whole sequence's decoded past the prompt's: a tokenizer decodes a piece
    // by what precedes it (SentencePiece drops a line's leading space, joins byte pieces).
    std::vector<int32_t> all = r.prompt_ids;
    const size_t prompt_chars = tok->decode(all).size();
    // A chat reply ends where the end of turn begins, which the text leaves out.
    auto new_text = [&] {
      const std::string t = tok->decode(all);
      std::string mine = t.size() > prompt_chars ? t.substr(prompt_chars) : std::string();
      if (const size_t end = stop.text.empty() ? std::string::npos : mine.find(stop.text); end != std::string::npos) {
        mine.resize(end);
        r.ended = true;
      }
      return mine;
    };
    size_t shown = 0;
    for (int i = 0; i < r.max_new_tokens && !r.ended; ++i) {
      const int32_t next = sample_token(logits, vocab, o, uniform(rng));
      r.ids.push_back(next);
      all.push_back(next);
      r.text = new_text();
      if (next == stop.id) r.ended = true;
      if (on_text) {
        // Held back while the end is not a whole character: bytes of one, or the replacement
        // character a tokenizer shows for a byte sequence not finished yet; and while it may be the
        // start of the end of turn.
        size_t whole = r.text.size() - incomplete_tail(r.text);
        if (whole >= 3 && r.text.compare(whole - 3, 3, "\xEF\xBF\xBD") == 0) whole -= 3;
        for (size_t k = std::min(stop.text.size(), whole); k > 0 && !r.ended; --k) {
          if (r.text.compare(whole - k, k, stop.text, 0, k) == 0) {
            whole -= k;
            break;
          }
        }
        if (whole > shown) on_text(std::string_view(r.text).substr(shown, whole - shown)), shown = whole;
      }
      if (i + 1 < r.max_new_tokens && !r.ended) gpt.decode(&next, 1, logits.data());
    }
    gpt.end_decoding();
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.text = new_text();
    if (on_text && r.text.size() > shown) on_text(std::string_view(r.text).substr(shown));
  });
  return r;
}

}  // namespace zeroth
