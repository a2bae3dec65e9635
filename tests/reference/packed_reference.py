#!/usr/bin/env python3
"""The PyTorch reference of packed micro-batches (tests/models/packing_test.cc): several samples in a
row, told apart by their positions restarting at 0 (Hugging Face's position_ids for packed
sequences). Written from the architectures' definitions, not from zeroth's code: every row's
attention is one softmax over an explicit mask, causal AND within the query's sample (the
block-diagonal causal mask), and each token's position (GPT-2's learned table, Llama's rotary
angles) is its position within its sample. The loss is the cross-entropy summed over the targets
that are not -1, divided by the batch's `divisor`.

    /usr/bin/python3 tests/reference/packed_reference.py WEIGHTS.safetensors BATCH.json OUT.safetensors

WEIGHTS holds the model under Hugging Face's names (GPT2LMHeadModel, or LlamaForCausalLM);
BATCH.json: {"config": {"architecture": "gpt2" | "llama", "n_head", "n_kv_head", "head_dim",
"rope_theta", "rms_norm_eps", "tie_word_embeddings"}, "tokens", "targets", "positions": [B][T],
"divisor"}. OUT gets "loss" and "grad.<name>" for every weight.
"""
import json
import math
import sys

import torch
import torch.nn.functional as F

import hf_gpt2_loss
from gpt_reference import write_safetensors


def block_diagonal_causal(positions):
    """[B, T, T]: query i sees key j when j <= i and both are in the same sample."""
    sample = torch.cumsum((positions == 0).long(), dim=1)
    t = positions.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    return causal.unsqueeze(0) & (sample.unsqueeze(2) == sample.unsqueeze(1))


def attend(q, k, v, mask):
    """q, k, v: [B, H, T, hs]; mask [B, T, T]."""
    att = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return att.masked_fill(~mask.unsqueeze(1), float("-inf")).softmax(dim=-1) @ v


def gpt2(w, cfg, tokens, positions, mask):
    return hf_gpt2_loss.logits(w, cfg["n_head"], tokens, positions, mask.unsqueeze(1))


def llama(w, cfg, tokens, positions, mask):
    b, t = tokens.shape
    NH, KVH, hs, eps = cfg["n_head"], cfg["n_kv_head"], cfg["head_dim"], cfg["rms_norm_eps"]
    L = sum(1 for k in w if k.endswith(".self_attn.q_proj.weight"))

    def rms(x, name):
        return w[name] * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hs, 2, dtype=torch.int64).float() / hs))
    angles = positions.float().unsqueeze(-1) * inv  # [B, T, hs / 2]
    cos = torch.cat((angles, angles), dim=-1).cos().unsqueeze(1)
    sin = torch.cat((angles, angles), dim=-1).sin().unsqueeze(1)

    def rotate(x):
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    x = w["model.embed_tokens.weight"][tokens]
    for l in range(L):
        p = f"model.layers.{l}."
        h = rms(x, p + "input_layernorm.weight")
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(b, t, NH, hs).transpose(1, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(b, t, KVH, hs).transpose(1, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(b, t, KVH, hs).transpose(1, 2)
        q, k = rotate(q), rotate(k)
        k, v = k.repeat_interleave(NH // KVH, dim=1), v.repeat_interleave(NH // KVH, dim=1)
        y = attend(q, k, v, mask).transpose(1, 2).reshape(b, t, NH * hs)
        x = x + y @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, p + "post_attention_layernorm.weight")
        x = x + (F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return rms(x, "model.norm.weight") @ head.T


def main():
    weights, batch_path, out = sys.argv[1], sys.argv[2], sys.argv[3]
    w = {k: v.clone().requires_grad_(True) for k, v in hf_gpt2_loss.read(weights).items()}
    with open(batch_path) as f:
        batch = json.load(f)
    cfg = batch["config"]
    tokens, targets = torch.tensor(batch["tokens"]), torch.tensor(batch["targets"])
    positions = torch.tensor(batch["positions"])
    mask = block_diagonal_causal(positions)
    model = gpt2 if cfg["architecture"] == "gpt2" else llama
    logits = model(w, cfg, tokens, positions, mask)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1, reduction="sum")
    loss = loss / batch["divisor"]
    loss.backward()
    tensors = {"loss": loss.detach().reshape(1)}
    for name, t in w.items():
        tensors["grad." + name] = t.grad if t.grad is not None else torch.zeros_like(t)
    write_safetensors(out, tensors, {})


if __name__ == "__main__":
    main()
