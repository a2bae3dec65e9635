#!/usr/bin/env python3
"""Writes moe_gate_torch.json: a mixture-of-experts gate written from its papers' rules in PyTorch
(Debian python3-torch), with autograd for the gradient at the logits, so the C++ tests compare
without torch installed. Run with /usr/bin/python3:
    /usr/bin/python3 tests/reference/moe_reference.py tests/reference/moe_gate_torch.json

The rules, as DeepSpeed-MoE's gates (top1gating / top2gating / topkgating) state them: softmax in
f32; top-k; capacity ceil(N k / E x factor), at least min_capacity; each expert's places given in
token order to first choices, then to second choices (cumsum of the one-hot masks, the second
choices' offset by the number of first ones); places past the capacity dropped. Combine weights:
the probability, or with normalize_top_k the probability over the sum of the token's kept choices
(DeepSpeed's top2gating / topkgating normalise after dropping; Mixtral drops nothing).
Losses: aux = E x sum_e mean_n(p[n, e]) x mean_n(first choice of n is e); z = mean_n lse(logits_n)^2.
"""
import json
import math
import sys

import torch

from products import linear

CASES = [
    # name, N, E, k, capacity_factor, min_capacity, drop_tokens, normalize, aux_coef, z_coef, skew
    ("switch_top1_drops", 64, 8, 1, 1.0, 0, True, False, 0.01, 0.0, 1.5),
    ("deepspeed_top2_drops", 64, 8, 2, 1.0, 4, True, True, 0.01, 0.0, 1.0),
    ("top2_unnormalized_drops", 64, 8, 2, 1.0, 4, True, False, 0.01, 0.0, 1.0),
    ("mixtral_top2_dropless", 48, 8, 2, 1.0, 4, False, True, 0.02, 1e-3, 0.5),
    ("top3_normalized_drops", 40, 6, 3, 0.75, 2, True, True, 0.05, 1e-2, 1.0),
    ("all_to_one_expert", 32, 4, 2, 1.25, 1, True, False, 0.01, 1e-3, 0.0),
]


def gate(logits, k, capacity, drop_tokens, normalize):
    N, E = logits.shape
    probs = torch.softmax(logits.float(), dim=1)
    top_p, top_e = torch.topk(probs, k, dim=1)
    masks = [torch.nn.functional.one_hot(top_e[:, j], E) for j in range(k)]
    locations, seen = [], torch.zeros(1, E, dtype=torch.long)
    for j in range(k):
        loc = torch.cumsum(masks[j], dim=0) - 1 + seen
        seen = seen + masks[j].sum(dim=0, keepdim=True)
        locations.append((loc * masks[j]).sum(dim=1))
    location = torch.stack(locations, dim=1)
    kept = location < capacity if drop_tokens else torch.ones_like(location, dtype=torch.bool)
    weight = top_p * kept
    if normalize:
        weight = weight / weight.sum(dim=1, keepdim=True).clamp(min=torch.finfo(torch.float32).eps)
    me = probs.mean(dim=0)
    ce = masks[0].float().mean(dim=0)
    aux = E * (me * ce).sum()
    z = (torch.logsumexp(logits, dim=1) ** 2).mean()
    return top_e, location, kept, weight, aux, z


def moe_layer(h, router_weight, expert, m):
    """A mixture-of-experts MLP over h [..., C] with the gate above: each expert (expert(e, rows))
    runs on the tokens that chose it and kept their place, and each token gets the weighted sum of
    its experts' outputs. Returns the output and the layer's auxiliary and z losses."""
    shape = h.shape
    x = h.reshape(-1, shape[-1])
    N, E, k = x.shape[0], m["num_experts"], m["top_k"]
    logits = linear(x, router_weight)
    capacity = min(max(math.ceil(N * k / E * m["capacity_factor"]), m["min_capacity"]), N) if m["drop_tokens"] else N
    top_e, _, kept, weight, aux, z = gate(logits, k, capacity, m["drop_tokens"], m["normalize_top_k"])
    out = torch.zeros_like(x)
    for e in range(E):
        n, j = ((top_e == e) & kept).nonzero(as_tuple=True)
        if n.numel() > 0:
            out = out.index_add(0, n, weight[n, j].unsqueeze(1) * expert(e, x[n]))
    return out.view(shape), aux, z


def main(path):
    torch.manual_seed(2026)
    out = {"torch": torch.__version__, "cases": []}
    for name, N, E, k, factor, min_cap, drop, normalize, aux_coef, z_coef, skew in CASES:
        logits = torch.randn(N, E) * 2 + skew * torch.linspace(1, 0, E)
        if name == "all_to_one_expert":
            logits[:, 0] += 20  # every token's first choice is expert 0
        logits.requires_grad_(True)
        capacity = max(math.ceil(N * k / E * factor), min_cap) if drop else N
        capacity = min(capacity, N)
        top_e, location, kept, weight, aux, z = gate(logits, k, capacity, drop, normalize)
        dweight = torch.randn(N, k)
        loss_scale = 0.25
        loss = (dweight * weight).sum() + loss_scale * (aux_coef * aux + z_coef * z)
        loss.backward()
        out["cases"].append({
            "name": name, "N": N, "E": E, "k": k, "capacity_factor": factor, "min_capacity": min_cap,
            "drop_tokens": drop, "normalize_top_k": normalize, "aux_loss_coef": aux_coef, "z_loss_coef": z_coef,
            "loss_scale": loss_scale, "capacity": capacity,
            "logits": logits.detach().flatten().tolist(), "dweight": dweight.flatten().tolist(),
            "expert": top_e.flatten().tolist(), "location": location.flatten().tolist(),
            "kept": kept.flatten().tolist(), "weight": weight.detach().flatten().tolist(),
            "aux_loss": aux.item(), "z_loss": z.item(), "dlogits": logits.grad.flatten().tolist(),
        })
    with open(path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1])
