#!/usr/bin/env python3
"""The PyTorch reference of LoRA fine-tuning (tests/engine/lora_torch_test.cc). Written from the
architectures' and LoRA's definitions (Hu et al. 2021, PEFT's LoraLayer), not from zeroth's code:
every targeted linear layer computes x W^T + b + scale (x A^T) B^T, the base weights never change,
and torch.optim.AdamW trains A and B on the mean cross-entropy of each step's global batch.

    /usr/bin/python3 tests/reference/lora_reference.py WEIGHTS.safetensors JOB.json OUT.safetensors

WEIGHTS holds the model under zeroth's names and layouts ("<block>.<param>", weights [out, in]),
the adapters as "<layer>.lora.<module>.lora_A.weight" [r, in] and "...lora_B.weight" [out, r].
JOB.json: {"config": {"architecture": "gpt2" | "llama", "n_head", "n_kv_head", "head_dim",
"rope_theta", "rms_norm_eps", "tie_word_embeddings"}, "lora": {"r", "alpha", "use_rslora"}, "optimizer": {"lr", "betas", "eps",
"weight_decay"}, "clipping" (0: none), "steps": [{"tokens", "targets"}: [B][T]]}. OUT gets "loss" and
"grad_norm" (the adapters' gradients' global norm before clipping; one per step) and "final.<name>"
for every adapter tensor after the last step.

JOB's config "moe" (moe_reference.py's keys: num_experts, top_k, ..., aux_loss_coef, z_loss_coef,
every) makes every `every`-th layer's MLP Mixtral's experts behind the router, the adapters on the
experts' w1, w3 and w2 (each expert its own), the router frozen; the objective adds the layers'
auxiliary losses, per micro-batch of JOB's "rows" rows as zeroth's ranks and micro-batches make
them (the loss reported is the cross-entropy alone).

JOB's "bf16": true trains in zeroth's bf16 mode (products.py; gpt_reference.py says how zeroth's
mode is emulated) with LoRA's parts as zeroth computes them: the base weights hold bf16 values (a
frozen weight is kept in bf16 alone) and their products round the activations; the adapters are
the bf16 roundings of their fp32 masters, applied in f32 to the unrounded input (x A^T, then
(x A^T) B^T, forward and backward); each micro-batch of JOB's "rows" rows rounds its adapter
gradients to bf16 once (the block's gradient buffer), and those add up in f32.
"""
import json
import math
import sys

import torch
import torch.nn.functional as F

import hf_gpt2_loss
import products
from moe_reference import moe_layer
from gpt_reference import write_safetensors
from products import bf16


