// The step-time model and the search over layouts.
#include "planner/planner.h"

#include <algorithm>  // std::max, std::min, std::sort
#include <array>      // std::array

#include <fmt/format.h>       // fmt::format
#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/error.h"  // ZEROTH_THROW

namespace zeroth {
namespace {

double ring_all_reduce(double bytes, uint64_t ranks, double bw) {
  return ranks <= 1 ? 0 : 2.0 * static_cast<double>(ranks - 1) / static_cast<double>(ranks) * bytes / bw;
}
// Reduce-scatter and all-gather each move half an all-reduce's bytes.
double ring_half(double bytes, uint64_t ranks, double bw) { return ring_all_reduce(bytes, ranks, bw) / 2; }

// Ulysses over sq ranks needs whole heads on each: the query heads of a tensor-parallel rank split
// evenly, its key/value heads too or copied (fewer than sq), and the window split evenly.
bool ulysses_fits(const GptShape& shape, uint64_t tp, uint64_t sq) {
  if (sq == 1) return true;
  const uint64_t heads = shape.heads / tp, kv = (shape.kv_heads > 0 ? shape.kv_heads : shape.heads) / tp;
  return heads % sq == 0 && (kv % sq == 0 || sq % kv == 0) && shape.seq_len % sq == 0;
}

std::vector<uint64_t> divisors(uint64_t n, uint64_t limit) {
  std::vector<uint64_t> out;
  for (uint64_t d = 1; d <= std::min(n, limit); ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

}  // namespace

std::vector<std::string> Cluster::calibrate(const nlohmann::json& j) {
  std::vector<std::string> set;
  auto results = [&]() -> const nlohmann::json& { return j.at("results"); };
  if (j.contains("tokens_per_s") && j.contains("model_flops_per_token")) {  // bench train
    const double flops = j["tokens_per_s"].get<double>() * j["model_flops_per_token"].get<double>();
    if (!(flops / peak_flops >= 0.01 && flops / peak_flops <= 1)) {
      ZEROTH_THROW(InvalidArgument,
                   "bench train measured {:.3g} FLOP/s, {:.3g} of the {:.3g} peak: calibrate with a bench run on the GPUs being "
                   "planned for, and give their --peak-flops",
                   flops, flops / peak_flops, peak_flops);
    }
    matmul_efficiency = flops / peak_flops;
    set.push_back(fmt::format("achieved {:.3g} FLOP/s (bench train: {} tokens/s) = {:.3f} of the {:.3g} peak", flops,
                              j["tokens_per_s"].get<double>(), matmul_efficiency, peak_flops));
  } else if (j.contains("ranks") && j.contains("results") && j.contains("backend")) {  // bench comm
    double best = 0;
    uint64_t largest = 0;
    for (const auto& r : results())
      if (r.at("op") == "all_reduce" && r.at("bytes").get<uint64_t>() >= largest) {
        if (r.at("bytes").get<uint64_t>() > largest) best = 0;
        largest = r.at("bytes").get<uint64_t>();
        best = std::max(best, r.at("busbw").get<double>() * 1e9);
      }
    if (best <= 0) ZEROTH_THROW(InvalidArgument, "the bench comm output has no all_reduce results to calibrate from");
    intra_node_bw = best;
    set.push_back(fmt::format("intra-node all-reduce bus bandwidth {:.3g} GB/s (bench comm, {} bytes, {} ranks, {})", best / 1e9,
                              largest, j["ranks"].get<int>(), j["backend"].get<std::string>()));
  } else if (j.contains("results") && !j["results"].empty() && j["results"][0].contains("params_per_s")) {  // bench optim
    double best = 0;
    uint64_t largest = 0;
    for (const auto& r : results()) {
      if (r.at("optimizer") != "AdamW" || r.value("device", "cpu") != "cpu") continue;
      const uint64_t n = r.at("params").get<uint64_t>();
      if (n > largest) best = 0, largest = n;
      if (n == largest) best = std::max(best, r.at("params_per_s").get<double>());
    }
    if (best <= 0) ZEROTH_THROW(InvalidArgument, "the bench optim output has no CPU AdamW results to calibrate from");
    cpu_optimizer_rate = best;
    set.push_back(fmt::format("CPU AdamW {:.3g} parameters/s per node (bench optim, {} parameters)", best, largest));
  } else if (j.contains("best") && j["best"].contains("read_gbps")) {  // bench offload
    nvme_bw = std::min(j["best"]["read_gbps"].get<double>(), j["best"]["write_gbps"].get<double>()) * 1e9;
    set.push_back(fmt::format("NVMe {:.3g} GB/s per node (bench offload at {}: the slower of read and write)", nvme_bw / 1e9,
                              j.value("path", "?")));
    if (j.contains("cuda") && j["cuda"].is_object() && j["cuda"].contains("h2d_gbps") && j["cuda"].contains("d2h_gbps")) {
      pcie_bw = std::min(j["cuda"]["h2d_gbps"].get<double>(), j["cuda"]["d2h_gbps"].get<double>()) * 1e9;
      set.push_back(fmt::format("PCIe {:.3g} GB/s per GPU (bench offload --device cuda)", pcie_bw / 1e9));
    }
  } else {
    ZEROTH_THROW(
        InvalidArgument,
        "not the JSON output of zeroth bench train, comm, optim or offload (run one of them with --json and pass its output)");
  }
  return set;
}

double moe_exposed_exchange(double x, double cf, int n, bool backward) {
  // n slots of x / n each way and cf / n of products (forward; backward: the input gradients',
  // then cf of weight gradients). The exchange stream sends every slot's rows, then each slot's
  // results once made; the compute stream runs each slot once its rows are in. The pass ends with
  // the later stream, whose extremes over the slots give these terms.
  const double s = x / n, c = cf / n;
  const double exchange_end = std::max({2 * x, x + s + c, 2 * s + cf});
  if (!backward) return std::max(exchange_end, std::max(s + cf, x + c)) - cf;
  const double compute_end = std::max(s + cf, x + c) + cf;
  return std::max(exchange_end, compute_end) - 2 * cf;
}

// Long: the step-time model term by term (compute, recomputation, tensor, pipeline, expert and data-parallel traffic,
// offload, update), each formula beside its source; the later terms are overlapped against fwd and bwd.
StepCost step_cost(const GptShape& shape, const Layout& l, const LayoutMemory& mem, const Cluster& c) {
  StepCost out;
  const double h = static_cast<double>(shape.hidden), s = static_cast<double>(shape.seq_len), v = static_cast<double>(shape.vocab);
  const double t = static_cast<double>(l.tp), m = static_cast<double>(l.micro_batches);
  // One micro-batch's positions on a rank: with Ulysses its s / sq of each sample (the attention's
  // 4 b s^2 h FLOPs then split over the sq ranks' heads as the other work over their positions).
  // Ring attention alike: its s / cp positions, each query meeting every key before it.
  const uint64_t sq = std::max<uint64_t>(l.sq, 1), cp = std::max<uint64_t>(l.cp, 1);
  const double tokens = static_cast<double>(l.micro_batch) * s / static_cast<double>(sq * cp);
  GptShape local = shape;
  local.seq_len = (shape.seq_len + sq * cp - 1) / (sq * cp);
  const uint64_t layers_on_stage = (shape.layers + l.pp - 1) / l.pp;
  const uint64_t moe_on_stage = std::min(layers_on_stage, (shape.moe_layers() + l.pp - 1) / l.pp);
  const double layers = static_cast<double>(layers_on_stage), moe_layers = static_cast<double>(moe_on_stage),
               dense_layers = layers - moe_layers;
  const double flops_rate = c.achieved_flops();

  // Narayanan et al. 2021: a layer's forward is 2 b s FLOPs per matmul weight (GPT-2's 12 h^2, a
  // Llama's smaller k and v and its three MLP matrices) and 4 b s^2 h in attention, the head's
  // 2 b s h V; the stage with the head (the last) is the slowest. Backward is twice forward. An
  // expert layer multiplies by its attention (split over tp), its router and top_k experts (whole
  // on every tensor-parallel rank, as models/decoder runs them).
  const double matmul = static_cast<double>(shape.layer_matmul_params());
  const double layer_fwd = tokens * (2 * matmul + 4 * s * h) / t;
  const double expert_matmul = shape.moe() ? static_cast<double>(shape.top_k * shape.expert_matmul_params()) : 0;
  const double router = static_cast<double>(shape.experts * shape.hidden);
  const double attention = static_cast<double>(shape.attention_matmul_params());
  const double moe_fwd = tokens * (2 * attention + 4 * s * h) / t + tokens * 2 * (router + expert_matmul);
  // The elementwise work between the matmuls reads and writes about the bytes of activations a
  // layer keeps (Korthikanti's count), at the device's memory bandwidth.
  const uint64_t ep = std::max<uint64_t>(l.ep, 1);
  auto layer_bytes = [&](Checkpointing ck) {
    return static_cast<double>(
        layer_activation_bytes(local, l.micro_batch, l.tp, l.sequence_parallel, ck, l.attention_scores, l.tiled_mlp, sq));
  };
  auto moe_bytes = [&](Checkpointing ck) {
    return shape.moe() ? static_cast<double>(moe_layer_activation_bytes(local, l.micro_batch, l.tp, l.sequence_parallel, ck, ep,
                                                                        l.attention_scores, sq))
                       : 0.0;
  };
  const double layer_elementwise = layer_bytes(Checkpointing::none) / c.device_memory_bw;
  const double moe_elementwise = moe_bytes(Checkpointing::none) / c.device_memory_bw;
  const double layers_fwd = dense_layers * (layer_fwd / flops_rate + layer_elementwise) +
                            moe_layers * (moe_fwd / flops_rate + moe_elementwise);
  const double fwd = layers_fwd + tokens * 2 * h * v / t / flops_rate;
  double recompute = 0;
  if (l.checkpointing == Checkpointing::full) recompute = layers_fwd;
  // Selective recomputation redoes the attention core: its two matmuls and the softmax and dropout.
  if (l.checkpointing == Checkpointing::selective) {
    const double core_bytes = layer_bytes(Checkpointing::none) - layer_bytes(Checkpointing::selective);
    recompute = layers * (tokens * 4 * s * h / t / flops_rate + core_bytes / c.device_memory_bw);
  }
  const double bwd = 2 * fwd + recompute;

  // Tensor parallelism: two all-reduces of the b s h activations per layer forward, two backward,
  // two more when the forward is recomputed; inside a node.
  const double act_bytes = 2 * tokens * h;
  const double tp_calls = layers * (4 + (l.checkpointing == Checkpointing::full ? 2 : 0));
  const double tp_mb = tp_calls * ring_all_reduce(act_bytes, l.tp, c.intra_node_bw);
  // Ranks: tp fastest, then dp, then pp; a group leaves the node when it spans more GPUs than one
  // node has, and then shares the node's network with the node's other GPUs.
  const double per_gpu_net = c.inter_node_bw / static_cast<double>(c.gpus_per_node);
  const double dp_bw = l.tp * l.dp <= c.gpus_per_node ? c.intra_node_bw : per_gpu_net;
  const double pp_bw = l.tp * l.dp * l.pp <= c.gpus_per_node ? c.intra_node_bw : per_gpu_net;
  // Each micro-batch sends its activations forward and their gradient back (split over tp).
  const double pp_mb = l.pp > 1 ? 2 * act_bytes / t / pp_bw : 0;
  // Expert parallelism: each expert layer's top_k b s rows of h go to their experts' ranks and
  // come back, forward and backward, and again when recomputation redoes the experts' forward (both
  // ways: models/decoder's recomputation exchanges the outputs too), (ep - 1) / ep of them leaving the
  // rank, in f32 as models/decoder sends them; the ep ranks are consecutive data-parallel ones, in a
  // node while tp x ep GPUs fit it. models/decoder exchanges each of a rank's n local experts' rows
  // apart on a stream of its own, under the expert products: moe_exposed_exchange.
  const double ep_bw = l.tp * ep <= c.gpus_per_node ? c.intra_node_bw : per_gpu_net;
  const double a2a_bytes = 4 * tokens * static_cast<double>(shape.top_k) * h * static_cast<double>(ep - 1) / static_cast<double>(ep);
  const double x = a2a_bytes / ep_bw, cf = tokens * 2 * expert_matmul / flops_rate;
  const int slots = static_cast<int>(std::max<uint64_t>(shape.experts / ep, 1));
  const double exposed = moe_exposed_exchange(x, cf, slots, false) * (l.checkpointing == Checkpointing::full ? 2 : 1) +
                         moe_exposed_exchange(x, cf, slots, true);
  const double ep_mb = shape.moe() && ep > 1 ? moe_layers * exposed : 0;
  // Ulysses: per layer forward, the rank's q, k, v rows out to the heads' ranks and the attention's
  // output back; backward the same two; the recomputed forward again; (sq - 1) / sq of each leaving
  // the rank, in f32 as models/decoder sends them, exposed (the exchanges wait for the projections
  // and the attention waits for them). The sq ranks are consecutive data-parallel ones.
  const double sq_bw = l.tp * sq <= c.gpus_per_node ? c.intra_node_bw : per_gpu_net;
  // A tensor-parallel rank's key/value heads, or sq copies of one where there are fewer.
  const double kv_heads = static_cast<double>((shape.kv_heads > 0 ? shape.kv_heads : shape.heads) / l.tp);
  const double qkv_width = h + 2 * h / static_cast<double>(shape.heads) * std::max(kv_heads, static_cast<double>(sq)) * t;
  const double sq_bytes = 4 * tokens * (qkv_width + h) / t * static_cast<double>(sq - 1) / static_cast<double>(sq);
  const double sq_mb = sq > 1 ? layers * (2 + (l.checkpointing == Checkpointing::full ? 1 : 0)) * sq_bytes / sq_bw : 0;
  // Ring attention: each of a layer's cp - 1 forward steps sends the rank's keys and values (f32, a
  // tensor-parallel rank's key/value heads) on while the step's blocks compute: what the send takes
  // beyond them is exposed; backward sends the keys and their gradient each step (the last
  // gradient's send under nothing), against twice the FLOPs; the recomputed forward again. A step's
  // blocks are two whole c x c ones (c = s / 2cp): the causal half of the 4 b s h FLOPs per position
  // the compute term counts, over cp steps. The cp ranks are consecutive data-parallel ones.
  const double cp_bw = l.tp * cp <= c.gpus_per_node ? c.intra_node_bw : per_gpu_net;
  const double kv_send = 4 * tokens * 2 * kv_heads * h / static_cast<double>(shape.heads) / cp_bw;
  const double step_attention = tokens * 2 * s * h / t / flops_rate / static_cast<double>(cp);
  const double ring_fwd = static_cast<double>(cp - 1) * std::max(0.0, kv_send - step_attention);
  const double ring_bwd = static_cast<double>(cp - 1) * std::max(0.0, 2 * kv_send - 2 * step_attention) + kv_send;
  const double cp_mb = cp > 1 ? layers * (ring_fwd * (l.checkpointing == Checkpointing::full ? 2 : 1) + ring_bwd) : 0;
  const double mb = fwd + bwd + tp_mb + pp_mb + ep_mb + sq_mb + cp_mb;

  out.compute = m * (fwd + bwd);
  out.tensor = m * tp_mb;
  out.pipeline = m * pp_mb;
  out.experts = m * ep_mb;
  out.sequence = m * (sq_mb + cp_mb);
  out.bubble = static_cast<double>(l.pp - 1) * mb;

  // Data parallelism over the stage's parameters, 16-bit. The engine reduces while backward runs
  // (the last micro-batch's, or every one's at stage 2) and prefetches stage-3 gathers ahead of use.
  // Experts are reduced over the dp / ep ranks holding the same ones, after the dense parameters.
  const double p = static_cast<double>(mem.stage_params), n = static_cast<double>(l.dp);
  const double pe = static_cast<double>(mem.expert_params), ne = static_cast<double>(std::max<uint64_t>(l.dp / ep, 1));
  const double all_reduce = ring_all_reduce(2 * (p - pe), l.dp, dp_bw) + ring_all_reduce(2 * pe, l.dp / ep, dp_bw);
  const double half = ring_half(2 * (p - pe), l.dp, dp_bw) + ring_half(2 * pe, l.dp / ep, dp_bw);
  const double shard = l.stage >= 1 ? (p - pe) / n + pe / ne : p;
  const double gpus_node = static_cast<double>(c.gpus_per_node);
  // A stage-3 pass first brings the rank's parameter shard to the device when it lives elsewhere.
  double fetch = 0;
  if (l.offload_param == OffloadDevice::cpu) fetch = 2 * shard / c.pcie_bw;
  if (l.offload_param == OffloadDevice::nvme) fetch = 2 * shard * gpus_node / c.nvme_bw;
  switch (l.stage) {
    case 0: out.data = std::max(0.0, all_reduce - bwd); break;
    case 1: out.data = std::max(0.0, half - bwd) + half; break;
    case 2: out.data = m * std::max(0.0, half - bwd) + half; break;
    default:
      out.data = m * (std::max(0.0, half - fwd) + std::max(0.0, 2 * half - bwd));
      out.offload += m * (std::max(0.0, half + fetch - fwd) - std::max(0.0, half - fwd)) +
                     m * (std::max(0.0, 2 * half + fetch - bwd) - std::max(0.0, 2 * half - bwd));
  }

  // The update: fp32 master, moments and gradient in, master, moments and the 16-bit copy out.
  if (l.offload_optimizer == OffloadDevice::none) {
    out.optimizer = shard * 30 / c.device_memory_bw;
  } else {
    // Gradients go to the host (per bucket during backward from stage 2), parameters come back.
    const double down = 2 * shard / c.pcie_bw, up = 2 * shard / c.pcie_bw;
    out.offload += (l.stage >= 2 ? std::max(0.0, down - bwd) : down) + up;
    const double cpu = shard / (c.cpu_optimizer_rate / gpus_node);
    // NVMe: master and both moments read and written, pipelined with the update.
    const double nvme = l.offload_optimizer == OffloadDevice::nvme ? 24 * shard * gpus_node / c.nvme_bw : 0;
    out.optimizer = cpu;
    out.offload += std::max(0.0, nvme - cpu);
  }
  out.step = out.compute + out.bubble + out.tensor + out.pipeline + out.experts + out.sequence + out.data + out.offload +
             out.optimizer;

  const double global_tokens = static_cast<double>(l.dp) * m * tokens;
  const double L = static_cast<double>(shape.layers), LE = static_cast<double>(shape.moe_layers());
  const double active_matmul = (L - LE) * matmul + LE * (attention + router + expert_matmul);
  out.model_flops = global_tokens * (6 * active_matmul + 12 * L * s * h + 6 * v * h);
  out.mfu = out.model_flops / (out.step * static_cast<double>(l.gpus()) * c.peak_flops);
  out.tokens_per_s = global_tokens / out.step;
  const std::array<std::pair<double, const char*>, 9> parts = {
      {{out.compute, "compute"},
       {out.sequence, l.cp > 1 ? "ring attention's sends" : "Ulysses all-to-all"},
       {out.bubble, "pipeline bubble"},
       {out.tensor, "tensor-parallel all-reduce"},
       {out.pipeline, "pipeline send/recv"},
       {out.experts, "expert all-to-all"},
       {out.data, "data-parallel collectives"},
       {out.offload, "offload transfers"},
       {out.optimizer, "optimizer step"}}};
  out.bound = std::max_element(parts.begin(), parts.end())->second;
  return out;
}

std::string does_not_fit(const LayoutMemory& memory, const Cluster& c) {
  if (memory.device > c.device_memory) return "device";
  if (c.host_memory > 0 && memory.host * c.gpus_per_node > c.host_memory) return "host";
  if (c.nvme_capacity > 0 && memory.nvme * c.gpus_per_node > c.nvme_capacity) return "nvme";
  return "";
}

namespace {

// The ranks that may share each sample, {sq, cp}: Ulysses over sq of the dp ranks, or the ring over
// cp (one of the two at a time), as far as `search` looks for them.
std::vector<std::pair<uint64_t, uint64_t>> sample_groups(const GptShape& shape, uint64_t tp, uint64_t dp, const PlanSearch& search) {
  std::vector<std::pair<uint64_t, uint64_t>> groups;
  for (uint64_t sq : divisors(dp, search.sequence ? dp : 1)) {
    if (ulysses_fits(shape, tp, sq)) groups.push_back({sq, 1});
  }
  for (uint64_t cp : divisors(dp, search.context ? dp : 1)) {
    if (cp > 1 && shape.seq_len % (2 * cp) == 0) groups.push_back({1, cp});
  }
  return groups;
}

}  // namespace

// Long: one loop a dimension of the search space (tp, pp, the sample groups, ep, the micro-batch, the stage, the
// placements, recomputation, sequence parallelism, the long-window savings), each with its own skip beside it.
PlanResult search_plans(const GptShape& shape, const Cluster& cluster, const PlanSearch& search) {
  if (const std::string bad = shape.problem(); !bad.empty()) ZEROTH_THROW(InvalidArgument, "the model's shape: {}", bad);
  if (search.global_batch == 0) ZEROTH_THROW(InvalidArgument, "give the global batch (sequences per step)");
  const uint64_t gpus = cluster.gpus();
  PlanResult result;
  std::vector<Candidate> fitting;
  using D = OffloadDevice;
  const std::array<std::pair<D, D>, 6> placements = {
      {{D::none, D::none}, {D::cpu, D::none}, {D::nvme, D::none}, {D::cpu, D::cpu}, {D::nvme, D::cpu}, {D::nvme, D::nvme}}};
  for (uint64_t tp : divisors(cluster.gpus_per_node, cluster.gpus_per_node)) {
    // Key/value heads are split over tp as the query heads are (Megatron refuses fewer of them).
    if (shape.heads % tp != 0 || (shape.kv_heads > 0 && shape.kv_heads % tp != 0)) continue;
    for (uint64_t pp : divisors(shape.layers, shape.layers)) {
      if (gpus % (tp * pp) != 0) continue;
      const uint64_t dp = gpus / (tp * pp);
      // Expert-parallel sizes: divisors of dp that divide the experts (1 for a dense model).
      std::vector<uint64_t> eps;
      for (uint64_t ep : divisors(dp, dp)) {
        if (ep == 1 || (shape.moe() && shape.experts % ep == 0)) eps.push_back(ep);
      }
      for (auto [sq, cp] : sample_groups(shape, tp, dp, search)) {
        if (search.global_batch % (dp / (sq * cp)) != 0) continue;
        const uint64_t per_rank = search.global_batch / (dp / (sq * cp));
        for (uint64_t ep : eps)
          for (uint64_t b : divisors(per_rank, search.max_micro_batch)) {
            for (int stage = 0; stage <= 3; ++stage) {
              if (search.stage >= 0 && stage != search.stage) continue;
              for (auto [opt, par] : placements) {
                if (opt != D::none && (!search.offload || stage == 0)) continue;
                if (par != D::none && stage != 3) continue;
                for (Checkpointing ck : {Checkpointing::none, Checkpointing::selective, Checkpointing::full}) {
                  if (search.runnable_only && ck == Checkpointing::selective) continue;
                  for (bool sp : {false, true}) {
                    if (sp && tp == 1) continue;
                    for (int memory_saving = 0; memory_saving < (search.sequence || search.context ? 3 : 1); ++memory_saving) {
                      // With --max-seq: the tiled MLP, then host checkpoints (full recomputation on one stage).
                      const bool tiled = memory_saving >= 1, host = memory_saving == 2;
                      if (host && (ck != Checkpointing::full || pp > 1)) continue;
                      Candidate cand;
                      cand.layout = {dp,
                                     tp,
                                     pp,
                                     ep,
                                     b,
                                     per_rank / b,
                                     stage,
                                     opt,
                                     par,
                                     ck,
                                     sp,
                                     PipeKind::one_f_one_b,
                                     search.attention_scores,
                                     sq,
                                     tiled,
                                     host,
                                     cp};
                      cand.memory = layout_memory(shape, cand.layout, search.buffers, cluster.runtime_memory);
                      ++result.considered;
                      cand.fits = does_not_fit(cand.memory, cluster).empty();
                      if (result.considered == 1 || cand.memory.device < result.smallest.memory.device) result.smallest = cand;
                      if (!cand.fits) continue;
                      cand.cost = step_cost(shape, cand.layout, cand.memory, cluster);
                      fitting.push_back(std::move(cand));
                    }
                  }
                }
              }
            }
          }
      }
    }
  }
  result.fitting = fitting.size();
  const size_t keep = std::min(search.top, fitting.size());
  std::partial_sort(fitting.begin(), fitting.begin() + static_cast<std::ptrdiff_t>(keep), fitting.end(),
                    [](const Candidate& a, const Candidate& b) {
    if (a.cost.step != b.cost.step) return a.cost.step < b.cost.step;
    return a.memory.device < b.memory.device;
  });
  fitting.resize(keep);
  result.best = std::move(fitting);
  if (result.considered > 0 && result.smallest.cost.step == 0)
    result.smallest.cost = step_cost(shape, result.smallest.layout, result.smallest.memory, cluster);
  return result;
}

WindowResult longest_window(GptShape shape, const Cluster& cluster, const PlanSearch& search, uint64_t granule, uint64_t limit) {
  if (granule == 0) ZEROTH_THROW(InvalidArgument, "longest_window: a granule of 0 positions");
  WindowResult out;
  auto fits = [&](uint64_t units, PlanResult* plans) {
    shape.seq_len = units * granule;
    ++out.probes;
    PlanResult r = search_plans(shape, cluster, search);
    const bool any = r.fitting > 0;
    if (plans != nullptr) *plans = std::move(r);
    return any;
  };
  const uint64_t most = limit / granule;
  if (most == 0) ZEROTH_THROW(InvalidArgument, "longest_window: a granule of {} positions is over the limit of {}", granule, limit);
  if (fits(most, nullptr)) {
    fits(most, &out.plans);
    out.seq_len = most * granule, out.capped = true;
    return out;
  }
  uint64_t lo = 0, hi = 1;  // units that fit, and that do not (once found)
  while (hi < most && fits(hi, nullptr)) lo = hi, hi = std::min(2 * hi, most);
  while (hi - lo > 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    (fits(mid, nullptr) ? lo : hi) = mid;
  }
  if (lo == 0) return out;
  fits(lo, &out.plans);
  out.seq_len = lo * granule;
  return out;
}

}  // namespace zeroth
