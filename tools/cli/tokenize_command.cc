// `zeroth tokenize --tokenizer M INPUT... --out FILE.bin`: text into an llm.c token file, as a run
// with data.tokenizer would tokenize it.
#include <chrono>  // std::chrono::steady_clock
#include <cstdio>  // std::printf
#include <memory>  // std::make_shared
#include <string>  // std::string
#include <vector>  // std::vector

#include <CLI/CLI.hpp>  // CLI::App

#include "core/memory.h"  // format_bytes
#include "tools/cli/commands.h"
#include "train/data.h"            // read_texts, write_token_file
#include "train/text/tokenizer.h"  // Tokenizer

namespace zeroth::tools {
namespace tokenize_cmd {

struct TokenizeOptions {
  std::string tokenizer, out;
  std::vector<std::string> inputs;
};

void run_tokenize(const TokenizeOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto tok = Tokenizer::open(o.tokenizer);
  // The inputs end to end, as a run reads a folder's files: one text, encoded once.
  std::string text;
  for (const auto& input : o.inputs) {
    const std::string part = read_texts(input);
    check_utf8(part, input);
    text += part;
  }
  const size_t bytes = text.size();
  const std::vector<int32_t> ids = tokenize_text(*tok, text, o.inputs.size() == 1 ? o.inputs[0] : "the inputs", true);
  write_token_file(o.out, ids, tok->vocab_size());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s: %zu tokens (%.2f bytes of text each) from %s of text with %s, %d-byte tokens, in %.1f s\n", o.out.c_str(),
              ids.size(), ids.empty() ? 0.0 : static_cast<double>(bytes) / static_cast<double>(ids.size()),
              format_bytes(bytes).c_str(), tok->describe().c_str(), tok->vocab_size() > 65536 ? 4 : 2, s);
}

}  // namespace tokenize_cmd

void add_tokenize_command(CLI::App& app) {
  using namespace tokenize_cmd;
  auto o = std::make_shared<TokenizeOptions>();
  auto* cmd = app.add_subcommand("tokenize", "Tokenize text into an llm.c token file (what data.format \"bin\" trains from)");
  cmd->add_option("--tokenizer", o->tokenizer,
                  "A SentencePiece .model, a Hugging Face tokenizer.json (byte-level BPE), or the model folder holding either")
      ->required();
  cmd->add_option("inputs", o->inputs, "Text files or folders of them, concatenated in order")->required();
  cmd->add_option("--out", o->out, "The token file to write (2-byte tokens, or 4 when an id exceeds 65,535)")->required();
  cmd->callback([o] { run_tokenize(*o); });
}

}  // namespace zeroth::tools