class Model:
    def __init__(self, w, adapters, cfg, scale):
        self.w, self.a, self.cfg, self.scale = w, adapters, cfg, scale
        self.used = set()
        self.moe_losses = []  # each expert layer's (aux, z) of the last forward

    def linear(self, x, block, module, bias=None):
        """x W^T (+ b) (+ scale (x A^T) B^T where `module` of `block` has an adapter)."""
        b = self.w[f"{block}.{module}.bias"] if bias is not None else None
        if products.BF16_PRODUCTS[0]:
            y = products.linear(x, self.w[f"{block}.{module}.weight"], b)
        else:
            y = x @ self.w[f"{block}.{module}.weight"].T
            if b is not None:
                y = y + b
        a_name, b_name = f"{block}.lora.{module}.lora_A.weight", f"{block}.lora.{module}.lora_B.weight"
        if a_name in self.a:
            y = y + self.scale * ((x @ self.a[a_name].T) @ self.a[b_name].T)
            self.used.update((a_name, b_name))
        return y

    def gpt2(self, tokens):
        w, b, t = self.w, tokens.shape[0], tokens.shape[1]
        nh = self.cfg["n_head"]
        x = w["embed.wte"][tokens] + w["embed.wpe"][torch.arange(t)]
        layers = sum(1 for k in w if k.endswith(".attn.c_attn.weight"))
        ln = lambda x, p: F.layer_norm(x, (x.shape[-1],), w[p + ".weight"], w[p + ".bias"], 1e-5)
        for l in range(layers):
            blk = f"h.{l}"
            qkv = self.linear(ln(x, blk + ".ln_1"), blk, "attn.c_attn", True)
            c = qkv.shape[-1] // 3
            q, k, v = (z.view(b, t, nh, c // nh).transpose(1, 2) for z in qkv.split(c, dim=-1))
            y = products.attention(q, k, v).transpose(1, 2).reshape(b, t, c)
            x = x + self.linear(y, blk, "attn.c_proj", True)
            h = F.gelu(self.linear(ln(x, blk + ".ln_2"), blk, "mlp.c_fc", True), approximate="tanh")
            x = x + self.linear(h, blk, "mlp.c_proj", True)
        return products.times_t(ln(x, "ln_f"), w["embed.wte"])

    def llama(self, tokens):
        w, cfg = self.w, self.cfg
        b, t = tokens.shape
        nh, kvh, hs, eps = cfg["n_head"], cfg["n_kv_head"], cfg["head_dim"], cfg["rms_norm_eps"]
        layers = sum(1 for k in w if k.endswith(".self_attn.q_proj.weight"))
        rms = lambda x, name: w[name] * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
        inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hs, 2, dtype=torch.int64).float() / hs))
        angles = torch.arange(t).float().unsqueeze(-1) * inv
        cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()

        def rotate(x):
            half = x.shape[-1] // 2
            return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

        x = w["embed.wte"][tokens]
        for l in range(layers):
            blk = f"layers.{l}"
            h = rms(x, blk + ".input_layernorm.weight")
            q = self.linear(h, blk, "self_attn.q_proj").view(b, t, nh, hs).transpose(1, 2)
            k = self.linear(h, blk, "self_attn.k_proj").view(b, t, kvh, hs).transpose(1, 2)
            v = self.linear(h, blk, "self_attn.v_proj").view(b, t, kvh, hs).transpose(1, 2)
            q, k = rotate(q), rotate(k)
            k, v = k.repeat_interleave(nh // kvh, dim=1), v.repeat_interleave(nh // kvh, dim=1)
            y = products.attention(q, k, v).transpose(1, 2).reshape(b, t, nh * hs)
            x = x + self.linear(y, blk, "self_attn.o_proj")
            h = rms(x, blk + ".post_attention_layernorm.weight")
            moe = cfg.get("moe")
            if moe is not None and (l + 1) % moe["every"] == 0:
                experts = blk + ".experts"

                def expert(e, rows):
                    ex = f"block_sparse_moe.experts.{e}."
                    gate, up = self.linear(rows, experts, ex + "w1"), self.linear(rows, experts, ex + "w3")
                    return self.linear(F.silu(gate) * up, experts, ex + "w2")

                y, aux, z = moe_layer(h, w[blk + ".block_sparse_moe.gate.weight"], expert, moe)
                self.moe_losses.append((aux, z))
                x = x + y
                continue
            gate, up = self.linear(h, blk, "mlp.gate_proj"), self.linear(h, blk, "mlp.up_proj")
            x = x + self.linear(F.silu(gate) * up, blk, "mlp.down_proj")
        head = w["embed.wte"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
        return products.times_t(rms(x, "ln_f.weight"), head)


def main():
    weights, job_path, out = sys.argv[1], sys.argv[2], sys.argv[3]
    tensors = hf_gpt2_loss.read(weights)
    with open(job_path) as f:
        job = json.load(f)
    base = {k: v for k, v in tensors.items() if ".lora." not in k}
    adapters = {k: v.clone().requires_grad_(True) for k, v in tensors.items() if ".lora." in k}
    lora = job["lora"]  # LoRA's scale, as PEFT sets it: alpha / r, or alpha / sqrt(r) with rsLoRA
    scale = lora["alpha"] / (math.sqrt(lora["r"]) if lora["use_rslora"] else lora["r"])
    model = Model(base, adapters, job["config"], scale)
    forward = model.gpt2 if job["config"]["architecture"] == "gpt2" else model.llama
    o = job["optimizer"]
    opt = torch.optim.AdamW(list(adapters.values()), lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"], weight_decay=o["weight_decay"])
    narrow = job.get("bf16", False)
    products.BF16_PRODUCTS[0] = narrow
    if narrow:  # the frozen base is held in bf16 (a no-op on values the engine rounded already)
        model.w = {k: bf16(v) for k, v in base.items()}
    losses, norms = [], []
    for step in job["steps"]:
        tokens, targets = torch.tensor(step["tokens"]), torch.tensor(step["targets"])
        moe = job["config"].get("moe")
        if not narrow and moe is None:
            logits = forward(tokens)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
            opt.zero_grad()
            loss.backward()
        else:
            rows = job["rows"]
            micro = tokens.shape[0] // rows
            total = {k: torch.zeros_like(v) for k, v in adapters.items()}
            loss = 0.0
            for m in range(micro):
                model.a = {k: (bf16(v.detach()) if narrow else v.detach().clone()).requires_grad_(True) for k, v in adapters.items()}
                model.moe_losses = []
                logits = forward(tokens[m * rows:(m + 1) * rows])
                part = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets[m * rows:(m + 1) * rows].reshape(-1))
                objective = part
                for aux, z in model.moe_losses:
                    objective = objective + moe["aux_loss_coef"] * aux + moe["z_loss_coef"] * z
                (objective / micro).backward()
                loss += float(part) / micro
                for k, v in model.a.items():
                    if v.grad is not None:  # an expert no row of the micro-batch chose has none
                        total[k] += bf16(v.grad) if narrow else v.grad
            for k, v in adapters.items():
                v.grad = total[k]
            loss = torch.tensor(loss)
        # The global norm is the adapters' alone (the base has no gradient); clipped as DeepSpeed
        # clips: by max_norm / (norm + 1e-6) when that is below 1.
        norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in adapters.values())).item()
        norms.append(norm)
        if job.get("clipping", 0) > 0 and norm + 1e-6 > job["clipping"]:
            for p in adapters.values():
                p.grad.mul_(job["clipping"] / (norm + 1e-6))
        opt.step()
        losses.append(loss.item())
    unused = set(adapters) - model.used
    assert not unused, f"adapters the model has no layer for: {sorted(unused)}"
    result = {"loss": torch.tensor(losses, dtype=torch.float32), "grad_norm": torch.tensor(norms, dtype=torch.float32)}
    for name, t in adapters.items():
        result["final." + name] = t.detach()
    write_safetensors(out, result, {})


if __name__ == "__main__":
    main()
