// Fine-tuning on JSON Lines conversations against one whole batch: the same global batch of
// conversations (their assistant turns counted, of very different lengths) trained as 1
// micro-batch of 4 on 1 rank, as 4 micro-batches of 1, and as 2 micro-batches of 1 on each of 2
// ranks gives the same loss at every step and the same weights after 5 steps at a nonzero learning
// rate, to f32 rounding: the loss is the sum over the global batch's counted targets divided by
// their number, not a mean of the micro-batches' means (which weighs a short answer's tokens more
// than a long one's, and fails this test). `zeroth eval` measures the same masked loss.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "tests/tools/cli_runs.h"

namespace zeroth {
namespace {

using json = nlohmann::json;
using testing::losses;
using testing::run;
using testing::temp;
using testing::write_config;

const char* kChatMl = R"({%- for message in messages %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %})";

// Conversation i's answers: 1 to 60 bytes, and every third a second turn.
std::vector<std::string> answers(int i) {
  std::vector<std::string> out = {std::string(static_cast<size_t>(1 + (i * 37) % 60), static_cast<char>('a' + i % 26))};
  if (i % 3 == 0) out.push_back(fmt::format("{}", i * i));
  return out;
}

// 40 conversations whose answers run from 1 to 60 bytes, some of two turns; and the template: in a
// folder of the test's own (ctest runs the tests side by side).
std::string write_data() {
  const std::string dir = temp(std::string("sft_data_") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/chatml.jinja") << kChatMl;
  std::ofstream out(dir + "/train.jsonl");
  for (int i = 0; i < 40; ++i) {
    const auto a = answers(i);
    json turns = json::array(
        {{{"role", "user"}, {"content", fmt::format("what is {} times {}?", i, i % 7)}}, {{"role", "assistant"}, {"content", a[0]}}});
    if (a.size() > 1) {
      turns.push_back({{"role", "user"}, {"content", "and again?"}});
      turns.push_back({{"role", "assistant"}, {"content", a[1]}});
    }
    out << json{{"messages", turns}}.dump() << "\n";
  }
  return dir;
}

json sft(const std::string& name, const std::string& data, int micro, int gas, int world, bool packing = false) {
  json j = json::parse(R"({
    "gradient_clipping": 0.0, "steps_per_print": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.0}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.002, "warmup_max_lr": 0.002}},
    "zero_optimization": {"stage": 2},
    "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 256, "vocab_size": 256},
    "run": {"steps": 5, "eval_interval": 0, "eval_batches": "all", "trace": false}})");
  j["train_micro_batch_size_per_gpu"] = micro;
  j["gradient_accumulation_steps"] = gas;
  j["run"]["world_size"] = world;
  j["run"]["output_dir"] = temp(name);
  j["data"] = {{"format", "jsonl"},
               {"train", data + "/train.jsonl"},
               {"chat_template", data + "/chatml.jinja"},
               {"val_fraction", 0.1},
               {"packing", packing}};
  std::filesystem::remove_all(temp(name));
  return j;
}

// The JSON objects of a command's output, a line each (zeroth data-preview --json).
std::vector<json> json_lines(const std::string& output) {
  std::vector<json> out;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] == '{') out.push_back(json::parse(line));
  return out;
}

double val_loss(const testing::Run& r) {
  double v = -1;
  for (const auto& m : r.metrics)
    if (m.contains("val_loss")) v = m["val_loss"];
  return v;
}

