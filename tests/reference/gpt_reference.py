#!/usr/bin/env python3
"""Writes gpt_torch.safetensors: a small GPT-2 in PyTorch (Debian python3-torch) with its weights,
one micro-batch, the logits, the loss and every gradient, then 10 AdamW steps (clipping, no decay
on biases and LayerNorms) with their losses and gradient norms, so the C++ tests compare against
PyTorch without torch installed. Run with /usr/bin/python3:
    /usr/bin/python3 tests/reference/gpt_reference.py tests/reference/gpt_torch.safetensors
"""
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F

CFG = dict(vocab_size=97, seq_len=24, n_layer=2, n_head=4, n_embd=48)
B, T = 3, 20
STEPS = 10
OPT = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
CLIP = 1.0


def layernorm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def forward(p, idx, targets):
    L, H, C = CFG["n_layer"], CFG["n_head"], CFG["n_embd"]
    b, t = idx.shape
    x = p["embed.wte"][idx] + p["embed.wpe"][:t]
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
    for l in range(L):
        q = lambda name: p[f"h.{l}.{name}"]
        h = layernorm(x, q("ln_1.weight"), q("ln_1.bias"))
        qkv = h @ q("attn.c_attn.weight").T + q("attn.c_attn.bias")
        qq, kk, vv = qkv.split(C, dim=2)
        qq, kk, vv = [z.view(b, t, H, C // H).transpose(1, 2) for z in (qq, kk, vv)]
        att = (qq @ kk.transpose(-2, -1)) / math.sqrt(C // H)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ vv).transpose(1, 2).contiguous().view(b, t, C)
        x = x + y @ q("attn.c_proj.weight").T + q("attn.c_proj.bias")
        h = layernorm(x, q("ln_2.weight"), q("ln_2.bias"))
        h = F.gelu(h @ q("mlp.c_fc.weight").T + q("mlp.c_fc.bias"), approximate="tanh")
        x = x + h @ q("mlp.c_proj.weight").T + q("mlp.c_proj.bias")
    x = layernorm(x, p["ln_f.weight"], p["ln_f.bias"])
    logits = x @ p["embed.wte"].T
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
    return logits, loss


def make_params(gen):
    V, Tm, L, C = CFG["vocab_size"], CFG["seq_len"], CFG["n_layer"], CFG["n_embd"]
    p = {"embed.wte": torch.randn(V, C, generator=gen) * 0.02, "embed.wpe": torch.randn(Tm, C, generator=gen) * 0.02}
    for l in range(L):
        # LayerNorm and bias values away from their init, so their gradients are not trivial.
        for ln in ("ln_1", "ln_2"):
            p[f"h.{l}.{ln}.weight"] = 1 + 0.1 * torch.randn(C, generator=gen)
            p[f"h.{l}.{ln}.bias"] = 0.1 * torch.randn(C, generator=gen)
        for name, shape in (("attn.c_attn", (3 * C, C)), ("attn.c_proj", (C, C)), ("mlp.c_fc", (4 * C, C)),
                            ("mlp.c_proj", (C, 4 * C))):
            p[f"h.{l}.{name}.weight"] = torch.randn(*shape, generator=gen) * 0.08
            p[f"h.{l}.{name}.bias"] = torch.randn(shape[0], generator=gen) * 0.05
    p["ln_f.weight"] = 1 + 0.1 * torch.randn(C, generator=gen)
    p["ln_f.bias"] = 0.1 * torch.randn(C, generator=gen)
    return p


def write_safetensors(path, tensors, metadata):
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        t = t.contiguous()
        dtype = {torch.float32: "F32", torch.int32: "I32"}[t.dtype]
        data = t.numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def main(path):
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(1234)
    params = {k: v.float().requires_grad_(True) for k, v in make_params(gen).items()}
    V = CFG["vocab_size"]
    data = torch.randint(0, V, (STEPS + 1, B, T + 1), generator=gen, dtype=torch.int64)
    out = {f"init.{k}": v.detach().clone() for k, v in params.items()}
    idx, tgt = data[0, :, :T], data[0, :, 1:]
    logits, loss = forward(params, idx, tgt)
    loss.backward()
    out["batch.tokens"] = idx.to(torch.int32)
    out["batch.targets"] = tgt.to(torch.int32)
    out["logits"] = logits.detach()
    out["loss"] = loss.detach().reshape(1)
    for k, v in params.items():
        out[f"grad.{k}"] = v.grad.detach().clone()
        v.grad = None
    decay = [v for k, v in params.items() if v.dim() >= 2]
    no_decay = [v for k, v in params.items() if v.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": OPT["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=OPT["lr"], betas=OPT["betas"], eps=OPT["eps"])
    losses, norms = [], []
    for s in range(STEPS):
        idx, tgt = data[1 + s % 2, :, :T], data[1 + s % 2, :, 1:]  # two batches, so the loss falls
        _, loss = forward(params, idx, tgt)
        opt.zero_grad()
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(list(params.values()), CLIP)))
        opt.step()
        losses.append(float(loss))
    out["train.tokens"] = data[1:3, :, :T].to(torch.int32)
    out["train.targets"] = data[1:3, :, 1:].to(torch.int32)
    out["train.losses"] = torch.tensor(losses, dtype=torch.float32)
    out["train.grad_norms"] = torch.tensor(norms, dtype=torch.float32)
    for k, v in params.items():
        out[f"final.{k}"] = v.detach().clone()
    meta = {"torch": torch.__version__, "config": json.dumps(CFG), "batch": json.dumps([B, T]),
            "optimizer": json.dumps(OPT), "clip": str(CLIP)}
    write_safetensors(path, out, meta)
    print(f"wrote {path}: loss {float(out['loss']):.6f}, train losses {losses[0]:.4f} -> {losses[-1]:.4f}")


if __name__ == "__main__":
    main(sys.argv[1])
