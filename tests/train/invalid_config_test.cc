// Invalid training configs against the exact errors written by hand: one case per rule a value
// can break, each naming the key, the value it got and what it takes.
#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "tests/train/config_fixture.h"

namespace zeroth {
namespace {

using namespace config_fixture;

struct ErrorCase {
  const char* name;
  const char* patch;
  const char* error;
  int launched = 0;
};
void PrintTo(const ErrorCase& c, std::ostream* os) { *os << c.name; }

class Invalid : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(Invalid, GivesTheExactError) {
  const auto& p = GetParam();
  EXPECT_EQ(error_of(with(base(), p.patch), p.launched), p.error);
}

INSTANTIATE_TEST_SUITE_P(
    Table, Invalid,
    ::testing::Values(
        ErrorCase{"Typo", R"({"train_micro_batch_size_per_gpuu": 2})",
                  "train_micro_batch_size_per_gpuu is not a known key (did you mean 'train_micro_batch_size_per_gpu'?) (DeepSpeed "
                  "ignores keys it does not read here; zeroth refuses one this close to a known key, so a typo cannot pass "
                  "unnoticed)"},
        ErrorCase{"Bf16Typo", R"({"bf16": {"enabeld": true}})",
                  "bf16.enabeld is not a known key (did you mean 'enabled'?) (DeepSpeed ignores keys it does not read here; zeroth "
                  "refuses one this close to a known key, so a typo cannot pass unnoticed)"},
        ErrorCase{
            "BatchRule",
            R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "run": {"world_size": 2}})",
            "train_batch_size (10) must equal train_micro_batch_size_per_gpu (2) x gradient_accumulation_steps (2) x data-parallel "
            "ranks (2) = 8"},
        ErrorCase{"BatchIndivisible", R"({"train_batch_size": 7, "train_micro_batch_size_per_gpu": 2})",
                  "train_batch_size (7) is not a multiple of train_micro_batch_size_per_gpu (2) x data-parallel ranks (1) = 2, so "
                  "gradient_accumulation_steps cannot be derived"},
        ErrorCase{"NoBatch", R"({"train_micro_batch_size_per_gpu": null})",
                  "the batch size is not set: give train_micro_batch_size_per_gpu (sequences per rank per micro-step) and/or "
                  "train_batch_size (sequences per optimizer step)"},
        ErrorCase{"ModelKeyType", R"({"model": {"n_layer": "two"}})", "model.n_layer must be an integer in [1, 4096], got \"two\""},
        ErrorCase{"ModelKeyTypo", R"({"model": {"n_heads": 2}})", "model.n_heads is not a known key (did you mean 'n_head'?)"},
        ErrorCase{"HeadsDivide", R"({"model": {"n_head": 3}})",
                  "model.n_embd (16) must be a multiple of model.n_head (3): each head gets n_embd / n_head channels"},
        ErrorCase{"Preset", R"({"model": {"preset": "gpt3"}})",
                  "model.preset \"gpt3\" is not a known preset; use one of gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m, smollm-135m, "
                  "smollm-360m, qwen2.5-0.5b, llama-3.2-1b, tinyllama-1.1b, llama-2-7b, llama-3-8b, llama-3-70b"},
        ErrorCase{"Stage", R"({"zero_optimization": {"stage": 4}})", "zero_optimization.stage must be 0, 1, 2 or 3, got 4"},
        ErrorCase{"OffloadNeedsAPath", R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}})",
                  "zero_optimization.offload_optimizer.device is \"nvme\" but zero_optimization.offload_optimizer.nvme_path is not "
                  "set: name a folder on the drive for the swap files"},
        ErrorCase{"OffloadAtStage0", R"({"zero_optimization": {"stage": 0, "cpu_offload": true}})",
                  "zero_optimization.offload_optimizer.device = \"cpu\" needs zero_optimization.stage 1, 2 or 3 (the offloaded state "
                  "is the rank's shard), got stage 0"},
        ErrorCase{"OffloadKeyTypo",
                  R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memroy": true}}})",
                  "zero_optimization.offload_optimizer.pin_memroy is not a known key (did you mean 'pin_memory'?)"},
        ErrorCase{"GatherOnSave", R"({"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": "yes"}})",
                  "zero_optimization.stage3_gather_16bit_weights_on_model_save must be true or false, got \"yes\""},
        ErrorCase{"KnownButUnsupported", R"({"progressive_layer_drop": {"enabled": true, "theta": 0.5}})",
                  "progressive_layer_drop = {\"enabled\":true,\"theta\":0.5} is a DeepSpeed feature zeroth does not support (skips "
                  "transformer layers stochastically during training); remove it or set \"enabled\": false"},
        ErrorCase{"ZeroPlusPlus", R"({"zero_optimization": {"stage": 3, "zero_quantized_gradients": true}})",
                  "zero_optimization.zero_quantized_gradients = true is a DeepSpeed feature zeroth does not support (ZeRO++ reduces "
                  "gradients quantized to int4); remove it"},
        ErrorCase{"TypoStillATypo", R"({"zero_optimization": {"stage": 3, "contiguous_gradient": true}})",
                  "zero_optimization.contiguous_gradient is not a known key (did you mean 'contiguous_gradients'?)"},
        ErrorCase{"BothPrecisions", R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})",
                  "fp16.enabled and bf16.enabled are both true; choose one precision"},
        ErrorCase{
            "NetworkMonitor", R"({"wandb": {"enabled": true, "project": "p"}})",
            "wandb = {\"enabled\":true,\"project\":\"p\"} is a DeepSpeed feature zeroth does not support (sends metrics to a "
            "service over the network, and zeroth has no client for one; use `tensorboard` or `csv_monitor` (files TensorBoard and "
            "spreadsheets read), or <run.output_dir>/metrics.jsonl); remove it or set \"enabled\": false"},
        ErrorCase{"MonitorKey", R"({"csv_monitor": {"enabled": true, "job_nam": "x"}})",
                  "csv_monitor.job_nam is not a known key (did you mean 'job_name'?)"},
        ErrorCase{"MonitorJob", R"({"tensorboard": {"enabled": true, "job_name": "a/b"}})",
                  "tensorboard.job_name = \"a/b\" must name one folder (not empty, no '/')"},
        ErrorCase{"WallClock", R"({"wall_clock_breakdown": "yes"})", "wall_clock_breakdown must be true or false, got \"yes\""},
        ErrorCase{"PipelineWorld", R"({"pipeline": {"stages": 2}})",
                  "run.world_size = 1 is not a multiple of the 2 pipeline stages (parallel.pipeline, pipeline.stages): the ranks are "
                  "data-parallel x pipeline stages; make run.world_size a multiple of them"},
        ErrorCase{"SequenceWorld", R"({"parallel": {"sequence": 2}, "run": {"world_size": 3}})",
                  "parallel.sequence = 2 must divide the data-parallel size, 3 (run.world_size 3 over pipeline x tensor = 1): each "
                  "sample is shared by a run of that many data-parallel ranks"},
        ErrorCase{"SequenceWindow", R"({"model": {"seq_len": 6}, "parallel": {"sequence": 4}, "run": {"world_size": 4}})",
                  "parallel.sequence = 4 splits each sample's model.seq_len = 6 positions over its ranks; make model.seq_len a "
                  "multiple of it"},
        ErrorCase{"SequenceHeads", R"({"model": {"n_head": 2}, "parallel": {"sequence": 4}, "run": {"world_size": 4}})",
                  "parallel.sequence = 4 splits the attention heads over its ranks, but each rank has 2 (model.n_head = 2), not a "
                  "multiple of it; use a sequence-parallel size that divides them"},
        ErrorCase{"SequenceKeyValueHeads",
                  R"({"model": {"architecture": "llama", "n_head": 6, "n_kv_head": 3, "n_embd": 24, "seq_len": 12},
                      "parallel": {"sequence": 2}, "run": {"world_size": 2}})",
                  "parallel.sequence = 2 shares the 3 key/value heads out over its ranks (model.n_kv_head = 3): it must divide them, "
                  "or be a multiple of them (each rank then takes a copy of the one its query heads read); use such a "
                  "sequence-parallel size"},
        ErrorCase{"SequenceDisagrees", R"({"sequence_parallel_size": 4, "parallel": {"sequence": 2}, "run": {"world_size": 4}})",
                  "parallel.sequence = 2 but sequence_parallel_size = 4; give one, or make them agree"},
        ErrorCase{"ContextWorld", R"({"parallel": {"context": 2}, "run": {"world_size": 3}})",
                  "parallel.context = 2 must divide the data-parallel size, 3 (run.world_size 3 over pipeline x tensor = 1): each "
                  "sample is shared by a run of that many data-parallel ranks"},
        ErrorCase{"ContextWindow", R"({"model": {"seq_len": 12}, "parallel": {"context": 4}, "run": {"world_size": 4}})",
                  "parallel.context = 4 cuts each sample's model.seq_len = 12 positions into 2 x 4 = 8 equal chunks (each rank holds "
                  "two, for an even causal load); make model.seq_len a multiple of 8"},
        ErrorCase{"ContextWithUlysses", R"({"parallel": {"context": 2, "sequence": 2}, "run": {"world_size": 4}})",
                  "parallel.sequence = 2 (Ulysses) and parallel.context = 2 (ring attention) both split each sample's positions; "
                  "they do not compose yet: use one of them"},
        ErrorCase{"ContextOnCuda", R"({"parallel": {"context": 2}, "run": {"world_size": 2, "device": "cuda"}})",
                  "parallel.context = 2 runs ring attention, whose kernels run on the cpu device only (run.device is \"cuda\"); split "
                  "long windows over GPUs with parallel.sequence (Ulysses)"},
        ErrorCase{"ContextMethod", R"({"parallel": {"context": 2, "context_method": "ulysses"}, "run": {"world_size": 2}})",
                  "parallel.context_method = \"ulysses\" is not one of: ring"},
        ErrorCase{"TensorWorld", R"({"parallel": {"tensor": 2, "pipeline": 2}, "run": {"world_size": 6}})",
                  "run.world_size = 6 is not a multiple of the 2 pipeline stages (parallel.pipeline, pipeline.stages) x 2 "
                  "tensor-parallel ranks (parallel.tensor): the ranks are data-parallel x pipeline stages x tensor-parallel; make "
                  "run.world_size a multiple of 4"},
        ErrorCase{"TensorHeads", R"({"parallel": {"tensor": 4}, "run": {"world_size": 4}})",
                  "parallel.tensor = 4 splits the attention heads over its ranks, but model.n_head = 2 is not a multiple of it; use "
                  "a tensor-parallel size that divides the heads"},
        ErrorCase{"TensorKeyValueHeads",
                  R"({"model": {"architecture": "llama", "n_head": 8, "n_kv_head": 2, "n_embd": 64, "intermediate_size": 128},
                      "parallel": {"tensor": 4}, "run": {"world_size": 4}})",
                  "parallel.tensor = 4 splits the key/value heads over its ranks, but model.n_kv_head = 2 is not a multiple of it; as "
                  "Megatron-LM, zeroth does not replicate key/value heads: use a tensor-parallel size that divides them"},
        ErrorCase{
            "SequenceParallelTokens",
            R"({"train_micro_batch_size_per_gpu": 1, "model": {"seq_len": 9}, "parallel": {"tensor": 2, "sequence_parallel": true},
                      "run": {"world_size": 2}})",
            "parallel.sequence_parallel splits each micro-batch's 1 x 9 = 9 tokens (train_micro_batch_size_per_gpu x "
            "model.seq_len) over the 2 tensor-parallel ranks; make the count a multiple of 2"},
        ErrorCase{"TensorVocabulary",
                  R"({"model": {"vocab_size": 2, "n_head": 4}, "data": {"vocab_size": 2}, "parallel": {"tensor": 4},
                      "run": {"world_size": 4}})",
                  "parallel.tensor = 4 splits the vocabulary, but model.vocab_size is only 2"},
        ErrorCase{"SequenceParallelWithoutTensor", R"({"parallel": {"sequence_parallel": true}})",
                  "parallel.sequence_parallel splits the tokens over the tensor-parallel ranks, but parallel.tensor is 1; set "
                  "parallel.tensor, or remove it"},
        ErrorCase{"AutoTp", R"({"tensor_parallel": {"autotp_size": 2}})",
                  "tensor_parallel = {\"autotp_size\":2} is a DeepSpeed feature zeroth does not support (AutoTP: tensor parallelism "
                  "of Hugging Face models; zeroth splits its GPT over parallel.tensor ranks (Megatron-LM's split)); remove it"},
        ErrorCase{
            "TraceWithoutPipeline", R"({"run": {"trace": true}})",
            "run.trace writes each pipeline stage's timeline; this run has no pipeline (parallel.pipeline = 1): remove it, or set "
            "parallel.pipeline"},
        ErrorCase{
            "CheckpointIntervalAgainstModel",
            R"({"pipeline": {"stages": 2, "activation_checkpoint_interval": 1}, "model": {"activation_checkpointing": false}, "run": {"world_size": 2}})",
            "pipeline.activation_checkpoint_interval = 1 recomputes every layer but model.activation_checkpointing is false; give "
            "one of them"},
        ErrorCase{"PipelineStagesDisagree", R"({"pipeline": {"stages": 2}, "parallel": {"pipeline": 4}, "run": {"world_size": 4}})",
                  "parallel.pipeline = 4 but pipeline.stages = 2; give one, or make them agree"},
        ErrorCase{
            "InterleavedOneChunk",
            R"({"parallel": {"pipeline": 2, "schedule": "interleaved", "virtual_stages": 1}, "run": {"world_size": 2}})",
            "parallel.schedule = \"interleaved\" runs parallel.virtual_stages >= 2 model chunks on each of parallel.pipeline >= 2 "
            "stages (it has 1 and 2); use \"1f1b\" otherwise"},
        ErrorCase{
            "MicroBatchesAndAccumulation",
            R"({"parallel": {"pipeline": 2, "micro_batches": 4}, "gradient_accumulation_steps": 2, "run": {"world_size": 2}})",
            "parallel.micro_batches = 4 but gradient_accumulation_steps = 2: a pipeline's micro-batches are the accumulation steps; "
            "give one, or make them agree"},
        ErrorCase{"CheckpointInterval",
                  R"({"pipeline": {"stages": 2, "activation_checkpoint_interval": 3}, "run": {"world_size": 2}})",
                  "pipeline.activation_checkpoint_interval = 3: zeroth recomputes every layer (1) or none (0); a GPT layer is its "
                  "checkpointing unit"},
        ErrorCase{
            "TooFewLayers",
            R"({"parallel": {"pipeline": 2, "schedule": "interleaved"}, "run": {"world_size": 2}, "model": {"n_layer": 3}})",
            "pipeline: 4 virtual stages (stages x virtual_stages) but the model has 3 layers; every virtual stage needs one: use "
            "fewer stages or virtual stages, or more layers (model.n_layer)"},
        ErrorCase{
            "PartitionList",
            R"({"pipeline": {"stages": 2, "partition_method": [1, 2]}, "run": {"world_size": 2}, "model": {"n_layer": 4}})",
            "pipeline.partition_method: the list gives 2 virtual stages holding 3 layers; it needs 2 counts of at least 1 that add "
            "up to model.n_layer = 4"},
        ErrorCase{"CpuCheckpointingWithoutCheckpointing",
                  R"({"activation_checkpointing": {"cpu_checkpointing": true}, "model": {"activation_checkpointing": false}})",
                  "activation_checkpointing.cpu_checkpointing moves the activation checkpoints to host memory, but checkpointing is "
                  "off (model.activation_checkpointing false): turn it on, or drop cpu_checkpointing"},
        ErrorCase{"Aio", R"({"aio": {"block_size": 1000}})",
                  "aio.block_size must be a multiple of 4096 bytes (O_DIRECT) and at most 1 GiB, got 1000"},
        ErrorCase{"Gds", R"({"aio": {"use_gds": true}})",
                  "aio.use_gds = true asks for GPUDirect Storage, a DeepSpeed feature zeroth does not support; remove it"},
        ErrorCase{"Backend", R"({"run": {"backend": "mpi"}})", "run.backend = \"mpi\" is not one of: local, gloo, nccl"},
        ErrorCase{"GlooNeedsLauncher", R"({"run": {"backend": "gloo", "world_size": 2}})",
                  "run.backend = \"gloo\" needs one process per rank: start with `zeroth launch -n 2 -- zeroth train ...` (or set "
                  "run.backend to \"local\" for threads)"},
        ErrorCase{"LaunchedWorld", R"({"run": {"world_size": 4}})",
                  "run.world_size = 4 but the launcher started 2 ranks (WORLD_SIZE); remove run.world_size or make them agree", 2},
        ErrorCase{"DataNeedsPath", R"({"data": {"format": "text"}})",
                  "data.train is required for data.format \"text\" (a path to the training text file)"},
        ErrorCase{"DataFormat", R"({"data": {"format": "json", "train": "x"}})",
                  "data.format = \"json\" is not one of: bin, text, synthetic, jsonl (did you mean 'jsonl'?)"},
        ErrorCase{"JsonlNeedsPath", R"({"data": {"format": "jsonl"}})",
                  "data.train is required for data.format \"jsonl\" (a path to the training records: a .jsonl or .jsonl.gz file, or a "
                  "folder of them)"},
        ErrorCase{"LossOnIsJsonls", R"({"data": {"format": "text", "train": "x", "loss_on": "all"}})",
                  "data.loss_on belongs to data.format \"jsonl\" (records of conversations, prompts and completions, texts)"},
        ErrorCase{"PackingIsJsonls", R"({"data": {"format": "bin", "train": "x", "packing": true}})",
                  "data.packing belongs to data.format \"jsonl\" (records of conversations, prompts and completions, texts)"},
        ErrorCase{"LossOnChoices", R"({"data": {"format": "jsonl", "train": "x", "loss_on": "assistants"}})",
                  "data.loss_on = \"assistants\" is not one of: assistant, completion, all (did you mean 'assistant'?)"},
        ErrorCase{"FieldsAreStrings", R"({"data": {"format": "jsonl", "train": "x", "fields": {"messages": 3}}})",
                  "data.fields.messages must be a string, got 3"},
        ErrorCase{"AutoWhereUnknown", R"({"steps_per_print": "auto"})",
                  "steps_per_print is \"auto\", which zeroth cannot resolve for this key; give a value"},
        // A misspelled key is refused whatever its value, "auto" (which a known key takes as DeepSpeed's
        // default in these sections) included: in every section that takes "auto".
        ErrorCase{
            "AutoTypoTopLevel", R"({"gradient_accumulation_step": "auto"})",
            "gradient_accumulation_step is not a known key (did you mean 'gradient_accumulation_steps'?) (DeepSpeed ignores keys "
            "it does not read here; zeroth refuses one this close to a known key, so a typo cannot pass unnoticed)"},
        ErrorCase{"AutoTypoZero", R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_sise": "auto"}})",
                  "zero_optimization.stage3_prefetch_bucket_sise is not a known key (did you mean 'stage3_prefetch_bucket_size'?)"},
        ErrorCase{"AutoTypoOffloadOptimizer",
                  R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memroy": "auto"}}})",
                  "zero_optimization.offload_optimizer.pin_memroy is not a known key (did you mean 'pin_memory'?)"},
        ErrorCase{
            "AutoTypoOffloadParam",
            R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu", "buffer_cont": "auto"}}})",
            "zero_optimization.offload_param.buffer_cont is not a known key (did you mean 'buffer_count'?)"},
        ErrorCase{"AutoTypoFp16", R"({"fp16": {"enabled": true, "loss_scale_windw": "auto"}})",
                  "fp16.loss_scale_windw is not a known key (did you mean 'loss_scale_window'?)"},
        ErrorCase{"AutoTypoBf16", R"({"bf16": {"enabeld": "auto"}})",
                  "bf16.enabeld is not a known key (did you mean 'enabled'?) (DeepSpeed ignores keys it does not read here; zeroth "
                  "refuses one this close to a known key, so a typo cannot pass unnoticed)"},
        ErrorCase{"AutoTypoOptimizer", R"({"optimizer": {"type": "AdamW", "params": {"weight_decy": "auto"}}})",
                  "optimizer.params.weight_decy is not a parameter of AdamW (did you mean 'weight_decay'?)"},
        ErrorCase{"AutoTypoScheduler", R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_step": "auto"}}})",
                  "scheduler.params.warmup_num_step is not a parameter of WarmupLR (did you mean 'warmup_num_steps'?)"},
        ErrorCase{"Optimizer", R"({"optimizer": {"type": "AdamW", "params": {"lr": -1}}})",
                  "optimizer.params.lr = -1 for AdamW: must be >= 0"},
        ErrorCase{"Clipping", R"({"gradient_clipping": -1})", "gradient_clipping must be a number in [0, 1e+30], got -1"},
        ErrorCase{"NoDecayPattern", R"({"model": {"no_weight_decay": ["bias", "attn.*"]}})",
                  "model.no_weight_decay entry \"attn.*\" is neither a role (weight, bias, norm, embedding) nor a pattern matching "
                  "any parameter name (e.g. \"embed.wte\")"},
        ErrorCase{"NoDecayType", R"({"model": {"no_weight_decay": "bias"}})",
                  "model.no_weight_decay must be a list of roles (weight, bias, norm, embedding) or parameter-name globs like "
                  "\"h.*.attn.*\", got \"bias\""},
        ErrorCase{"FrozenType", R"({"model": {"trainable": "transformer.h.*"}})",
                  "model.trainable must be a list of Hugging Face parameter-name patterns, got \"transformer.h.*\""},
        ErrorCase{"FrozenUnmatched", R"({"model": {"frozen": ["model.layers.*"]}})",
                  "model.frozen entry \"model.layers.*\" matches no parameter; the model's names are Hugging Face's, such as "
                  "\"transformer.wpe.weight\""},
        ErrorCase{"FrozenPartBlock", R"({"model": {"frozen": ["transformer.h.0.attn.*"]}})",
                  "model.trainable / model.frozen train transformer.h.0.mlp.c_proj.bias but freeze transformer.h.0.attn.c_proj.bias: "
                  "zeroth freezes whole blocks (h.0 here); train or freeze all of its parameters"},
        ErrorCase{"FrozenEverything", R"({"model": {"trainable": ["transformer.h.*"], "frozen": ["transformer.h.0.*"]}})",
                  "model.trainable / model.frozen freeze every parameter: nothing would train"},
        ErrorCase{"LoraDropout", R"({"lora": {"r": 4, "dropout": 0.1}})",
                  "lora.dropout = 0.1: zeroth trains without dropout, the adapters' input included; set it to 0 (LoRA's own "
                  "regularizer is its rank)"},
        ErrorCase{"LoraTarget", R"({"lora": {"r": 4, "target_modules": ["q_proj"]}})",
                  "lora.target_modules names \"q_proj\", which GPT-2 has no linear layer of; its layers' are all-linear, c_attn, "
                  "c_proj, c_fc"},
        ErrorCase{"LoraWithFrozen", R"({"lora": {"r": 4}, "model": {"frozen": ["transformer.w*"]}})",
                  "lora trains its adapters alone (every base parameter frozen); model.trainable / model.frozen with it would train "
                  "base blocks PEFT's adapter files cannot hold: drop them"},
        ErrorCase{"Vocab", R"({"model": {"vocab_size": 100}, "data": {"format": "synthetic", "vocab_size": 200}})",
                  "model.vocab_size (100) is smaller than data.vocab_size (200): every token id must have an embedding row"}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace zeroth