TEST(Sft, TheGlobalBatchsCountedTargetsNormaliseTheLossHoweverTheBatchIsSplit) {
  const std::string data = write_data();
  const auto whole = run({ZEROTH_BIN, "train", write_config("sft_whole", sft("sft_whole", data, 4, 1, 1))}, "sft_whole");
  ASSERT_EQ(whole.code, 0) << whole.output;
  EXPECT_NE(whole.output.find("36 samples train"), std::string::npos) << whole.output;
  EXPECT_NE(whole.output.find("loss on the assistant's turns or completions), validation 4 samples"), std::string::npos)
      << whole.output;
  const auto a = losses(whole);
  ASSERT_EQ(a.size(), 5u);
  EXPECT_LT(a.back(), a.front());
  // A fresh model's mean over the counted targets is near ln 256 = 5.5; a mean over every position,
  // padding and prompts included, would be a fifth of that.
  EXPECT_GT(a.front(), 4.5);
  ASSERT_GT(val_loss(whole), 0);
  struct Split {
    const char* name;
    int micro, gas, world;
  };
  for (const Split& s : {Split{"sft_micro", 1, 4, 1}, Split{"sft_ranks", 1, 2, 2}}) {
    SCOPED_TRACE(s.name);
    const auto r = run({ZEROTH_BIN, "train", write_config(s.name, sft(s.name, data, s.micro, s.gas, s.world))}, s.name);
    ASSERT_EQ(r.code, 0) << r.output;
    const auto b = losses(r);
    ASSERT_EQ(b.size(), a.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 4e-6 * a[i]) << "step " << i + 1;
    EXPECT_NEAR(val_loss(r), val_loss(whole), 4e-6 * val_loss(whole));
    testing::expect_same_weights(testing::weights_of(s.name), testing::weights_of("sft_whole"), 2e-5);
  }
  // `zeroth eval` on the JSON Lines split: the masked loss of the run's last validation, over the
  // validation samples' counted targets, on 1 rank and on 3 (one of which measures nothing), and
  // with the samples packed into rows (each attending within itself from position 0).
  // The validation samples are the last four conversations: their answers and marks count.
  int counted = 0;
  for (int i = 36; i < 40; ++i)
    for (const auto& answer : answers(i)) counted += static_cast<int>(answer.size() + std::string("<|im_end|>\n").size());
  for (const auto& [world, packing] : {std::pair{"1", "false"}, std::pair{"3", "false"}, std::pair{"1", "true"}}) {
    // One sample a rank and round on 3 ranks: two rounds, the second's third rank measuring nothing.
    const auto e = run({ZEROTH_BIN, "eval", temp("sft_whole") + ".json", "--json", "--resume", temp("sft_whole") + "/checkpoints",
                        "--set", std::string("run.world_size=") + world, "--set", "run.checkpoint_interval=-1", "--set",
                        "train_micro_batch_size_per_gpu=1", "--set", std::string("data.packing=") + packing},
                       std::string("sft_eval_") + world + packing);
    ASSERT_EQ(e.code, 0) << e.output;
    const json out = json::parse(e.output.substr(e.output.rfind("{\"loss\"")));
    if (packing == std::string("true")) {
      EXPECT_LT(out["windows"].get<int>(), 4) << "four samples in fewer rows";
    } else {
      EXPECT_EQ(out["windows"], 4);
    }
    EXPECT_EQ(out["tokens"].get<int>(), counted) << "the counted targets of the validation samples";
    EXPECT_NEAR(out["loss"].get<double>(), val_loss(whole), 2e-6 * val_loss(whole)) << world << " ranks, packing " << packing;
  }
}

// The same with the samples packed into rows: the global batch's rows split over micro-batches and
// ranks give the same losses and weights.
TEST(Sft, PackedRowsTrainTheSameHoweverTheBatchIsSplit) {
  const std::string data = write_data();
  const auto whole = run({ZEROTH_BIN, "train", write_config("sft_pack", sft("sft_pack", data, 2, 1, 1, true))}, "sft_pack");
  ASSERT_EQ(whole.code, 0) << whole.output;
  EXPECT_NE(whole.output.find("packed into"), std::string::npos) << whole.output;
  const auto a = losses(whole);
  ASSERT_EQ(a.size(), 5u);
  EXPECT_LT(a.back(), a.front());
  const auto r = run({ZEROTH_BIN, "train", write_config("sft_pack_ranks", sft("sft_pack_ranks", data, 1, 1, 2, true))},
                     "sft_pack_ranks");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto b = losses(r);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 4e-6 * a[i]) << "step " << i + 1;
  testing::expect_same_weights(testing::weights_of("sft_pack_ranks"), testing::weights_of("sft_pack"), 2e-5);
}

