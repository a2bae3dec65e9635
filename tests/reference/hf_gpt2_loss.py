#!/usr/bin/env python3
"""The loss of a GPT-2 stored in Hugging Face's layout (GPT2LMHeadModel's safetensors: names
`transformer.h.<l>.attn.c_attn.weight` ..., Conv1D weights as [in, out], the LM head tied to
`transformer.wte.weight`), computed with PyTorch from the file alone: the header and the bytes are
parsed here by hand (the safetensors package is not in Debian). Used by tests/train/export_test.cc
on the weights a zeroth run saves. Run with /usr/bin/python3 (Debian's python3-torch):

    /usr/bin/python3 tests/reference/hf_gpt2_loss.py MODEL.safetensors BATCH.json

BATCH.json: {"n_head": H, "tokens": [[...], ...], "targets": [[...], ...]}. Prints
{"loss": mean cross-entropy, "tensors": count} as JSON.
"""
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    assert meta.get("format") == "pt", f"metadata {meta}: Hugging Face's loader wants format pt"
    data = blob[8 + n:]
    out = {}
    for name, e in header.items():
        lo, hi = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[lo:hi]), dtype=DTYPES[e["dtype"]]).reshape(e["shape"])
        out[name] = t.float()
    return out


def logits(w, n_head, idx, positions=None, mask=None):
    """GPT2LMHeadModel's logits. positions: [b, t] (default 0 .. t - 1 in every row); mask: which
    keys a query sees, broadcast over [b, heads, t, t] (default causal)."""
    b, t = idx.shape
    C = w["transformer.wte.weight"].shape[1]
    L = sum(1 for k in w if k.endswith(".attn.c_attn.weight"))
    x = w["transformer.wte.weight"][idx] + w["transformer.wpe.weight"][positions if positions is not None else torch.arange(t)]
    if mask is None:
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))

    def ln(x, p):
        return F.layer_norm(x, (C,), w[p + ".weight"], w[p + ".bias"], eps=1e-5)

    def conv1d(x, p):  # Hugging Face's Conv1D: x @ W + b with W as [in, out]
        return x @ w[p + ".weight"] + w[p + ".bias"]

    for l in range(L):
        p = f"transformer.h.{l}."
        q, k, v = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn").split(C, dim=2)
        q, k, v = [z.view(b, t, n_head, C // n_head).transpose(1, 2) for z in (q, k, v)]
        att = ((q @ k.transpose(-2, -1)) / math.sqrt(C // n_head)).masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + conv1d((att @ v).transpose(1, 2).reshape(b, t, C), p + "attn.c_proj")
        h = F.gelu(conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc"), approximate="tanh")
        x = x + conv1d(h, p + "mlp.c_proj")
    return ln(x, "transformer.ln_f") @ w["transformer.wte.weight"].T


def loss(w, n_head, idx, targets):
    out = logits(w, n_head, idx)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), targets.reshape(-1)).item()


def main():
    weights = read(sys.argv[1])
    with open(sys.argv[2]) as f:
        batch = json.load(f)
    idx, targets = torch.tensor(batch["tokens"]), torch.tensor(batch["targets"])
    print(json.dumps({"loss": loss(weights, batch["n_head"], idx, targets), "tensors": len(weights)}))


if __name__ == "__main__":
    main()
