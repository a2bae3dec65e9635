#!/usr/bin/env python3
"""The PyTorch references of the GPT tests, written with Debian's python3-torch so the C++ tests
compare against PyTorch without torch installed. Run with /usr/bin/python3:

    /usr/bin/python3 tests/reference/gpt_reference.py --forward tests/reference/gpt_torch.safetensors
    /usr/bin/python3 tests/reference/gpt_reference.py --train tests/reference/gpt_train_torch.safetensors

--forward (tests/models/gpt_test.cc): a small GPT-2 with its weights, one micro-batch, the logits,
the loss and every gradient, then 10 AdamW steps (clipping, no decay on biases and LayerNorms)
with their losses and gradient norms; and the same GPT-2 with mixtures of GELU experts as its MLPs
(MOE_CFG, moe_reference.py's gate): the logits, loss and gradients of the first micro-batch.

--train (tests/engine/train_torch_test.cc): 10 optimizer steps of a tiny GPT-2 as DeepSpeed's engine
takes them, in f32 and in zeroth's bf16 mode:
- each step's global batch is 16 sequences in 8 micro-batches of 2; any split into data-parallel
  ranks x accumulation steps (dp 1 x 8, 2 x 4, 4 x 2) computes the same step. Each micro-batch's
  loss is divided by the accumulation count before backward (DeepSpeed's engine.backward), the
  gradients are summed over a rank's micro-batches and averaged over the ranks;
- clipping to a global norm: coef = max_norm / (norm + 1e-6), applied when < 1;
- AdamW, weight decay on the matrices only (not on biases and LayerNorm parameters);
- WarmupCosineLR built before step 1 with last_batch_iteration = -1 (lr 0) and stepped after each
  optimizer step, so optimizer step k runs with the lr of iteration k - 2. Warmup ends at
  iteration 3 and the cosine at 7, so the steps see the warmup, the cosine and the clamp past
  total_num_steps; the clip value clips some steps and not others.
It records per step the loss (mean over the global batch), the global gradient norm before
clipping and the lr used (metadata "steps", exact doubles), and the final weights.

zeroth's bf16 mode (models/decoder, engine/) and how the reference emulates it:
- bf16: the parameters the model reads, rounded to nearest even from the fp32 master weights
  after every step (and at the start); the gradient buffer of each block, per rank and
  micro-batch: the block's f32 gradient is added into it and rounded once per block use. The
  tied token embedding is used twice (embedding and LM head), so its buffer holds
  bf16(bf16(g_head) + g_embedding). The reference uses two leaves for the tied matrix and rounds
  the same way.
- the products with a weight (linear layers, router, experts, LM head): activations rounded to
  bf16, f32 accumulation, forward and backward (products.py);
- attention's products: q, k, v and the gradients rounded to bf16 where zeroth's CPU kernels round
  them (products.attention);
- f32: the activations between products, the
  sum of the micro-batches' gradients and the reduction over ranks (communication_data_type
  unset), the norm, clipping, the master weights and Adam's moments.
Where the reference can differ from zeroth: the order of f32 sums inside the kernels (matmul,
softmax, LayerNorm, the reduction over ranks and micro-batches) and exp/tanh, which moves results
by a few f32 ulps; in bf16 such a difference now and then flips a rounding to the other
neighbour, a 2^-8 relative change of one gradient or parameter element, and Adam carries it into
the later steps. Dividing by the accumulation count and by dp is exact here (powers of 2), so it
rounds nothing in either.
"""
import argparse
import json
import math
import struct

import torch
import torch.nn.functional as F

from moe_reference import moe_layer
from products import BF16_PRODUCTS, attention, bf16, times_t

CFG = dict(vocab_size=97, seq_len=24, n_layer=2, n_head=4, n_embd=48)
B, T = 3, 20
STEPS = 10
OPT = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
CLIP = 1.0

# The same GPT-2 with both MLPs mixtures of 4 GELU experts (64 wide, biases), GShard's top-2 with
# DeepSpeed's capacity rule (some choices dropped), weights not renormalised.
MOE_CFG = dict(CFG, moe=dict(num_experts=4, top_k=2, capacity_factor=1.0, eval_capacity_factor=1.0, min_capacity=0,
                             drop_tokens=True, normalize_top_k=False, aux_loss_coef=0.01, z_loss_coef=1e-3, every=1,
                             intermediate_size=64))

