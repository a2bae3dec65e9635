#!/usr/bin/env python3
"""Writes optim_torch.json: PyTorch's optimizers (Debian python3-torch) on fixed inputs, 20 steps
each, so the C++ tests can compare without torch installed. Run with /usr/bin/python3:
    /usr/bin/python3 tests/reference/optim_reference.py tests/reference/optim_torch.json
"""
import json
import sys

import torch

N = 257
STEPS = 20
CASES = [
    ("AdamW", torch.optim.AdamW, dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)),
    ("AdamL2", torch.optim.Adam, dict(lr=1e-2, betas=(0.85, 0.995), eps=1e-7, weight_decay=0.05)),
    ("SGD", torch.optim.SGD, dict(lr=0.1, weight_decay=0.01)),
    ("SGDMomentum", torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1)),
    ("SGDNesterov", torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)),
]


def main(path):
    torch.manual_seed(1234)
    init = (torch.rand(N, dtype=torch.float32) * 2 - 1)
    grads = [(torch.rand(N, dtype=torch.float32) - 0.5) * 0.1 for _ in range(STEPS)]
    lrs_scale = [1.0 - 0.02 * (t + 1) for t in range(STEPS)]
    out = {"n": N, "steps": STEPS, "torch": torch.__version__, "init": init.tolist(),
           "grads": [g.tolist() for g in grads], "lr_scale": lrs_scale, "cases": []}
    for name, cls, kwargs in CASES:
        p = torch.nn.Parameter(init.clone())
        opt = cls([p], foreach=False, **kwargs)
        for t in range(STEPS):
            for group in opt.param_groups:
                group["lr"] = kwargs["lr"] * lrs_scale[t]
            p.grad = grads[t].clone()
            opt.step()
        state = opt.state[p]
        case = {"name": name, "params": {k: (list(v) if isinstance(v, tuple) else v) for k, v in kwargs.items()},
                "final": p.detach().tolist()}
        if "exp_avg" in state:
            case["exp_avg"] = state["exp_avg"].tolist()
            case["exp_avg_sq"] = state["exp_avg_sq"].tolist()
        if state.get("momentum_buffer") is not None:
            case["momentum_buffer"] = state["momentum_buffer"].tolist()
        out["cases"].append(case)
    with open(path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1])
