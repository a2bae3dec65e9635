// The folders, ranks and steps the checkpoint tests share.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/engine/mlp_harness.h"

namespace zeroth::checkpoint_fixture {

using testing::MlpRun;

// A fresh folder per test, removed at the end.
class Scratch {
 public:
  explicit Scratch(const std::string& name) : path_(fmt::format("{}/zeroth-ckpt-{}-{}", ::testing::TempDir(), name, ::getpid())) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~Scratch() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  std::string operator/(const std::string& sub) const { return path_ + "/" + sub; }

 private:
  std::string path_;
};

// Runs `body` on every rank of a local group of `dp` with a finalized engine (the harness's
// config at `stage`) holding an MLP of `widths`.
inline void on_ranks(int dp, int stage, const std::vector<int>& widths, const std::function<void(Communicator&, Engine&, Mlp&)>& body,
                     const std::function<void(EngineConfig&)>& tweak = {}) {
  run_local_ranks(dp, [&](Communicator& comm) {
    auto device = make_device("cpu", {});
    MlpRun run;
    run.stage = stage;
    EngineConfig config = testing::mlp_config(run);
    if (tweak) tweak(config);
    Engine engine(*device, comm, config);
    Mlp mlp(engine, {widths});
    engine.finalize();
    body(comm, engine, mlp);
  });
}

inline void on_ranks(int dp, int stage, const std::function<void(Communicator&, Engine&, Mlp&)>& body) {
  on_ranks(dp, stage, MlpRun{}.widths, body);
}

// One step of the MLP on a rank of 2 (or 1), batch k.
inline void mlp_step(Engine& engine, Mlp& mlp, const Communicator& comm, int k) {
  const MlpRun run;
  std::vector<float> x, t, loss(1);
  const int mb = run.global_batch / comm.size();
  testing::mlp_batch(k, run.global_batch, 16, 8, x, t);
  mlp.forward_backward(x.data() + comm.rank() * mb * 16, t.data() + comm.rank() * mb * 8, mb, loss.data(), 0);
  engine.step();
  engine.compute_stream().synchronize();
}

}  // namespace zeroth::checkpoint_fixture
