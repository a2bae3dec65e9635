// The benchmarks of `zeroth bench`; each file registers one under the `bench` command.
#pragma once

#include <filesystem>  // std::filesystem

#include <CLI/CLI.hpp>

namespace zeroth::tools {

// A file or folder removed, with what it holds, when this goes out of scope however the scope
// ends: what a benchmark writes is gone after it.
struct RemovedOnExit {
  std::filesystem::path path;
  ~RemovedOnExit() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

void add_bench_kernels_command(CLI::App& bench);
void add_bench_attention_command(CLI::App& bench);
void add_bench_comm_command(CLI::App& bench);
void add_bench_optim_command(CLI::App& bench);
void add_bench_engine_command(CLI::App& bench);
void add_bench_train_command(CLI::App& bench);
void add_bench_offload_command(CLI::App& bench);
void add_bench_offload_step_command(CLI::App& bench);
void add_bench_ckpt_command(CLI::App& bench);
void add_bench_pipeline_command(CLI::App& bench);

}  // namespace zeroth::tools
