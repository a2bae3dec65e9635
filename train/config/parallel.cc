// The parallel section of a training config, and DeepSpeed's pipeline section.

#include <fmt/format.h>  // fmt::format

#include "core/config_section.h"  // ConfigSection, is_auto
#include "core/error.h"           // ZEROTH_THROW
#include "train/config/sections.h"

namespace zeroth {

using json = nlohmann::json;

namespace {

// Ulysses: parallel.sequence, or DeepSpeed's top-level sequence_parallel_size (they must agree when
// both are given), checked against the data-parallel size, the window and the heads.
void read_sequence(TrainConfig& t, const json& j, const ConfigSection& par) {
  ParallelConfig& p = t.parallel;
  int64_t ds = 1;
  if (j.contains("sequence_parallel_size")) {
    const json& v = j["sequence_parallel_size"];
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > (1 << 12))
      ZEROTH_THROW(ConfigError, "sequence_parallel_size must be an integer from 1 to 4096, got {}", v.dump());
    ds = v.get<int64_t>();
  }
  p.sequence = static_cast<int>(par.integer("sequence", ds, 1, 1 << 12));
  if (par.has("sequence") && j.contains("sequence_parallel_size") && ds != p.sequence) {
    ZEROTH_THROW(ConfigError, "parallel.sequence = {} but sequence_parallel_size = {}; give one, or make them agree", p.sequence, ds);
  }
  if (p.sequence == 1) return;
  if (t.data_parallel() % p.sequence != 0) {
    ZEROTH_THROW(ConfigError,
                 "parallel.sequence = {} must divide the data-parallel size, {} (run.world_size {} over pipeline x tensor = {}): "
                 "each sample is shared by a run of that many data-parallel ranks",
                 p.sequence, t.data_parallel(), t.run.world_size, p.pipeline * p.tensor);
  }
  if (t.model.seq_len % p.sequence != 0) {
    ZEROTH_THROW(ConfigError,
                 "parallel.sequence = {} splits each sample's model.seq_len = {} positions over its ranks; make model.seq_len a "
                 "multiple of it",
                 p.sequence, t.model.seq_len);
  }
  GptPart check;
  check.sq_ranks = p.sequence, check.tp_ranks = p.tensor;
  Gpt::block_specs(t.model, check);  // the heads against U now, not at the start of training
}

// Ring attention: parallel.context C with parallel.context_method "ring" (the one method), checked
// against the data-parallel size, the window (2C chunks), Ulysses, the device and packing.
void read_context(TrainConfig& t, const ConfigSection& par) {
  static constexpr std::string_view kMethods[] = {"ring"};
  ParallelConfig& p = t.parallel;
  p.context = static_cast<int>(par.integer("context", 1, 1, 1 << 12));
  par.string("context_method", "ring", kMethods);
  if (p.context == 1) return;
  if (p.sequence > 1) {
    ZEROTH_THROW(ConfigError,
                 "parallel.sequence = {} (Ulysses) and parallel.context = {} (ring attention) both split each sample's positions; "
                 "they do not compose yet: use one of them",
                 p.sequence, p.context);
  }
  if (t.data_parallel() % p.context != 0) {
    ZEROTH_THROW(ConfigError,
                 "parallel.context = {} must divide the data-parallel size, {} (run.world_size {} over pipeline x tensor = {}): "
                 "each sample is shared by a run of that many data-parallel ranks{}",
                 p.context, t.data_parallel(), t.run.world_size, p.pipeline * p.tensor,
                 t.data_parallel() == 1 ? " (on one rank, --set parallel.context=1)" : "");
  }
  if (t.model.seq_len % (2 * p.context) != 0) {
    ZEROTH_THROW(ConfigError,
                 "parallel.context = {} cuts each sample's model.seq_len = {} positions into 2 x {} = {} equal chunks (each rank "
                 "holds two, for an even causal load); make model.seq_len a multiple of {}",
                 p.context, t.model.seq_len, p.context, 2 * p.context, 2 * p.context);
  }
  if (t.run.device != "cpu") {
    ZEROTH_THROW(ConfigError,
                 "parallel.context = {} runs ring attention, whose kernels run on the cpu device only (run.device is \"{}\"); split "
                 "long windows over GPUs with parallel.sequence (Ulysses)",
                 p.context, t.run.device);
  }
  if (t.data.packing) {
    ZEROTH_THROW(ConfigError,
                 "parallel.context = {} (ring attention) takes one sample a row: turn data.packing off, or use parallel.sequence "
                 "(Ulysses) for packed samples",
                 p.context);
  }
}

}  // namespace

