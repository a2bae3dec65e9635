// One rank of the multi-process engine test: trains the harness's MLP at ZeRO stage 3 over the
// gloo backend (rendezvous from the launcher environment) and writes its losses and final
// weights as JSON to the path in argv[1].
#include <cstdio>     // std::fprintf
#include <fstream>    // std::ofstream
#include <exception>  // std::exception

#include <nlohmann/json.hpp>

#include "comm/gloo/gloo_comm.h"
#include "comm/rendezvous.h"
#include "tests/engine/mlp_harness.h"

int main(int argc, char** argv) {
  using namespace zeroth;
  if (argc != 2) {
    std::fprintf(stderr, "usage: engine_gloo_worker OUTPUT.json (with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set)\n");
    return 2;
  }
  try {
    const auto info = rendezvous_from_env();
    if (!info) {
      std::fprintf(stderr, "engine_gloo_worker: no RANK/WORLD_SIZE in the environment\n");
      return 2;
    }
    auto comm = make_gloo_communicator(*info);
    testing::MlpRun run;
    run.stage = 3;
    const auto result = testing::train_mlp(*comm, run);
    nlohmann::json j{{"losses", result.losses}, {"weights", result.weights}};
    std::ofstream(argv[1]) << j.dump();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engine_gloo_worker: %s\n", e.what());
    return 1;
  }
}
