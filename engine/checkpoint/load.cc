// Checkpoint load (engine/checkpoint/checkpoint.h): the same checks on every rank, the files' verification
// split between the ranks, then each rank's owned elements read from whichever files hold them.
#include "engine/checkpoint/checkpoint.h"

#include <chrono>      // std::chrono::steady_clock
#include <filesystem>  // std::filesystem

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "core/error.h"                      // CheckpointError
#include "engine/checkpoint/engine_state.h"  // engine_states, engine_tensors, Agreement

namespace zeroth::ckpt {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

IoStats load(Engine& engine, const std::string& path, Manifest* out, bool weights_only) {
  const auto t0 = Clock::now();
  const Plan& plan = engine.plan();
  const int rank = file_index(engine), ranks = file_count(engine);
  // The same checks on every rank, from the same files; the ranks agree before going on, so a
  // rank that cannot read them (another disk, a file replaced meanwhile) stops them all.
  auto states = engine_states(engine);
  if (weights_only) states.resize(1);
  const auto tensors = engine_tensors(engine);
  std::string step_dir, manifest_path;
  Manifest m;
  std::vector<int> state_at;  // the manifest's index of each engine state
  std::vector<const TensorEntry*> found;
  // A pipeline's stages hold the model between them: their tensors together must be the
  // checkpoint's (the tied copy counted once).
  // With expert parallelism a rank holds one slice of the experts: the others hold as many tensors.
  size_t expert_tensors = 0;
  for (const auto& t : tensors) expert_tensors += plan.blocks[t.block].expert ? 1 : 0;
  size_t model_tensors = tensors.size() + (plan.ep - 1) * expert_tensors;
  if (engine.pipeline_stages() > 1) {
    // Tensor-parallel rank 0 of each stage saves all of the stage's tensors (its slices and the
    // replicated ones).
    const auto counts = all_gather_words(engine, {saved_tensors(engine).size() + (plan.ep - 1) * expert_tensors});
    model_tensors = 0;
    for (int s = 0; s < engine.pipeline_stages(); ++s)
      model_tensors += counts[static_cast<size_t>(s) * engine.tensor_ranks() * plan.dp];
  }
  Agreement early(engine);
  early.attempt([&] {
    step_dir = resolve(path);
    m = read_manifest(step_dir);
    manifest_path = (fs::path(step_dir) / kManifestName).string();
    for (const auto& s : states) {
      const int i = m.state_index(s.name);
      if (i < 0) {
        throw CheckpointError(
            fmt::format("{}: the checkpoint holds no \"{}\" optimizer state ({} wrote it; its states: {}), which this run's "
                        "{} needs; use the same optimizer type, or start from its weights only (run.init_from)",
                        manifest_path, s.name, m.optimizer, fmt::join(m.states, ", "),
                        optimizer_name(engine.config().optimizer.kind)));
      }
      state_at.push_back(i);
    }
    for (const auto& t : tensors) {
      const TensorEntry* c = m.find(t.name);
      if (c == nullptr) {
        throw CheckpointError(
            fmt::format("{}: the checkpoint has no tensor {}; it was written for another model (check model.* in the "
                        "config against the checkpoint's)",
                        manifest_path, t.name));
      }
      if (c->shape != t.shape) {
        throw CheckpointError(
            fmt::format("{}: tensor {} has the shape [{}] in the checkpoint but [{}] in this model; the model.* keys "
                        "differ from the run that wrote it",
                        manifest_path, t.name, fmt::join(c->shape, ", "), fmt::join(t.shape, ", ")));
      }
      found.push_back(c);
    }
    if (m.tensors.size() != model_tensors) {
      throw CheckpointError(fmt::format("{}: the checkpoint holds {} tensors, this model {}; it was written for another model",
                                        manifest_path, m.tensors.size(), model_tensors));
    }
  });
  early.agree("loading a checkpoint");
  IoStats io{step_dir};

  // Verification, the files split between the ranks; every rank learns every outcome.
  const size_t files = m.files.size();
  std::vector<uint64_t> checks(2 * files, 0);
  for (size_t f = static_cast<size_t>(rank); f < files; f += static_cast<size_t>(ranks)) {
    const FileCheck c = verify_file(step_dir, m.files[f]);
    checks[2 * f] = static_cast<uint64_t>(c.problem), checks[2 * f + 1] = c.found;
    io.bytes += c.read_bytes;
  }
  const auto all = all_gather_words(engine, checks);
  std::string problems;
  for (size_t f = 0; f < files; ++f) {
    const size_t r = f % static_cast<size_t>(ranks), at = r * 2 * files + 2 * f;
    const FileCheck c{static_cast<FileCheck::Problem>(all[at]), all[at + 1]};
    if (c.problem != FileCheck::Problem::none) problems += (problems.empty() ? "" : "; ") + c.describe(step_dir, m.files[f]);
  }
  if (!problems.empty())
    throw CheckpointError(problems + "; the checkpoint cannot be loaded (an earlier step folder may still be whole)");

  Agreement agreement(engine);
  agreement.attempt([&] {
    Reader reader(step_dir, m);
    std::vector<float> moments;
    size_t first = 0;
    for (size_t b = 0; b < plan.blocks.size(); ++b) {
      size_t end = first;
      while (end < tensors.size() && tensors[end].block == static_cast<int>(b)) ++end;
      // Padded elements [lo, hi) of the block's state s.
      auto fill = [&](size_t s, size_t lo, size_t hi, float* values) {
        for (size_t t = first; t < end; ++t) {
          const size_t a = std::max(lo, tensors[t].begin), e = std::min(hi, tensors[t].begin + tensors[t].numel);
          if (a < e)
            reader.read_slice(*found[t], state_at[s], tensors[t].split, a - tensors[t].begin, e - tensors[t].begin, values + (a - lo));
        }
      };
      engine.set_block_values(static_cast<int>(b), [&](size_t lo, size_t hi, float* values) { fill(0, lo, hi, values); });
      for (size_t s = 1; s < states.size(); ++s) {
        const OwnedRange& r = plan.range(states[s].kind, static_cast<int>(b));
        moments.assign(r.numel(), 0.0f);  // reused: its pages are touched once, not per block
        fill(s, r.lo, r.hi, moments.data());
        engine.write_owned(states[s].kind, static_cast<int>(b), moments);
      }
      first = end;
    }
    io.bytes += reader.bytes_read();
    if (!weights_only) engine.restore_counters(m.engine);
  });
  engine.release_transfer_buffers();
  agreement.agree(fmt::format("loading the checkpoint {}", step_dir).c_str());
  io.all_bytes = m.data_bytes();
  io.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (out != nullptr) *out = m;
  return io;
}

}  // namespace zeroth::ckpt