// zeroth's `parallel` section and DeepSpeed's `pipeline`: the stages, schedule and partition. The
// data-parallel size is what is left of the world.
// Long: both sections' keys with each one's checks beside it; the later checks (world size, experts, micro-batches) need
// the stage, tensor and expert counts read before them.
void read_parallel(TrainConfig& t, json& j) {
  static constexpr std::string_view kParallelKeys[] = {"tensor",         "sequence_parallel", "pipeline",      "schedule",
                                                       "virtual_stages", "micro_batches",     "expert",        "expert_overlap",
                                                       "sequence",       "context",           "context_method"};
  static constexpr std::string_view kPipelineKeys[] = {"stages",          "partition_method",
                                                       "partition",       "activation_checkpoint_interval",
                                                       "seed_layers",     "pipe_partitioned",
                                                       "grad_partitioned"};
  static constexpr std::string_view kSchedules[] = {"gpipe", "1f1b", "interleaved"};
  ParallelConfig& p = t.parallel;
  json parallel = j.value("parallel", json::object());
  // DeepSpeed's words in the wrong section: say where they go.
  if (parallel.is_object() && parallel.contains("stages"))
    ZEROTH_THROW(ConfigError, "parallel.stages is not a key: the stages are parallel.pipeline (or DeepSpeed's pipeline.stages)");
  if (const auto ds_section = j.value("pipeline", json::object()); ds_section.is_object() && ds_section.contains("micro_batches")) {
    ZEROTH_THROW(ConfigError,
                 "pipeline.micro_batches is not one of DeepSpeed's pipeline keys: the micro-batches are parallel.micro_batches "
                 "(or gradient_accumulation_steps)");
  }
  const ConfigSection par(parallel, "parallel", kParallelKeys);
  json ds = j.value("pipeline", json::object());
  if (ds.is_object() && ds.contains("stages") && is_auto(ds["stages"])) ds.erase("stages");  // DeepSpeed's default
  const ConfigSection pipe(ds, "pipeline", kPipelineKeys);
  p.pipeline = static_cast<int>(par.integer("pipeline", pipe.integer("stages", 1, 1, 1 << 12), 1, 1 << 12));
  if (par.has("pipeline") && pipe.has("stages") && pipe.integer("stages", 1, 1, 1 << 12) != p.pipeline) {
    ZEROTH_THROW(ConfigError, "parallel.pipeline = {} but pipeline.stages = {}; give one, or make them agree", p.pipeline,
                 pipe.raw("stages").dump());
  }
  const std::string kind = par.string("schedule", "1f1b", kSchedules);
  p.schedule = kind == "gpipe" ? PipeKind::gpipe : kind == "interleaved" ? PipeKind::interleaved : PipeKind::one_f_one_b;
  p.virtual_stages = static_cast<int>(par.integer("virtual_stages", p.schedule == PipeKind::interleaved ? 2 : 1, 1, 1 << 10));
  if (p.schedule != PipeKind::interleaved && p.virtual_stages != 1) {
    ZEROTH_THROW(ConfigError, "parallel.virtual_stages = {} needs parallel.schedule = \"interleaved\" (it is \"{}\")",
                 p.virtual_stages, kind);
  }
  if (p.schedule == PipeKind::interleaved && (p.virtual_stages < 2 || p.pipeline < 2)) {
    ZEROTH_THROW(
        ConfigError,
        "parallel.schedule = \"interleaved\" runs parallel.virtual_stages >= 2 model chunks on each of parallel.pipeline >= 2 "
        "stages (it has {} and {}); use \"1f1b\" otherwise",
        p.virtual_stages, p.pipeline);
  }
  const char* method_key = pipe.has("partition_method") ? "partition_method" : "partition";
  if (pipe.has(method_key)) {
    const json& m = pipe.raw(method_key);
    if (m.is_array()) {
      for (const auto& n : m) {
        if (!n.is_number_integer()) ZEROTH_THROW(ConfigError, "pipeline.{} lists layer counts; {} is not one", method_key, n.dump());
        p.partition_counts.push_back(n.get<int>());
      }
      p.partition = "list";
    } else if (m.is_string() && (m == "parameters" || m == "uniform" || m == "best")) {
      // DeepSpeed's config default "best" leaves the choice to the engine: balanced parameters.
      p.partition = m == "uniform" ? "uniform" : "parameters";
    } else {
      ZEROTH_THROW(ConfigError,
                   "pipeline.{} = {}: use \"parameters\" (balance parameter counts), \"uniform\" (equal layer counts) or a list of "
                   "layers per virtual stage",
                   method_key, m.dump());
    }
  }
  const int64_t interval = pipe.integer("activation_checkpoint_interval", 0, 0, 1 << 20);
  if (interval > 1) {
    ZEROTH_THROW(ConfigError,
                 "pipeline.activation_checkpoint_interval = {}: zeroth recomputes every layer (1) or none (0); a GPT layer is its "
                 "checkpointing unit",
                 interval);
  }
  if (interval == 1 && j.contains("model") && j["model"].is_object() && j["model"].value("activation_checkpointing", true) == false) {
    ZEROTH_THROW(ConfigError,
                 "pipeline.activation_checkpoint_interval = 1 recomputes every layer but model.activation_checkpointing is false; "
                 "give one of them");
  }
  if (interval == 1) t.model.activation_checkpointing = true;
  if (pipe.has("seed_layers") && pipe.flag("seed_layers", false)) {
    ZEROTH_THROW(ConfigError,
                 "pipeline.seed_layers = true seeds each layer's initialization by its index; zeroth's parameters are seeded by name "
                 "already (the same values at any partition); remove it");
  }
  p.tensor = static_cast<int>(par.integer("tensor", 1, 1, 1 << 10));
  p.sequence_parallel = par.flag("sequence_parallel", false);
  if (p.sequence_parallel && p.tensor == 1) {
    ZEROTH_THROW(ConfigError,
                 "parallel.sequence_parallel splits the tokens over the tensor-parallel ranks, but parallel.tensor is 1; set "
                 "parallel.tensor, or remove it");
  }
  for (const char* k : {"pipe_partitioned", "grad_partitioned"}) {
    if (!pipe.has(k)) continue;
    t.no_effect.push_back(
        p.tensor == 1 ? fmt::format("pipeline.{}: it splits messages across tensor-parallel ranks, which this run does not have", k)
                      : fmt::format("pipeline.{}: zeroth's stages send each tensor-parallel rank's rows of the activations with "
                                    "parallel.sequence_parallel and whole ones without it",
                                    k));
  }
  if (t.run.world_size % p.pipeline != 0 && p.tensor == 1) {
    ZEROTH_THROW(ConfigError,
                 "run.world_size = {} is not a multiple of the {} pipeline stages (parallel.pipeline, pipeline.stages): the ranks "
                 "are data-parallel x pipeline stages; make run.world_size a multiple of them",
                 t.run.world_size, p.pipeline);
  }
  if (t.run.world_size % (p.pipeline * p.tensor) != 0) {
    ZEROTH_THROW(ConfigError,
                 "run.world_size = {} is not a multiple of the {} pipeline stages (parallel.pipeline, pipeline.stages) x {} "
                 "tensor-parallel ranks (parallel.tensor): the ranks are data-parallel x pipeline stages x tensor-parallel; make "
                 "run.world_size a multiple of {}",
                 t.run.world_size, p.pipeline, p.tensor, p.pipeline * p.tensor);
  }
  if (p.tensor > 1) {
    GptPart check;
    check.tp_ranks = p.tensor;
    Gpt::block_specs(t.model, check);  // heads and vocabulary against tp now, not at the start of training
  }
  p.expert = static_cast<int>(par.integer("expert", 1, 1, 1 << 12));
  p.expert_overlap = par.flag("expert_overlap", true);
  if (p.expert > 1) {
    if (!t.model.moe.enabled()) {
      ZEROTH_THROW(ConfigError,
                   "parallel.expert = {} shares the experts of model.moe out over ranks, but the model has no expert layers; set "
                   "model.moe or remove parallel.expert",
                   p.expert);
    }
    if (t.data_parallel() % p.expert != 0) {
      ZEROTH_THROW(ConfigError,
                   "parallel.expert = {} must divide the data-parallel size, {} (run.world_size {} over pipeline x tensor = {}): the "
                   "experts are shared out over runs of that many data-parallel ranks",
                   p.expert, t.data_parallel(), t.run.world_size, p.pipeline * p.tensor);
    }
    GptPart check;
    check.ep_ranks = p.expert;
    Gpt::block_specs(t.model, check);  // the experts against E now
  }
  read_sequence(t, j, par);
  read_context(t, par);
  // The cycle's micro-batches are the pipeline's: parallel.micro_batches sets
  // gradient_accumulation_steps (DeepSpeed's pipeline engine does the same).
  if (par.has("micro_batches")) {
    const int64_t m = par.integer("micro_batches", 1, 1, 1 << 20);
    if (j.contains("gradient_accumulation_steps") && !is_auto(j["gradient_accumulation_steps"]) &&
        j["gradient_accumulation_steps"] != json(m)) {
      ZEROTH_THROW(ConfigError,
                   "parallel.micro_batches = {} but gradient_accumulation_steps = {}: a pipeline's micro-batches are the accumulation "
                   "steps; give one, or make them agree",
                   m, j["gradient_accumulation_steps"].dump());
    }
    j["gradient_accumulation_steps"] = m;
  }
  if (p.pipeline > 1) t.layers_per_virtual_stage();  // the partition's errors now, not at the start of training
  if (t.run.trace && p.pipeline == 1) {
    ZEROTH_THROW(
        ConfigError,
        "run.trace writes each pipeline stage's timeline; this run has no pipeline (parallel.pipeline = 1): remove it, or set "
        "parallel.pipeline");
  }
}

}  // namespace zeroth
