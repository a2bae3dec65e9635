#!/usr/bin/env python3
"""The PyTorch references of the Llama-family tests, written with Debian's python3-torch from the
papers and Hugging Face's documented conventions, not from zeroth's code. Run with /usr/bin/python3:

    cd tests/reference && /usr/bin/python3 llama_reference.py \
        --forward llama_torch.safetensors --train llama_train_torch.safetensors

--forward (tests/models/llama_test.cc): six small models, one micro-batch each: the logits, the
mean cross-entropy and the gradient of every parameter, in f32, under Hugging Face's parameter
names; for the two with expert layers also each layer's auxiliary and z losses, whose terms
(times their coefficients) join the cross-entropy in the gradient.
--train (tests/engine/train_torch_test.cc): "llama", "qwen2", "qwen3", "mixtral" and "switch" trained for 10 optimizer
steps as DeepSpeed's engine takes them (gpt_reference.py's batch, AdamW, WarmupCosineLR and
stepping), in f32 and in zeroth's bf16 mode; per step the loss, the gradient norm before clipping
and the lr, and the final weights.

The models:
- "llama": grouped-query attention (6 query heads over 2 key/value heads), an MLP width that is
  not 4 C, Llama 3's rope_scaling (with original_max_position_embeddings small enough to bite),
  an untied LM head;
- "llama_bias": Llama with attention_bias (q/k/v and output-projection biases), no rope scaling;
- "qwen2": q/k/v biases, 6 query heads over 3 key/value heads, rope_theta 1e6, the LM head tied
  to the embedding;
- "qwen3": per-head q/k RMSNorm before the rotation, head_dim 16 with n_embd 48 and 4 heads (the
  attention is wider than the residual stream), linear rope scaling, untied;
- "mixtral": every MLP a mixture of 4 SwiGLU experts, top-2, renormalised, dropless (Mixtral's
  names: block_sparse_moe.gate, experts.N.w1/w2/w3);
- "switch": the second layer's MLP 4 experts, top-1 with DeepSpeed's capacity, some tokens dropped.

The definitions:
- RMSNorm (Zhang and Sennrich 2019) as Llama computes it: x * rsqrt(mean(x^2) + eps) in f32, then
  times the weight.
- Rotary embedding (Su et al., RoFormer) in Hugging Face's rotate-half layout: channel i of a head
  pairs with channel i + hs/2; inv_freq_i = 1 / theta^(2i/hs); q' = q cos + rotate_half(q) sin with
  rotate_half(q) = (-q2, q1). Llama 3's scaling: wavelengths above original/low_freq_factor slowed by
  the factor, below original/high_freq_factor kept, those between blended; linear: inv_freq / factor.
- Grouped-query attention (Ainslie et al. 2023): key/value head j serves query heads j g .. j g + g - 1
  (each key/value head repeated g times in place, as Hugging Face's repeat_kv does); causal softmax
  of q k^T / sqrt(hs).
- SwiGLU MLP (Shazeer 2020): down(silu(gate(x)) * up(x)).
- Pre-norm blocks: h = x + o(attn(norm1(x))); out = h + mlp(norm2(h)); a final norm, the LM head.
"""
import argparse
import json
import math

import torch
import torch.nn.functional as F

from gpt_reference import TRAIN_BATCH, TRAIN_OPT, TRAIN_SCHEDULER, train, write_safetensors
from moe_reference import moe_layer
from products import attention, linear

