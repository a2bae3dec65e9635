// The weights a run leaves: one safetensors file in Hugging Face's GPT-2 names and layouts. The
// names and shapes are spelled here as Hugging Face's GPT2LMHeadModel has them (its Conv1D layers
// store [in, out]); the values must be the engine's fp32 master weights, transposed where
// Conv1D wants it, cast to the saved dtype.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "comm/local/local_comm.h"
#include "core/cpu/kernels.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "engine/engine.h"
#include "models/decoder/gpt.h"
#include "train/hf/export.h"
#include "train/hf/weights.h"

namespace zeroth {
namespace {

std::string temp_path(const std::string& name) {
  return fmt::format("{}/zeroth_export_{}_{}.safetensors", ::testing::TempDir(), name, ::getpid());
}

// Hugging Face GPT-2's tensors for n_layer 2, n_embd C, vocab V, positions T.
std::map<std::string, std::vector<int64_t>> hf_gpt2(int64_t V, int64_t T, int64_t C) {
  std::map<std::string, std::vector<int64_t>> out = {{"transformer.wte.weight", {V, C}},
                                                     {"transformer.wpe.weight", {T, C}},
                                                     {"transformer.ln_f.weight", {C}},
                                                     {"transformer.ln_f.bias", {C}}};
  for (int l = 0; l < 2; ++l) {
    const std::string p = fmt::format("transformer.h.{}.", l);
    out[p + "ln_1.weight"] = {C};
    out[p + "ln_1.bias"] = {C};
    out[p + "attn.c_attn.weight"] = {C, 3 * C};
    out[p + "attn.c_attn.bias"] = {3 * C};
    out[p + "attn.c_proj.weight"] = {C, C};
    out[p + "attn.c_proj.bias"] = {C};
    out[p + "ln_2.weight"] = {C};
    out[p + "ln_2.bias"] = {C};
    out[p + "mlp.c_fc.weight"] = {C, 4 * C};
    out[p + "mlp.c_fc.bias"] = {4 * C};
    out[p + "mlp.c_proj.weight"] = {4 * C, C};
    out[p + "mlp.c_proj.bias"] = {C};
  }
  return out;
}

GptConfig tiny() {
  GptConfig gc;
  gc.vocab_size = 64, gc.seq_len = 16, gc.n_layer = 2, gc.n_head = 2, gc.n_embd = 32;
  return gc;
}

constexpr int kB = 2, kT = 16;

// On two ranks: the tiny GPT at `stage` in `compute`, two training steps on `tokens` (kB x kT),
// then `after` on every rank.
void train_tiny(int stage, DType compute, const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
                const std::function<void(Communicator&, Engine&, Gpt&)>& after) {
  run_local_ranks(2, [&](Communicator& comm) {
    EngineConfig ec;
    ec.zero.stage = stage;
    ec.zero.gather_16bit_weights_on_model_save = true;
    ec.compute_dtype = compute;
    ec.optimizer.lr = 1e-2;
    ec.schedule.base_lr = 1e-2;
    auto device = make_device("cpu");
    Engine engine(*device, comm, ec);
    Gpt gpt(engine, tiny());
    engine.finalize();
    for (int s = 0; s < 2; ++s) {
      float loss = 0;
      gpt.forward_backward(tokens.data(), targets.data(), kB, kT, &loss);
      engine.step();
    }
    engine.compute_stream().synchronize();
    after(comm, engine, gpt);
  });
}

std::vector<int32_t> some_tokens(size_t mul, size_t add) {
  std::vector<int32_t> out(kB * kT);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<int32_t>((i * mul + add) % 64);
  return out;
}

struct Saved {
  std::vector<std::vector<float>> masters;   // rank 0's master values per block
  std::vector<std::vector<size_t>> offsets;  // each parameter's start in its block
};

// Trains the tiny GPT (bf16) at `stage` and saves its weights as `dtype`.
Saved train_and_save(int stage, DType dtype, const std::string& path) {
  Saved saved;
  train_tiny(stage, DType::bf16, some_tokens(7, 0), some_tokens(7, 1), [&](Communicator& comm, Engine& engine, Gpt&) {
    std::vector<std::vector<float>> mine;
    for (size_t b = 0; b < engine.plan().blocks.size(); ++b) mine.push_back(engine.master_values(static_cast<int>(b)));
    save_gpt_weights(engine, tiny(), path, dtype);
    if (comm.rank() == 0) {
      saved.masters = std::move(mine);
      for (const auto& blk : engine.plan().blocks) saved.offsets.push_back(blk.param_offsets);
    }
  });
  return saved;
}

TEST(GptWeights, SaveInHuggingFaceNamesAndLayoutsWithTheMasterValues) {
  const auto specs = Gpt::block_specs(tiny());
  for (const auto& [stage, dtype] : std::vector<std::pair<int, DType>>{{3, DType::f32}, {1, DType::bf16}}) {
    SCOPED_TRACE(fmt::format("stage {}, {}", stage, dtype_name(dtype)));
    const std::string path = temp_path(std::string(dtype_name(dtype)));
    const Saved saved = train_and_save(stage, dtype, path);
    ASSERT_FALSE(std::filesystem::exists(path + ".tmp"));
    const SafeTensors file = read_safetensors(path);
    EXPECT_EQ(file.metadata.at("format"), "pt");  // what Hugging Face's loader expects
    const auto expected = hf_gpt2(64, 16, 32);
    ASSERT_EQ(file.tensors.size(), expected.size());
    for (const auto& [name, shape] : expected) {
      ASSERT_TRUE(file.tensors.contains(name)) << name;
      EXPECT_EQ(file.tensors.at(name).shape, shape) << name;
      EXPECT_EQ(file.tensors.at(name).dtype, dtype == DType::f32 ? "F32" : "BF16") << name;
    }
    // Every value, from zeroth's [out, in] master values, through Hugging Face's orientation.
    size_t checked = 0, total = 0;
    for (size_t b = 0; b < specs.size(); ++b) {
      for (size_t i = 0; i < specs[b].params.size(); ++i) {
        const auto& p = specs[b].params[i];
        const size_t at = saved.offsets[b][i];
        total += p.numel();
        const std::string block = specs[b].name == "embed" ? "transformer." : "transformer." + specs[b].name + ".";
        const std::string name = block + p.name + (specs[b].name == "embed" ? ".weight" : "");
        const std::vector<float> got = file.at(name).as_f32();
        const bool conv1d = p.shape.size() == 2 && specs[b].name != "embed";
        const size_t rows = static_cast<size_t>(p.shape[0]), cols = p.shape.size() == 2 ? static_cast<size_t>(p.shape[1]) : 1;
        for (size_t r = 0; r < rows; ++r) {
          for (size_t c = 0; c < cols; ++c) {
            float want = saved.masters[b][at + r * cols + c];
            if (dtype == DType::bf16)
              cpu::cast(&want, DType::f32, &want, DType::bf16, 1), cpu::cast(&want, DType::bf16, &want, DType::f32, 1);
            const float have = got[conv1d ? c * rows + r : r * cols + c];
            ASSERT_EQ(have, want) << name << " [" << r << ", " << c << "]";
            ++checked;
          }
        }
      }
    }
    EXPECT_EQ(checked, total);
    std::filesystem::remove(path);
  }
}

// PyTorch reads the file by itself (tests/reference/hf_gpt2_loss.py: the header parsed by hand, a
// GPT-2 forward in Hugging Face's layout) and computes the loss zeroth's evaluation computes for
// the same batch with the same weights: f32 weights from an f32 run, and bf16 weights from a bf16
// run, which the script widens and computes with in f32. Bound: f32 1e-5 relative, the order of f32
// sums in the kernels (measured 6.7e-8); bf16 1e-4, as zeroth's bf16 evaluation also rounds the
// products' activations and attention's operands to bf16, which the script does not (measured
// 1.6e-5). A weight misplaced or misread moves the loss by far more.
TEST(GptWeights, PyTorchReadsThemAndComputesZerothsLoss) {
  ASSERT_EQ(std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1"), 0)
      << "/usr/bin/python3 cannot import torch: Debian's python3-torch is missing (tools/install-deps.sh installs it)";
  const GptConfig gc = tiny();
  const int B = kB, T = kT;
  const std::vector<int32_t> tokens = some_tokens(13, 5), targets = some_tokens(3, 1);
  for (const DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const std::string path = temp_path(std::string("torch_") + std::string(dtype_name(dtype)));
    float zeroth_loss = 0;
    train_tiny(dtype == DType::f32 ? 3 : 1, dtype, tokens, targets, [&](Communicator& comm, Engine& engine, Gpt& gpt) {
      float eval = 0;
      gpt.evaluate(tokens.data(), targets.data(), B, T, &eval);
      engine.compute_stream().synchronize();
      save_gpt_weights(engine, gc, path, dtype);
      if (comm.rank() == 0) zeroth_loss = eval;
    });
    nlohmann::json batch = {{"n_head", gc.n_head}, {"tokens", nlohmann::json::array()}, {"targets", nlohmann::json::array()}};
    for (int b = 0; b < B; ++b) {
      batch["tokens"].push_back(std::vector<int32_t>(tokens.begin() + b * T, tokens.begin() + (b + 1) * T));
      batch["targets"].push_back(std::vector<int32_t>(targets.begin() + b * T, targets.begin() + (b + 1) * T));
    }
    const std::string batch_path = path + ".json";
    std::ofstream(batch_path) << batch.dump();
    const std::string cmd = fmt::format("/usr/bin/python3 {}/tests/reference/hf_gpt2_loss.py {} {} 2>&1", ZEROTH_SOURCE_DIR, path,
                                        batch_path);
    std::string out;
    FILE* pipe = ::popen(cmd.c_str(), "r");
    ASSERT_NE(pipe, nullptr) << cmd;
    char buf[4096];
    while (std::fgets(buf, sizeof buf, pipe) != nullptr) out += buf;
    ASSERT_EQ(::pclose(pipe), 0) << out;
    const auto result = nlohmann::json::parse(out);
    EXPECT_EQ(result["tensors"].get<int>(), 4 + 12 * gc.n_layer) << out;
    const double torch_loss = result["loss"].get<double>();
    std::printf("%s: zeroth %.7f, PyTorch from the file %.7f (relative %.2g)\n", std::string(dtype_name(dtype)).c_str(), zeroth_loss,
                torch_loss, std::abs(torch_loss - zeroth_loss) / zeroth_loss);
    EXPECT_NEAR(torch_loss, zeroth_loss, (dtype == DType::f32 ? 1e-5 : 1e-4) * zeroth_loss) << out;
    std::filesystem::remove(path);
    std::filesystem::remove(batch_path);
  }
}

// Rank 0 cannot write (no such folder): it raises an IoError naming the path once the gathers
// are done, the other rank returns, and no file is left.
TEST(GptWeights, AFailedSaveRaisesOnRankZeroWithoutHangingTheOthers) {
  const std::string path = ::testing::TempDir() + "/no-such-folder/model.safetensors";
  try {
    train_and_save(2, DType::f32, path);
    FAIL() << "the save into a missing folder succeeded";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-folder/model.safetensors.tmp"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

// The way back: a file as Hugging Face publishes GPT-2 (names without "transformer.", more
// positions than model.seq_len, a smaller vocabulary than the model's padded one, a tensor in
// bf16) read into zeroth's layout: every value where it belongs, Conv1D weights transposed back,
// extra positions dropped, missing vocabulary rows zero. A file of another shape is refused
// naming the tensor.
TEST(GptWeights, ReadBackFromHuggingFaceLayout) {
  const GptConfig gc = tiny();  // V 64, T 16, C 32
  const int64_t V = 60, T = 20, C = 32;
  SafeTensors file;
  uint32_t seed = 1;
  auto value = [&] { return static_cast<float>((seed = seed * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f; };
  for (auto [name, shape] : hf_gpt2(V, T, C)) {
    SafeTensor t;
    t.dtype = name.ends_with("ln_f.bias") ? "BF16" : "F32";
    t.shape = shape;
    std::vector<float> v(t.numel());
    for (auto& x : v) x = value();
    if (t.dtype == "BF16") {
      t.data.resize(v.size() * 2);
      cpu::cast(v.data(), DType::f32, t.data.data(), DType::bf16, v.size());
    } else {
      t.data.resize(v.size() * 4);
      std::memcpy(t.data.data(), v.data(), t.data.size());
    }
    file.tensors[name.substr(12)] = std::move(t);  // GPT2Model's names
  }
  file.metadata["format"] = "pt";
  const std::string path = temp_path("hf_layout");
  write_safetensors(path, file);
  const auto specs = Gpt::block_specs(gc);
  HfModelReader reader(gc, path);
  size_t seen = 0;
  for (size_t block = 0; block < specs.size(); ++block) {
    for (size_t param = 0; param < specs[block].params.size(); ++param) {
      const auto& p = specs[block].params[param];
      // Whole, and in two ranges split at an odd element.
      std::vector<float> got(p.numel(), -1.0f);
      const size_t cut = p.numel() / 3 + 1;
      reader.read(static_cast<int>(block), param, p, 0, cut, got.data());
      reader.read(static_cast<int>(block), param, p, cut, p.numel(), got.data() + cut);
      std::string hf = specs[block].name == "embed" ? p.name + ".weight" : specs[block].name + "." + p.name;
      const auto want = file.tensors.at(hf).as_f32();
      const bool conv1d = p.shape.size() == 2 && specs[block].name != "embed";
      for (size_t i = 0; i < got.size(); ++i) {
        float expect = 0;
        if (conv1d) {
          const size_t rows = static_cast<size_t>(p.shape[0]), cols = static_cast<size_t>(p.shape[1]);
          expect = want[(i % cols) * rows + i / cols];  // zeroth [out, in] from Hugging Face's [in, out]
        } else {
          expect = i < want.size() ? want[i] : 0.0f;  // wte rows past the file's vocabulary: zero
        }
        ASSERT_EQ(got[i], expect) << hf << " element " << i;
      }
      ++seen;
    }
  }
  EXPECT_EQ(seen, 4u + 12u * 2u);
  GptConfig wider = gc;
  wider.n_embd = 48;
  try {
    HfModelReader bad(wider, path);
    ADD_FAILURE() << "a file of another width was read";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("wte.weight is [60, 32] but the model"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace zeroth