// Ulysses (parallel.sequence 2): each step's rows (cut to the step's longest conversation, rounded up
// to 32 positions) split over 2 ranks, its samples
// crossing from one rank's positions to the other's, packed or not, GPT-2 (learned positions from
// each rank's first) and Llama (rotary; one key/value head copied to both ranks): the same losses,
// validation loss and weights as the whole rows on one rank, though the ranks count different
// numbers of assistant tokens. Ring attention (parallel.context 2) alike, unpacked: each rank keeps
// its two zigzag chunks of the cut rows.
TEST(Sft, UlyssesRanksShareEachConversationAndTrainTheSame) {
  const std::string data = write_data();
  struct Case {
    const char* name;
    bool packing, llama, ring = false;
  };
  for (const Case& c : {Case{"sft_sq", false, false}, Case{"sft_sq_pack", true, false}, Case{"sft_sq_llama", false, true},
                        Case{"sft_cp", false, false, true}, Case{"sft_cp_llama", false, true, true}}) {
    SCOPED_TRACE(c.name);
    const std::string whole_name = std::string(c.name) + "_whole";
    json whole = sft(whole_name, data, 2, 1, 1, c.packing);
    if (c.llama) whole["model"].update(json{{"architecture", "llama"}, {"n_kv_head", 1}, {"intermediate_size", 64}});
    json split = sft(c.name, data, 2, 1, 2, c.packing);
    split["model"] = whole["model"];
    split["parallel"] = {{c.ring ? "context" : "sequence", 2}};
    const auto a = run({ZEROTH_BIN, "train", write_config(whole_name, whole)}, whole_name);
    ASSERT_EQ(a.code, 0) << a.output;
    const auto b = run({ZEROTH_BIN, "train", write_config(c.name, split)}, c.name);
    ASSERT_EQ(b.code, 0) << b.output;
    const char* box = c.ring ? "ring attention over runs of 2 ranks: each sample in 4 chunks of 64 positions"
                             : "Ulysses over runs of 2 ranks: 128 positions of each sample per rank";
    EXPECT_NE(b.output.find(box), std::string::npos) << b.output;
    const auto la = losses(a), lb = losses(b);
    ASSERT_EQ(la.size(), 5u);
    ASSERT_EQ(lb.size(), la.size());
    EXPECT_LT(la.back(), la.front());
    for (size_t i = 0; i < la.size(); ++i) EXPECT_NEAR(lb[i], la[i], 4e-6 * la[i]) << "step " << i + 1;
    EXPECT_NEAR(val_loss(b), val_loss(a), 4e-6 * val_loss(a));
    // Adam's steps on near-zero gradients turn the products' other row blocking into up to 1.1e-6 of
    // a weight (5e-4 of one step of lr 2e-3): 2.9e-5 of a tensor's largest value (packed), 6.3e-6 Llama.
    testing::expect_same_weights(testing::weights_of(c.name), testing::weights_of(whole_name), 5e-5);
  }
}

// `zeroth data-preview --json`: each sample's text is its bytes (text as bytes), and the bytes its
// mask marks are the sample's answers, each with its end-of-turn mark; the plain form marks them
// in brackets and names the rows packing made.
TEST(Sft, DataPreviewMarksWhatTheLossCounts) {
  const std::string data = write_data();
  const std::string config = write_config("sft_preview", sft("sft_preview", data, 4, 1, 1));
  const auto r = run({ZEROTH_BIN, "data-preview", config, "--n", "6", "--json"}, "sft_preview");
  ASSERT_EQ(r.code, 0) << r.output;
  int seen = 0;
  for (const json& j : json_lines(r.output)) {
    const auto ids = j["ids"].get<std::vector<int>>();
    const auto mask = j["mask"].get<std::vector<int>>();
    ASSERT_EQ(ids.size(), mask.size());
    std::string text, counted;
    for (size_t k = 0; k < ids.size(); ++k) {
      text += static_cast<char>(ids[k]);
      if (mask[k]) counted += static_cast<char>(ids[k]);
    }
    EXPECT_EQ(j["text"].get<std::string>(), text);
    const int i = std::stoi(text.substr(text.find("what is ") + 8));
    std::string want;
    for (const auto& a : answers(i)) want += a + "<|im_end|>\n";
    EXPECT_EQ(counted, want) << "conversation " << i;
    ++seen;
  }
  EXPECT_EQ(seen, 6);
  const auto packed = run({ZEROTH_BIN, "data-preview", config, "--n", "2", "--set", "data.packing=true"}, "sft_preview_packed");
  ASSERT_EQ(packed.code, 0) << packed.output;
  EXPECT_NE(packed.output.find("packed row "), std::string::npos) << packed.output;
  EXPECT_NE(packed.output.find("<|im_start|>assistant\n[["), std::string::npos) << packed.output;
}