CASES = {
    "llama": dict(vocab_size=96, seq_len=16, n_layer=2, n_embd=48, n_head=6, n_kv_head=2, head_dim=8, intermediate_size=80,
                  rms_norm_eps=1e-6, rope_theta=10000.0, qkv_bias=False, qk_norm=False, tie_word_embeddings=False,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8}),
        # Llama's attention_bias: biases on q, k, v and o (the output's added once, after the heads).
    "llama_bias": dict(vocab_size=96, seq_len=16, n_layer=2, n_embd=48, n_head=6, n_kv_head=2, head_dim=8, intermediate_size=80,
                       rms_norm_eps=1e-6, rope_theta=10000.0, qkv_bias=False, attention_bias=True, qk_norm=False,
                       tie_word_embeddings=False, rope_scaling=None),
    "qwen2": dict(vocab_size=96, seq_len=16, n_layer=2, n_embd=48, n_head=6, n_kv_head=3, head_dim=8, intermediate_size=64,
                  rms_norm_eps=1e-6, rope_theta=1000000.0, qkv_bias=True, qk_norm=False, tie_word_embeddings=True,
                  rope_scaling=None),
    "qwen3": dict(vocab_size=96, seq_len=16, n_layer=2, n_embd=48, n_head=4, n_kv_head=2, head_dim=16, intermediate_size=72,
                  rms_norm_eps=1e-6, rope_theta=10000.0, qkv_bias=False, qk_norm=True, tie_word_embeddings=False,
                  rope_scaling={"rope_type": "linear", "factor": 2.0}),
    # Mixtral: every layer's MLP 4 SwiGLU experts, top-2 of them, weights renormalised over the two,
    # dropless, with the load-balancing and z losses in the gradient.
    "mixtral": dict(vocab_size=96, seq_len=16, n_layer=2, n_embd=48, n_head=6, n_kv_head=2, head_dim=8, intermediate_size=80,
                    rms_norm_eps=1e-6, rope_theta=10000.0, qkv_bias=False, qk_norm=False, tie_word_embeddings=False,
                    rope_scaling=None,
                    moe=dict(num_experts=4, top_k=2, capacity_factor=1.0, eval_capacity_factor=1.0, min_capacity=0, drop_tokens=False,
                             normalize_top_k=True, aux_loss_coef=0.02, z_loss_coef=1e-3, every=1, intermediate_size=40)),
    # Switch: the second layer only, 4 experts, top-1 with capacity ceil(24 / 4 x 1.0) = 6: choices past
    # it dropped (their tokens pass the layer through the residual only).
    "switch": dict(vocab_size=96, seq_len=16, n_layer=2, n_embd=48, n_head=6, n_kv_head=2, head_dim=8, intermediate_size=80,
                   rms_norm_eps=1e-6, rope_theta=10000.0, qkv_bias=False, qk_norm=False, tie_word_embeddings=True,
                   rope_scaling=None,
                   moe=dict(num_experts=4, top_k=1, capacity_factor=1.0, eval_capacity_factor=1.0, min_capacity=2, drop_tokens=True,
                            normalize_top_k=False, aux_loss_coef=0.05, z_loss_coef=0.0, every=2, intermediate_size=64)),
}
B, T = 2, 12


def rms_norm(x, w, eps):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))


def inv_freq(cfg):
    hs = cfg["head_dim"]
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hs, 2, dtype=torch.int64).float() / hs))
    s = cfg["rope_scaling"]
    if s is None:
        return inv
    if s["rope_type"] == "linear":
        return inv / s["factor"]
    old = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / s["low_freq_factor"], old / s["high_freq_factor"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / s["factor"], inv)
    smooth = (old / wavelen - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
    blended = (1 - smooth) * scaled / s["factor"] + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, scaled)


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def moe_mlp(h, p, pre, cfg):
    """Mixtral's sparse MLP: SwiGLU experts behind moe_reference.py's gate."""
    def expert(e, x):
        ex = pre + f"block_sparse_moe.experts.{e}."
        return linear(F.silu(linear(x, p[ex + "w1.weight"])) * linear(x, p[ex + "w3.weight"]), p[ex + "w2.weight"])
    return moe_layer(h, p[pre + "block_sparse_moe.gate.weight"], expert, cfg["moe"])


def is_moe_layer(cfg, l):
    return "moe" in cfg and (l + 1) % cfg["moe"]["every"] == 0


