#!/usr/bin/env python3
"""The reference side of `zeroth bench train`: the same training step in PyTorch (Debian's
python3-torch): forward, cross-entropy, backward, global-norm clipping, AdamW, for GPT-2 or (with
--kv-heads) a Llama-family decoder (RMSNorm, rotary positions, grouped-query attention, SwiGLU,
untied head unless --tied), in f32 or with --autocast 1 under bf16 autocast, on the CPU or with
--device cuda on the GPU (--sdpa 1: attention through scaled_dot_product_attention, PyTorch's fused
kernels, where it has it). Prints one JSON line with the step times. Started by zeroth itself
with the same shapes, threads and precision:
    /usr/bin/python3 tools/bench/train_torch.py --layers 12 --heads 12 --embd 768 --vocab 50257 \
        --seq 256 --batch 4 --steps 5 --threads 2
    /usr/bin/python3 tools/bench/train_torch.py --layers 30 --heads 9 --kv-heads 3 --embd 576 --ffn 1536 \
        --vocab 49152 --tied 1 --seq 256 --batch 4 --steps 5 --threads 2
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, h, layers):
        super().__init__()
        self.h = h
        self.ln_1 = nn.LayerNorm(c)
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)
        for w in (self.c_attn.weight, self.c_fc.weight):
            nn.init.normal_(w, std=0.02)
        for w in (self.c_proj.weight, self.mlp_proj.weight):
            nn.init.normal_(w, std=0.02 / math.sqrt(2 * layers))

    def forward(self, x, mask):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = [z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v)]
        y = attention(q, k, v, mask, t).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


SDPA = False  # set by --sdpa


def attention(q, k, v, mask, t):
    if SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    att = att.masked_fill(mask[:t, :t] == 0, float("-inf")).softmax(dim=-1)
    return att @ v


class RMSNorm(nn.Module):
    def __init__(self, c, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class LlamaBlock(nn.Module):
    def __init__(self, c, h, kvh, hs, ffn, eps):
        super().__init__()
        self.h, self.kvh, self.hs = h, kvh, hs
        self.input_layernorm = RMSNorm(c, eps)
        self.q_proj = nn.Linear(c, h * hs, bias=False)
        self.k_proj = nn.Linear(c, kvh * hs, bias=False)
        self.v_proj = nn.Linear(c, kvh * hs, bias=False)
        self.o_proj = nn.Linear(h * hs, c, bias=False)
        self.post_attention_layernorm = RMSNorm(c, eps)
        self.gate_proj = nn.Linear(c, ffn, bias=False)
        self.up_proj = nn.Linear(c, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, c, bias=False)
        for m in (self.q_proj, self.k_proj, self.v_proj, self.o_proj, self.gate_proj, self.up_proj, self.down_proj):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, x, mask, cos, sin):
        b, t, _ = x.shape
        n = self.input_layernorm(x)
        q = self.q_proj(n).view(b, t, self.h, self.hs).transpose(1, 2)
        k = self.k_proj(n).view(b, t, self.kvh, self.hs).transpose(1, 2)
        v = self.v_proj(n).view(b, t, self.kvh, self.hs).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        g = self.h // self.kvh
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        y = attention(q, k, v, mask, t).transpose(1, 2).contiguous().view(b, t, self.h * self.hs)
        x = x + self.o_proj(y)
        n = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(n)) * self.up_proj(n))


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        hs = a.head_dim or a.embd // a.heads
        self.embed_tokens = nn.Embedding(a.vocab, a.embd)
        nn.init.normal_(self.embed_tokens.weight, std=0.02)
        self.layers = nn.ModuleList([LlamaBlock(a.embd, a.heads, a.kv_heads, hs, a.ffn, 1e-5) for _ in range(a.layers)])
        self.norm = RMSNorm(a.embd, 1e-5)
        self.lm_head = None if a.tied else nn.Linear(a.embd, a.vocab, bias=False)
        if self.lm_head is not None:
            nn.init.normal_(self.lm_head.weight, std=0.02)
        inv = 1.0 / (a.theta ** (torch.arange(0, hs, 2).float() / hs))
        freqs = torch.outer(torch.arange(a.seq).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())
        self.register_buffer("mask", torch.tril(torch.ones(a.seq, a.seq)))

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.embed_tokens(idx)
        for blk in self.layers:
            x = blk(x, self.mask, self.cos[:t], self.sin[:t])
        head = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = self.norm(x) @ head.T
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


class GPT(nn.Module):
    def __init__(self, layers, heads, embd, vocab, seq):
        super().__init__()
        self.wte = nn.Embedding(vocab, embd)
        self.wpe = nn.Embedding(seq, embd)
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.02)
        self.blocks = nn.ModuleList([Block(embd, heads, layers) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(embd)
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq)))

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x, self.mask)
        logits = self.ln_f(x) @ self.wte.weight.T  # tied LM head
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    for name, default in (("layers", 12), ("heads", 12), ("embd", 768), ("vocab", 50257), ("seq", 256), ("batch", 4),
                          ("steps", 5), ("warmup", 1), ("threads", 1), ("kv-heads", 0), ("head-dim", 0), ("ffn", 0), ("tied", 0),
                          ("autocast", 0), ("sdpa", 0)):
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--theta", type=float, default=10000.0)
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    global SDPA
    SDPA = bool(a.sdpa) and hasattr(F, "scaled_dot_product_attention")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    model = (Llama(a) if a.kv_heads > 0 else GPT(a.layers, a.heads, a.embd, a.vocab, a.seq)).to(dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    params = list(model.parameters())
    decay = [q for q in params if q.dim() >= 2]
    no_decay = [q for q in params if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    times, losses = [], []
    for s in range(a.warmup + a.steps):
        idx = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
        tgt = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
        sync()
        t0 = time.perf_counter()
        # bf16 autocast: the products in bf16 (oneDNN's or cuBLAS's), master weights and optimizer in f32.
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bool(a.autocast)):
            loss = model(idx, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sync()
        dt = time.perf_counter() - t0
        if s >= a.warmup:
            times.append(dt)
        losses.append(float(loss))
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "device": a.device, "sdpa": SDPA,
                      "step_s": times, "losses": losses, "parameters": sum(q.numel() for q in params)}))


if __name__ == "__main__":
    main()