// `zeroth generate --chat` after 150 steps on "say W" -> "W" conversations, packed: the prompt goes
// through the template with the generation prompt, and the greedy reply is the word alone, ended
// where the template's end of turn (<|im_end|>) begins.
TEST(Sft, GenerateChatRepliesAndStopsAtTheEndOfTurn) {
  const std::string data = write_data();  // the template
  {
    std::ofstream out(data + "/say.jsonl");
    for (int i = 0; i < 32; ++i) {
      const std::string w = std::vector<std::string>{"hi", "yes", "no", "ok"}[i % 4];
      out << json{{"messages", json::array({{{"role", "user"}, {"content", "say " + w}}, {{"role", "assistant"}, {"content", w}}})}}
                 .dump()
          << "\n";
    }
  }
  json j = sft("sft_say", data, 4, 1, 1, true);
  j["data"]["train"] = data + "/say.jsonl";
  j["data"]["val_fraction"] = 0;
  j["model"]["seq_len"] = 96;
  j["optimizer"]["params"]["lr"] = 1e-2;
  j["scheduler"] = json::parse(R"({"type": "WarmupLR", "params": {"warmup_min_lr": 0.01, "warmup_max_lr": 0.01}})");
  j["run"]["steps"] = 150;
  j["run"]["checkpoint_interval"] = -1;
  const auto trained = run({ZEROTH_BIN, "train", write_config("sft_say", j)}, "sft_say");
  ASSERT_EQ(trained.code, 0) << trained.output;
  for (const std::string w : {"hi", "yes", "no", "ok"}) {
    const auto g = run({ZEROTH_BIN, "generate", temp("sft_say"), "--chat", "--prompt", "say " + w, "--temperature", "0",
                        "--max-new-tokens", "30"},
                       "sft_say_" + w);
    ASSERT_EQ(g.code, 0) << g.output;
    EXPECT_EQ(g.output.substr(0, w.size() + 1), w + "\n") << g.output;
    // The reply's bytes and the end of turn's ten, nothing after.
    EXPECT_NE(g.output.find(fmt::format("{} new tokens after", w.size() + 10)), std::string::npos) << g.output;
    EXPECT_NE(g.output.find("ended at the end of turn"), std::string::npos) << g.output;
  }
}