def forward(p, cfg, tokens, targets, head=None, moe_losses=None):
    """`moe_losses`: a list the expert layers append their (aux, z) losses to."""
    """`head`: the LM head's matrix when a tied one is a leaf of its own (bf16 training keeps the
    head's gradient apart from the embedding's until the two are summed)."""
    B, T = tokens.shape
    C, NH, KVH, hs = cfg["n_embd"], cfg["n_head"], cfg["n_kv_head"], cfg["head_dim"]
    g, eps = NH // KVH, cfg["rms_norm_eps"]
    freqs = torch.outer(torch.arange(T).float(), inv_freq(cfg))
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    x = p["model.embed_tokens.weight"][tokens]
    for l in range(cfg["n_layer"]):
        pre = f"model.layers.{l}."
        h = rms_norm(x, p[pre + "input_layernorm.weight"], eps)
        has_bias = cfg["qkv_bias"] or cfg.get("attention_bias", False)
        bias = (lambda n: p[pre + n]) if has_bias else (lambda n: None)
        q = linear(h, p[pre + "self_attn.q_proj.weight"], bias("self_attn.q_proj.bias")).view(B, T, NH, hs)
        k = linear(h, p[pre + "self_attn.k_proj.weight"], bias("self_attn.k_proj.bias")).view(B, T, KVH, hs)
        v = linear(h, p[pre + "self_attn.v_proj.weight"], bias("self_attn.v_proj.bias")).view(B, T, KVH, hs)
        if cfg["qk_norm"]:
            q = rms_norm(q, p[pre + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, p[pre + "self_attn.k_norm.weight"], eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        y = attention(q, k, v).transpose(1, 2).reshape(B, T, NH * hs)
        x = x + linear(y, p[pre + "self_attn.o_proj.weight"], p.get(pre + "self_attn.o_proj.bias"))
        h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps)
        if is_moe_layer(cfg, l):
            y, aux, z = moe_mlp(h, p, pre, cfg)
            x = x + y
            if moe_losses is not None:
                moe_losses.append((aux, z))
            continue
        m = F.silu(linear(h, p[pre + "mlp.gate_proj.weight"])) * linear(h, p[pre + "mlp.up_proj.weight"])
        x = x + linear(m, p[pre + "mlp.down_proj.weight"])
    x = rms_norm(x, p["model.norm.weight"], eps)
    if head is None:
        head = p["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else p["lm_head.weight"]
    logits = linear(x, head)
    return logits, F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def make_params(gen, cfg):
    C, NH, KVH, hs, Fw, V = cfg["n_embd"], cfg["n_head"], cfg["n_kv_head"], cfg["head_dim"], cfg["intermediate_size"], cfg["vocab_size"]
    p = {}

    def matrix(name, rows, cols):
        p[name] = torch.randn(rows, cols, generator=gen) / math.sqrt(cols)

    def norm(name, n):
        p[name] = 1 + 0.1 * torch.randn(n, generator=gen)

    p["model.embed_tokens.weight"] = 0.3 * torch.randn(V, C, generator=gen)
    for l in range(cfg["n_layer"]):
        pre = f"model.layers.{l}."
        norm(pre + "input_layernorm.weight", C)
        matrix(pre + "self_attn.q_proj.weight", NH * hs, C)
        matrix(pre + "self_attn.k_proj.weight", KVH * hs, C)
        matrix(pre + "self_attn.v_proj.weight", KVH * hs, C)
        if cfg["qkv_bias"] or cfg.get("attention_bias", False):
            for n, rows in (("q", NH * hs), ("k", KVH * hs), ("v", KVH * hs)):
                p[pre + f"self_attn.{n}_proj.bias"] = 0.1 * torch.randn(rows, generator=gen)
        if cfg["qk_norm"]:
            norm(pre + "self_attn.q_norm.weight", hs)
            norm(pre + "self_attn.k_norm.weight", hs)
        matrix(pre + "self_attn.o_proj.weight", C, NH * hs)
        if cfg.get("attention_bias", False):
            p[pre + "self_attn.o_proj.bias"] = 0.1 * torch.randn(C, generator=gen)
        norm(pre + "post_attention_layernorm.weight", C)
        if is_moe_layer(cfg, l):
            m = cfg["moe"]
            X = m["intermediate_size"]
            p[pre + "block_sparse_moe.gate.weight"] = torch.randn(m["num_experts"], C, generator=gen) / math.sqrt(C) * 2
            for e in range(m["num_experts"]):
                ex = pre + f"block_sparse_moe.experts.{e}."
                matrix(ex + "w1.weight", X, C)
                matrix(ex + "w3.weight", X, C)
                matrix(ex + "w2.weight", C, X)
            continue
        matrix(pre + "mlp.gate_proj.weight", Fw, C)
        matrix(pre + "mlp.up_proj.weight", Fw, C)
        matrix(pre + "mlp.down_proj.weight", C, Fw)
    norm("model.norm.weight", C)
    if not cfg["tie_word_embeddings"]:
        matrix("lm_head.weight", V, C)
    return p


# The models trained, each with a clipping threshold inside its range of gradient norms, so that
# some steps are clipped and some are not.
TRAIN_CASES = {"llama": 1.3, "qwen2": 2.5, "qwen3": 1.4, "mixtral": 1.3, "switch": 2.4}


def train_loss(cfg):
    """The loss `train` differentiates and reports: the cross-entropy, and with expert layers the
    auxiliary and z losses times their coefficients in the gradient (not in the reported loss, as
    zeroth reports them apart)."""
    def loss_of(w, idx, tgt, head):
        losses = []
        loss = forward(w, cfg, idx, tgt, head, moe_losses=losses)[1]
        if not losses:
            return loss
        m = cfg["moe"]
        return loss + sum(m["aux_loss_coef"] * a + m["z_loss_coef"] * z for a, z in losses), loss
    return loss_of


def write_train(path):
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(2929)
    n, t = TRAIN_BATCH["sequences"], TRAIN_BATCH["seq"]
    out, meta = {}, {}
    V = CASES["llama"]["vocab_size"]
    data = torch.randint(0, V, (2, n, t + 1), generator=gen, dtype=torch.int64)
    batches = [(data[b, :, :t], data[b, :, 1:]) for b in range(2)]  # alternating, so the loss falls
    out["train.tokens"] = data[:, :, :t].to(torch.int32)
    out["train.targets"] = data[:, :, 1:].to(torch.int32)
    for case, clip in TRAIN_CASES.items():
        cfg = CASES[case]
        assert cfg["vocab_size"] == V and cfg["seq_len"] >= t
        init = make_params(gen, cfg)
        for k, v in init.items():
            out[f"{case}.init.{k}"] = v.clone()
        record = {}
        for name, narrow in (("f32", False), ("bf16", True)):
            # gpt_reference's training, for this model's loss and tied embedding.
            final, steps = train(init, batches, narrow, clip=clip, loss_of=train_loss(cfg),
                                 tied="model.embed_tokens.weight" if cfg["tie_word_embeddings"] else None)
            for k, v in final.items():
                out[f"{case}.{name}.final.{k}"] = v.detach().clone()
            record[name] = {"loss": [s[0] for s in steps], "grad_norm": [s[1] for s in steps], "lr": [s[2] for s in steps]}
            clipped = sum(s[1] + 1e-6 > clip for s in steps)
            print(f"{case} {name}: loss {steps[0][0]:.4f} -> {steps[-1][0]:.4f}, grad norms {min(s[1] for s in steps):.4f} .. "
                  f"{max(s[1] for s in steps):.4f} ({clipped} of {len(steps)} steps clipped at {clip})")
        meta[case] = json.dumps(cfg)
        meta[f"{case}.clip"] = repr(clip)
        meta[f"{case}.steps"] = json.dumps(record)
    meta.update({"torch": torch.__version__, "batch": json.dumps(TRAIN_BATCH), "optimizer": json.dumps(TRAIN_OPT),
                 "scheduler": json.dumps(TRAIN_SCHEDULER)})
    write_safetensors(path, out, meta)
    print(f"wrote {path}")


def write_forward(path):
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(29)
    V = 96
    tokens = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    out = {"batch.tokens": tokens.int(), "batch.targets": targets.int()}
    meta = {}
    for case, cfg in CASES.items():
        params = {k: v.float().requires_grad_(True) for k, v in make_params(gen, cfg).items()}
        losses = []
        logits, loss = forward(params, cfg, tokens, targets, moe_losses=losses)
        total = loss
        if losses:
            m = cfg["moe"]
            total = loss + sum(m["aux_loss_coef"] * a + m["z_loss_coef"] * z for a, z in losses)
            out[f"{case}.moe_aux"] = torch.stack([a for a, _ in losses]).detach()
            out[f"{case}.moe_z"] = torch.stack([z for _, z in losses]).detach()
        total.backward()
        meta[case] = json.dumps(cfg)
        for name, t in params.items():
            out[f"{case}.init.{name}"] = t.detach()
            out[f"{case}.grad.{name}"] = t.grad
        out[f"{case}.logits"] = logits.detach()
        out[f"{case}.loss"] = loss.detach().reshape(1)
        print(f"{case}: loss {loss.item():.7f}")
    write_safetensors(path, out, meta)



if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--forward", metavar="PATH", help="write the forward/backward reference (llama_torch.safetensors)")
    parser.add_argument("--train", metavar="PATH", help="write the training reference (llama_train_torch.safetensors)")
    args = parser.parse_args()
    if not args.forward and not args.train:
        parser.error("name at least one of --forward PATH, --train PATH")
    if args.forward:
        write_forward(args.forward)
    if args.train:
        write_train(args.train)
