#!/usr/bin/env python3
"""The validation loss of a Llama-family model stored as a Hugging Face folder (config.json and
model.safetensors, F32/BF16/F16), computed with the PyTorch Llama of llama_reference.py (written
from the papers and Hugging Face's conventions, not from zeroth's code) over every complete window
of a text file whose bytes are the tokens: window i has inputs tokens[i T, i T + T) and targets the
token after each. Used by tests/tools/eval_test.cc against `zeroth eval`:

    /usr/bin/python3 tests/reference/hf_llama_eval.py FOLDER TEXT_FILE T

prints {"loss": mean cross-entropy, "windows": count}.
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

import hf_gpt2_loss
import llama_reference


def load(folder):
    """The folder's config.json as llama_reference's config, and its weights (f32)."""
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    arch = c["architectures"][0]
    cfg = dict(vocab_size=c["vocab_size"], n_layer=c["num_hidden_layers"], n_embd=c["hidden_size"],
               n_head=c["num_attention_heads"], n_kv_head=c.get("num_key_value_heads", c["num_attention_heads"]),
               head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
               intermediate_size=c["intermediate_size"], rms_norm_eps=c["rms_norm_eps"], rope_theta=c["rope_theta"],
               qkv_bias=arch == "Qwen2ForCausalLM" or c.get("attention_bias", False),
               attention_bias=c.get("attention_bias", False), qk_norm=arch == "Qwen3ForCausalLM",
               tie_word_embeddings=c.get("tie_word_embeddings", False), rope_scaling=c.get("rope_scaling"))
    return cfg, hf_gpt2_loss.read(os.path.join(folder, "model.safetensors"))


def main():
    folder, text, T = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cfg, p = load(folder)
    with open(text, "rb") as f:
        tokens = torch.tensor(list(f.read()), dtype=torch.int64)
    windows = (len(tokens) - 1) // T
    llama_reference.T = T
    total = 0.0
    with torch.no_grad():
        for first in range(0, windows, 16):
            rows = min(16, windows - first)
            llama_reference.B = rows
            idx = torch.stack([tokens[(first + b) * T:(first + b) * T + T] for b in range(rows)])
            tgt = torch.stack([tokens[(first + b) * T + 1:(first + b) * T + T + 1] for b in range(rows)])
            logits, _ = llama_reference.forward(p, cfg, idx, tgt)
            total += F.cross_entropy(logits.double().view(-1, logits.shape[-1]), tgt.view(-1), reduction="sum").item()
    print(json.dumps({"loss": total / (windows * T), "windows": windows}))


if __name__ == "__main__":
    main()