// A base model's tokenizer folder (the README's SentencePiece vocabulary, a tokenizer_config.json
// with an eos_token and no chat template) takes prompt and completion records: each sample ends
// with the eos_token's id (the control piece </s>, id 2, not its characters), and it counts.
TEST(Sft, ABaseModelsFolderEndsCompletionsWithItsEosId) {
  const std::string vocab = std::string(ZEROTH_SOURCE_DIR) + "/runs/tokenizers/fortunes-4096.model";
  ASSERT_TRUE(std::filesystem::exists(vocab)) << vocab << " is missing: run tools/fortunes-vocab.sh (tools/dev.sh does)";
  const std::string dir = temp("sft_base");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/tokenizer");
  std::filesystem::copy_file(vocab, dir + "/tokenizer/tokenizer.model");
  std::ofstream(dir + "/tokenizer/tokenizer_config.json") << R"({"bos_token": "<s>", "eos_token": "</s>"})";
  {
    std::ofstream out(dir + "/data.jsonl");
    for (int i = 0; i < 8; ++i)
      out << json{{"prompt", fmt::format("Q: what is {} and {}?\nA:", i, i + 1)}, {"completion", " a sum"}}.dump() << "\n";
  }
  json j = sft("sft_base_run", dir, 2, 1, 1);
  j["data"] = {{"format", "jsonl"}, {"train", dir + "/data.jsonl"}, {"tokenizer", dir + "/tokenizer"}, {"val_fraction", 0}};
  j["model"]["vocab_size"] = 4096;
  const auto r = run({ZEROTH_BIN, "data-preview", write_config("sft_base_run", j), "--n", "2", "--json"}, "sft_base_run");
  ASSERT_EQ(r.code, 0) << r.output;
  int seen = 0;
  for (const json& s : json_lines(r.output)) {
    const auto ids = s["ids"].get<std::vector<int>>();
    const auto mask = s["mask"].get<std::vector<int>>();
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids.back(), 2) << s.dump();
    EXPECT_EQ(mask.back(), 1) << s.dump();
    EXPECT_EQ(mask.front(), 0) << s.dump();
    ++seen;
  }
  EXPECT_EQ(seen, 2);
}

// Every file under `dir` and its bytes.
std::map<std::string, std::string> files_under(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[e.path().string()] = testing::bytes_of(e.path().string());
  return out;
}

// LoRA through the CLI, as a user runs it: the run leaves PEFT's adapter files beside the merged
// weights, whose masked validation loss `zeroth eval` measures again; lora.init_from starts another
// run where this one ended (its first validation is this one's last); `ckpt export --merge-lora`
// writes the run's merged weights from its checkpoint, and a plain single-file export, which would
// drop the adapters, is refused.
TEST(Sft, LoraLeavesPeftFilesAndItsMergedWeightsEvaluateToTheRunsLoss) {
  const std::string data = write_data();
  json j = sft("sft_lora", data, 2, 1, 2);
  j["zero_optimization"]["stage"] = 3;
  j["run"]["steps"] = 12;
  j["optimizer"]["params"]["lr"] = 1e-2;
  j["scheduler"]["params"] = {{"warmup_min_lr", 1e-2}, {"warmup_max_lr", 1e-2}};
  j["lora"] = {{"r", 4}, {"alpha", 8}, {"target_modules", {"all-linear"}}};
  const auto r = run({ZEROTH_BIN, "train", write_config("sft_lora", j)}, "sft_lora");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("LoRA r 4, alpha 8 (scale 2) on all-linear; the base model's"), std::string::npos) << r.output;
  double first_val = -1;  // the validation before the first step
  for (const auto& m : r.metrics)
    if (m.contains("val_loss") && first_val < 0) first_val = m["val_loss"];
  EXPECT_LT(val_loss(r), first_val - 0.05) << "the adapters did not learn";
  const std::string out = temp("sft_lora");
  std::ifstream in(out + "/adapter_config.json");
  ASSERT_TRUE(in) << "no adapter_config.json in " << out;
  const json adapter = json::parse(in);
  EXPECT_EQ(adapter["peft_type"], "LORA");
  EXPECT_EQ(adapter["r"], 4);
  const SafeTensors file = read_safetensors(out + "/adapter_model.safetensors");
  EXPECT_EQ(file.tensors.size(), 2u * 2 * 4);  // 2 layers x 4 modules x (A, B)
  EXPECT_EQ(file.at("base_model.model.transformer.h.1.mlp.c_fc.lora_B.weight").shape, (std::vector<int64_t>{128, 4}));
  const auto e = run({ZEROTH_BIN, "eval", out}, "sft_lora_eval");
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find(fmt::format("loss {:.6f}", val_loss(r))), std::string::npos) << e.output << " against " << val_loss(r);
  // Another run from the adapters: its first validation is this run's last.
  json next = sft("sft_lora_next", data, 2, 1, 2);
  next["zero_optimization"]["stage"] = 3;
  next["run"]["steps"] = 1;
  next["lora"] = j["lora"];
  next["lora"]["init_from"] = out;
  next["run"]["eval_interval"] = 1;
  const auto n = run({ZEROTH_BIN, "train", write_config("sft_lora_next", next)}, "sft_lora_next");
  ASSERT_EQ(n.code, 0) << n.output;
  EXPECT_NE(n.output.find(fmt::format("validation at step 0: loss {:.4f}", val_loss(r))), std::string::npos) << n.output;
  // Its folder evaluates to its own last validation: the merged weights, the adapters not added again.
  const auto ne = run({ZEROTH_BIN, "eval", temp("sft_lora_next")}, "sft_lora_next_eval");
  ASSERT_EQ(ne.code, 0) << ne.output;
  EXPECT_NE(ne.output.find(fmt::format("loss {:.6f}", val_loss(n))), std::string::npos) << ne.output << " against " << val_loss(n);
  // The checkpoint's merge is the run's merged weights, bit for bit.
  const std::string merged = temp("sft_lora_merged.safetensors");
  const auto x = run({ZEROTH_BIN, "ckpt", "export", out + "/checkpoints", "--out", merged, "--merge-lora"}, "sft_lora_export");
  ASSERT_EQ(x.code, 0) << x.output;
  const SafeTensors a = read_safetensors(merged), b = read_safetensors(out + "/model.safetensors");
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : b.tensors) EXPECT_EQ(a.at(name).data, t.data) << name;
  const auto refused = run({ZEROTH_BIN, "ckpt", "export", out + "/checkpoints", "--out", merged}, "sft_lora_export_plain");
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.output.find("holds LoRA adapters, which one safetensors file of the base would drop"), std::string::npos)
      << refused.output;
}

