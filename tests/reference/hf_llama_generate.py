#!/usr/bin/env python3
"""Greedy decoding of a Llama-family model stored as a Hugging Face folder, with the PyTorch Llama
of llama_reference.py (written from the papers and Hugging Face's conventions, not from zeroth's
code), recomputing the whole sequence for every token (no key/value cache). Used by
tests/tools/eval_test.cc against `zeroth generate --temperature 0`:

    /usr/bin/python3 tests/reference/hf_llama_generate.py FOLDER NEW_TOKENS PROMPT_ID...

prints {"ids": the new tokens}.
"""
import json
import sys

import torch

import hf_llama_eval
import llama_reference


def main():
    folder, n = sys.argv[1], int(sys.argv[2])
    ids = [int(t) for t in sys.argv[3:]]
    cfg, p = hf_llama_eval.load(folder)
    out = []
    with torch.no_grad():
        for _ in range(n):
            llama_reference.B, llama_reference.T = 1, len(ids)
            idx = torch.tensor([ids], dtype=torch.int64)
            logits, _ = llama_reference.forward(p, cfg, idx, idx)
            nxt = int(torch.argmax(logits[0, -1]).item())
            out.append(nxt)
            ids.append(nxt)
    print(json.dumps({"ids": out}))


if __name__ == "__main__":
    main()