TRAIN_CFG = dict(vocab_size=64, seq_len=16, n_layer=2, n_head=2, n_embd=32)
TRAIN_BATCH = dict(sequences=16, micro_batch=2, seq=16)  # 8 micro-batches of 2 per step
TRAIN_STEPS = 10
TRAIN_OPT = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
TRAIN_SCHEDULER = {"type": "WarmupCosineLR",
                   "params": {"total_num_steps": 7, "warmup_num_steps": 3, "warmup_min_ratio": 0.1, "cos_min_ratio": 0.1,
                              "warmup_type": "log"}}
TRAIN_CLIP = 0.55


def layernorm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def is_moe_layer(cfg, l):
    return "moe" in cfg and (l + 1) % cfg["moe"]["every"] == 0


def forward(p, idx, targets, cfg=CFG, head=None, moe_losses=None):
    """`head`: the LM head's matrix when it is a leaf of its own (default: the tied embedding).
    `moe_losses`: a list the expert layers append their (aux, z) losses to."""
    L, H, C = cfg["n_layer"], cfg["n_head"], cfg["n_embd"]
    b, t = idx.shape
    x = p["embed.wte"][idx] + p["embed.wpe"][:t]
    for l in range(L):
        q = lambda name: p[f"h.{l}.{name}"]
        h = layernorm(x, q("ln_1.weight"), q("ln_1.bias"))
        qkv = times_t(h, q("attn.c_attn.weight")) + q("attn.c_attn.bias")
        qq, kk, vv = qkv.split(C, dim=2)
        qq, kk, vv = [z.view(b, t, H, C // H).transpose(1, 2) for z in (qq, kk, vv)]
        y = attention(qq, kk, vv).transpose(1, 2).contiguous().view(b, t, C)
        x = x + times_t(y, q("attn.c_proj.weight")) + q("attn.c_proj.bias")
        h = layernorm(x, q("ln_2.weight"), q("ln_2.bias"))
        if is_moe_layer(cfg, l):
            def expert(e, rows, q=q):
                ex = f"mlp.experts.{e}."
                act = F.gelu(times_t(rows, q(ex + "c_fc.weight")) + q(ex + "c_fc.bias"), approximate="tanh")
                return times_t(act, q(ex + "c_proj.weight")) + q(ex + "c_proj.bias")
            y, aux, z = moe_layer(h, q("mlp.router.weight"), expert, cfg["moe"])
            x = x + y
            if moe_losses is not None:
                moe_losses.append((aux, z))
            continue
        h = F.gelu(times_t(h, q("mlp.c_fc.weight")) + q("mlp.c_fc.bias"), approximate="tanh")
        x = x + times_t(h, q("mlp.c_proj.weight")) + q("mlp.c_proj.bias")
    x = layernorm(x, p["ln_f.weight"], p["ln_f.bias"])
    logits = times_t(x, p["embed.wte"] if head is None else head)
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
    return logits, loss


def make_params(gen, cfg=CFG):
    V, Tm, L, C = cfg["vocab_size"], cfg["seq_len"], cfg["n_layer"], cfg["n_embd"]
    p = {"embed.wte": torch.randn(V, C, generator=gen) * 0.02, "embed.wpe": torch.randn(Tm, C, generator=gen) * 0.02}
    for l in range(L):
        # LayerNorm and bias values away from their init, so their gradients are not trivial.
        for ln in ("ln_1", "ln_2"):
            p[f"h.{l}.{ln}.weight"] = 1 + 0.1 * torch.randn(C, generator=gen)
            p[f"h.{l}.{ln}.bias"] = 0.1 * torch.randn(C, generator=gen)
        mlp = (("mlp.c_fc", (4 * C, C)), ("mlp.c_proj", (C, 4 * C)))
        if is_moe_layer(cfg, l):
            m = cfg["moe"]
            X = m["intermediate_size"]
            p[f"h.{l}.mlp.router.weight"] = torch.randn(m["num_experts"], C, generator=gen) * 0.5
            mlp = tuple(item for e in range(m["num_experts"])
                        for item in ((f"mlp.experts.{e}.c_fc", (X, C)), (f"mlp.experts.{e}.c_proj", (C, X))))
        for name, shape in (("attn.c_attn", (3 * C, C)), ("attn.c_proj", (C, C))) + mlp:
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


def write_forward(path):
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
    # The mixture of experts on the first batch, its own weights: logits, loss, every gradient (the
    # auxiliary losses' terms in it), and each layer's auxiliary and z losses.
    moe_params = {k: v.float().requires_grad_(True) for k, v in make_params(torch.Generator().manual_seed(4321), MOE_CFG).items()}
    losses_moe = []
    idx, tgt = data[0, :, :T], data[0, :, 1:]
    logits, loss = forward(moe_params, idx, tgt, MOE_CFG, moe_losses=losses_moe)
    m = MOE_CFG["moe"]
    (loss + sum(m["aux_loss_coef"] * a + m["z_loss_coef"] * z for a, z in losses_moe)).backward()
    out.update({f"moe.init.{k}": v.detach().clone() for k, v in moe_params.items()})
    out.update({f"moe.grad.{k}": v.grad.detach().clone() for k, v in moe_params.items()})
    out["moe.logits"] = logits.detach()
    out["moe.loss"] = loss.detach().reshape(1)
    out["moe.aux"] = torch.stack([a for a, _ in losses_moe]).detach()
    out["moe.z"] = torch.stack([z for _, z in losses_moe]).detach()
    meta = {"torch": torch.__version__, "config": json.dumps(CFG), "batch": json.dumps([B, T]),
            "optimizer": json.dumps(OPT), "clip": str(CLIP), "moe_config": json.dumps(MOE_CFG)}
    write_safetensors(path, out, meta)
    print(f"wrote {path}: loss {float(out['loss']):.6f}, train losses {losses[0]:.4f} -> {losses[-1]:.4f}")


class WarmupCosineLR:
    """DeepSpeed's WarmupCosineLR (deepspeed/runtime/lr_schedules.py), its formulas and stepping:
    the constructor sets the lr of last_batch_iteration = -1 (0), step() advances one iteration."""

    def __init__(self, optimizer, total_num_steps, warmup_min_ratio, warmup_num_steps, cos_min_ratio, warmup_type):
        self.optimizer, self.total_num_steps = optimizer, total_num_steps
        self.warmup_min_ratio, self.cos_min_ratio, self.warmup_type = warmup_min_ratio, cos_min_ratio, warmup_type
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.inverse_log_warm_up = 1.0 / math.log(self.warmup_num_steps)
        self.org_lrs = [g["lr"] for g in optimizer.param_groups]
        self.last_batch_iteration = -1
        self._set()

    def ratio(self):
        i = self.last_batch_iteration
        if i < 0:
            return 0.0
        if i < self.warmup_num_steps:
            r = self.inverse_log_warm_up * math.log(i + 1) if self.warmup_type == "log" else i / self.warmup_num_steps
            return self.warmup_min_ratio + r * (1.0 - self.warmup_min_ratio)
        progress = min(1.0, (i - self.warmup_num_steps + 1) / max(1, self.total_num_steps - self.warmup_num_steps))
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * ((1 + math.cos(math.pi * progress)) / 2))

    def _set(self):
        for g, lr in zip(self.optimizer.param_groups, self.org_lrs):
            g["lr"] = lr * self.ratio()

    def step(self):
        self.last_batch_iteration += 1
        self._set()


def train(init, batches, narrow, dp=2, loss_of=None, tied="embed.wte", clip=TRAIN_CLIP):
    """TRAIN_STEPS optimizer steps from `init`; `narrow`: zeroth's bf16 mode. Returns the final
    master weights and, per step, (loss, grad norm before clipping, lr). `loss_of(weights, tokens,
    targets, head)` is the model's loss (default: the GPT's), or a pair (what is differentiated, the
    loss reported) when auxiliary terms join the gradient but not the loss; `tied` names the
    embedding the LM head shares (None: an untied head), `head` then being a leaf of its own."""
    if loss_of is None:
        loss_of = lambda w, idx, tgt, head: forward(w, idx, tgt, TRAIN_CFG, head)[1]
    BF16_PRODUCTS[0] = narrow
    try:
        return _train(init, batches, narrow, dp, loss_of, tied, clip)
    finally:
        BF16_PRODUCTS[0] = False


def _train(init, batches, narrow, dp, loss_of, tied, clip):
    mb = TRAIN_BATCH["micro_batch"]
    gas = TRAIN_BATCH["sequences"] // (mb * dp)
    master = {k: v.clone() for k, v in init.items()}
    opt = torch.optim.AdamW([{"params": [v for v in master.values() if v.dim() >= 2], "weight_decay": TRAIN_OPT["weight_decay"]},
                             {"params": [v for v in master.values() if v.dim() < 2], "weight_decay": 0.0}],
                            lr=TRAIN_OPT["lr"], betas=TRAIN_OPT["betas"], eps=TRAIN_OPT["eps"])
    sched = WarmupCosineLR(opt, **TRAIN_SCHEDULER["params"])
    steps = []
    for s in range(TRAIN_STEPS):
        tokens, targets = batches[s % len(batches)]
        total = {k: torch.zeros_like(v) for k, v in master.items()}
        loss_sum = 0.0
        for r in range(dp):
            mine = {k: torch.zeros_like(v) for k, v in master.items()}  # the rank's f32 accumulator
            for m in range(gas):
                j = (r * gas + m) * mb
                w = {k: (bf16(v) if narrow else v.clone()).requires_grad_(True) for k, v in master.items()}
                head = w[tied].detach().clone().requires_grad_(True) if tied else None
                loss = loss_of(w, tokens[j:j + mb], targets[j:j + mb], head)
                objective, loss = loss if isinstance(loss, tuple) else (loss, loss)
                (objective / gas).backward()
                loss_sum += float(loss)
                for k, v in w.items():
                    if v.grad is None:  # an expert no token of the micro-batch chose
                        v.grad = torch.zeros_like(v)
                    if k == tied:
                        # The block's gradient buffer: the LM head's use first, then the embedding's.
                        g = bf16(bf16(head.grad) + v.grad) if narrow else v.grad + head.grad
                    else:
                        g = bf16(v.grad) if narrow else v.grad
                    mine[k] += g
            for k in total:
                total[k] += mine[k]
        for k, v in master.items():
            v.grad = total[k] / dp
        norm = math.sqrt(sum(float(v.grad.double().square().sum()) for v in master.values()))
        coef = clip / (norm + 1e-6)
        if coef < 1:
            for v in master.values():
                v.grad.mul_(coef)
        lr = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
        steps.append((loss_sum / (dp * gas), norm, lr))
    return master, steps


def write_train(path):
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(4321)
    init = make_params(gen, TRAIN_CFG)
    n, t = TRAIN_BATCH["sequences"], TRAIN_BATCH["seq"]
    data = torch.randint(0, TRAIN_CFG["vocab_size"], (2, n, t + 1), generator=gen, dtype=torch.int64)
    batches = [(data[b, :, :t], data[b, :, 1:]) for b in range(2)]  # alternating, so the loss falls
    out = {f"init.{k}": v.clone() for k, v in init.items()}
    out["train.tokens"] = data[:, :, :t].to(torch.int32)
    out["train.targets"] = data[:, :, 1:].to(torch.int32)
    record = {}
    for name, narrow in (("f32", False), ("bf16", True)):
        final, steps = train(init, batches, narrow)
        for k, v in final.items():
            out[f"{name}.final.{k}"] = v.detach().clone()
        record[name] = {"loss": [s[0] for s in steps], "grad_norm": [s[1] for s in steps], "lr": [s[2] for s in steps]}
        clipped = sum(s[1] + 1e-6 > TRAIN_CLIP for s in steps)
        print(f"{name}: loss {steps[0][0]:.4f} -> {steps[-1][0]:.4f}, grad norms {min(s[1] for s in steps):.4f} .. "
              f"{max(s[1] for s in steps):.4f} ({clipped} of {len(steps)} steps clipped at {TRAIN_CLIP})")
    assert record["f32"]["lr"] == record["bf16"]["lr"]
    meta = {"torch": torch.__version__, "config": json.dumps(TRAIN_CFG), "batch": json.dumps(TRAIN_BATCH),
            "optimizer": json.dumps(TRAIN_OPT), "scheduler": json.dumps(TRAIN_SCHEDULER), "clip": repr(TRAIN_CLIP),
            "steps": json.dumps(record)}
    write_safetensors(path, out, meta)
    print(f"wrote {path}: lr per step {[f'{x:.4g}' for x in record['f32']['lr']]}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--forward", metavar="PATH", help="write the forward/backward reference (gpt_torch.safetensors)")
    parser.add_argument("--train", metavar="PATH", help="write the training reference (gpt_train_torch.safetensors)")
    args = parser.parse_args()
    if not args.forward and not args.train:
        parser.error("name at least one of --forward PATH, --train PATH")
    if args.forward:
        write_forward(args.forward)
    if args.train:
        write_train(args.train)