// Bad data stops a run resumed from its folder with an error naming the place, before anything of
// the folder changes: a JSON line cut short, a template construct outside the subset, and a
// conversation longer than the window with data.truncate false.
TEST(Sft, BadDataIsAnErrorNamingThePlaceAndLeavesTheRunAsItWas) {
  const std::string data = write_data();
  const auto first = run({ZEROTH_BIN, "train", write_config("sft_bad", sft("sft_bad", data, 4, 1, 1))}, "sft_bad");
  ASSERT_EQ(first.code, 0) << first.output;
  const auto before = files_under(temp("sft_bad"));
  {
    std::ofstream(data + "/cut.jsonl") << testing::bytes_of(data + "/train.jsonl") << R"({"messages": [{"role": "user", "con)";
    std::ofstream(data + "/bad.jinja") << "{% for m in messages %}{{ m.content }}{% endfor %}\n{% include 'other.jinja' %}";
    std::ofstream(data + "/long.jsonl") << testing::bytes_of(data + "/train.jsonl")
                                        << json{{"messages", json::array({{{"role", "user"}, {"content", std::string(300, 'q')}},
                                                                          {{"role", "assistant"}, {"content", "a"}}})}}
                                               .dump()
                                        << "\n";
  }
  struct Bad {
    std::vector<std::string> sets;
    std::string says;
  };
  const std::vector<Bad> cases = {
      {{"data.train=" + data + "/cut.jsonl"}, "cut.jsonl, line 41"},
      {{"data.chat_template=" + data + "/bad.jinja"}, "bad.jinja, line 2"},
      {{"data.train=" + data + "/long.jsonl", "data.truncate=false"}, "long.jsonl, line 41: the sample is"},
  };
  for (const Bad& b : cases) {
    std::vector<std::string> args = {ZEROTH_BIN, "train", temp("sft_bad") + ".json", "--resume", "--set", "run.steps=8"};
    for (const auto& s : b.sets) args.insert(args.end(), {"--set", s});
    const auto r = run(args, "sft_bad_run");
    EXPECT_NE(r.code, 0) << r.output;
    EXPECT_NE(r.output.find(b.says), std::string::npos) << r.output;
    EXPECT_EQ(files_under(temp("sft_bad")), before) << "the run's folder changed after: " << r.output;
  }
}

}  // namespace
}  // namespace zeroth
