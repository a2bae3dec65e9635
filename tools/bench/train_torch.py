#!/usr/bin/env python3
"""The reference side of `zeroth bench train`: the same GPT-2 training step in PyTorch (Debian's
python3-torch): forward, cross-entropy, backward, global-norm clipping, AdamW. Prints one JSON
line with the step times. Started by zeroth itself with the same shapes, threads and precision:
    /usr/bin/python3 tools/bench/train_torch.py --layers 12 --heads 12 --embd 768 --vocab 50257 \
        --seq 256 --batch 4 --steps 5 --threads 2
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
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.h))
        att = att.masked_fill(mask[:t, :t] == 0, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


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
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for blk in self.blocks:
            x = blk(x, self.mask)
        logits = self.ln_f(x) @ self.wte.weight.T  # tied LM head
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    for name, default in (("layers", 12), ("heads", 12), ("embd", 768), ("vocab", 50257), ("seq", 256), ("batch", 4),
                          ("steps", 5), ("warmup", 1), ("threads", 1)):
        p.add_argument("--" + name, type=int, default=default)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = GPT(a.layers, a.heads, a.embd, a.vocab, a.seq)
    params = list(model.parameters())
    decay = [q for q in params if q.dim() >= 2]
    no_decay = [q for q in params if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    times, losses = [], []
    for s in range(a.warmup + a.steps):
        idx = torch.randint(0, a.vocab, (a.batch, a.seq))
        tgt = torch.randint(0, a.vocab, (a.batch, a.seq))
        t0 = time.perf_counter()
        loss = model(idx, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if s >= a.warmup:
            times.append(dt)
        losses.append(float(loss))
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "step_s": times, "losses": losses,
                      "parameters": sum(q.numel() for q in params)}))


if __name__ == "__main__":
    main()
