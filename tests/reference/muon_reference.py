#!/usr/bin/env python3
"""Writes muon_torch.json: Muon as Keller Jordan's reference (KellerJordan/Muon, muon.py) defines it,
written here in PyTorch (Debian python3-torch) in float64, 10 steps of fixed gradients on a tall, a
wide and a square matrix, so the C++ tests compare without torch installed. Run with /usr/bin/python3:
    /usr/bin/python3 tests/reference/muon_reference.py tests/reference/muon_torch.json
"""
import json
import math
import sys

import torch

STEPS = 10
SHAPES = [(20, 8), (8, 20), (12, 12)]
CASES = [
    ("nesterov", dict(lr=0.02, momentum=0.95, nesterov=True, ns_steps=5, weight_decay=0.1, scale="keller")),
    ("plain", dict(lr=0.05, momentum=0.9, nesterov=False, ns_steps=5, weight_decay=0.0, scale="keller")),
    ("moonlight", dict(lr=0.01, momentum=0.95, nesterov=True, ns_steps=3, weight_decay=0.05, scale="match_adamw_rms")),
]


def newton_schulz(g, steps):
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.clone()
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / (x.norm() + 1e-7)
    for _ in range(steps):
        m = x @ x.T
        n = b * m + c * m @ m
        x = a * x + n @ x
    return x.T if tall else x


def muon_step(p, grad, buf, lr, o):
    buf.lerp_(grad, 1 - o["momentum"])
    u = grad.lerp(buf, o["momentum"]) if o["nesterov"] else buf.clone()
    u = newton_schulz(u, o["ns_steps"])
    rows, cols = p.shape
    if o["scale"] == "keller":
        scale = max(1.0, rows / cols) ** 0.5
    else:
        scale = 0.2 * math.sqrt(max(rows, cols))
    p.mul_(1 - lr * o["weight_decay"])
    p.add_(u, alpha=-lr * scale)


def main(path):
    torch.manual_seed(4321)
    lr_scale = [1.0 - 0.05 * t for t in range(STEPS)]
    out = {"steps": STEPS, "torch": torch.__version__, "lr_scale": lr_scale, "shapes": []}
    for rows, cols in SHAPES:
        init = torch.rand(rows, cols, dtype=torch.float32) * 2 - 1
        grads = [(torch.rand(rows, cols, dtype=torch.float32) - 0.5) * 0.1 for _ in range(STEPS)]
        shape = {"rows": rows, "cols": cols, "init": init.flatten().tolist(),
                 "grads": [g.flatten().tolist() for g in grads], "cases": []}
        for name, o in CASES:
            p = init.double().clone()
            buf = torch.zeros_like(p)
            for t in range(STEPS):
                muon_step(p, grads[t].double(), buf, o["lr"] * lr_scale[t], o)
            shape["cases"].append({"name": name, "params": o, "final": p.flatten().tolist(),
                                   "momentum_buffer": buf.flatten().tolist()})
        out["shapes"].append(shape)
    with open(path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1])
