"""The matrix products of the references, as zeroth computes them (models/kernels/cpu/row_kernels.cc):
in f32 runs plain f32 products; in zeroth's bf16 mode every product with a weight (the linear
layers, the routers, the experts, the LM head) takes its activations rounded to bf16 (nearest
even) and accumulates in f32, in the backward pass too: the input gradient is bf16(dy) W and the
weight gradient bf16(dy)^T bf16(x), with the inputs PyTorch's bf16 autocast gives them (autocast
also rounds the outputs). Attention's own products round their operands too (attention below).
`train` in gpt_reference.py switches the mode.
"""
import math

import torch
import torch.nn.functional as F

BF16_PRODUCTS = [False]


def bf16(t):
    """Rounded to bf16 (nearest, ties to even) and back: the value zeroth's bf16 buffers hold."""
    return t.to(torch.bfloat16).float()


class _Bf16Product(torch.autograd.Function):
    """x W^T with x rounded to bf16; W already holds bf16 values (the run's parameters)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return bf16(x) @ w.T

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        d = bf16(dy)
        dw = d.reshape(-1, d.shape[-1]).T @ bf16(x).reshape(-1, x.shape[-1])
        return d @ w, dw


def linear(x, w, b=None):
    """F.linear(x, w, b) as zeroth computes it in the current mode."""
    if not BF16_PRODUCTS[0]:
        return F.linear(x, w, b)
    y = _Bf16Product.apply(x, w)
    return y if b is None else y + b


def times_t(x, w):
    """x @ w.T as zeroth computes it in the current mode."""
    return _Bf16Product.apply(x, w) if BF16_PRODUCTS[0] else x @ w.T


class _Bf16Attention(torch.autograd.Function):
    """Causal attention as zeroth's CPU kernels compute it in bf16 mode (models/kernels/cpu/attention.cc):
    q, k, v and dy rounded to bf16 before every product, f32 accumulation; the probabilities
    exp(s - max) rounded before P V, the output divided by their unrounded sum; backward, the
    probabilities exp(s - lse) rounded before P^T dY, dS = P (dP - rowsum(dy y)) scale rounded before
    dS K and dS^T Q. For T <= 128: one chunk of zeroth's online softmax, whose running max is then
    the row's."""

    @staticmethod
    def scores(q, k):
        t, hs = q.shape[-2], q.shape[-1]
        assert t <= 128, "one chunk of keys: the emulation of the online softmax's running max"
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        s = (bf16(q) @ bf16(k).transpose(-1, -2)) * (1.0 / math.sqrt(hs))
        return s.masked_fill(~causal, float("-inf"))

    @staticmethod
    def forward(ctx, q, k, v):
        s = _Bf16Attention.scores(q, k)
        m = s.amax(dim=-1, keepdim=True)
        e = torch.exp(s - m)
        l = e.sum(dim=-1, keepdim=True)
        y = (bf16(e) @ bf16(v)) / l
        ctx.save_for_backward(q, k, v, y, m + torch.log(l))
        return y

    @staticmethod
    def backward(ctx, dy):
        q, k, v, y, lse = ctx.saved_tensors
        scale = 1.0 / math.sqrt(q.shape[-1])
        p = torch.exp(_Bf16Attention.scores(q, k) - lse)
        d = bf16(dy)
        dv = bf16(p).transpose(-1, -2) @ d
        dp = d @ bf16(v).transpose(-1, -2)
        ds = bf16(p * (dp - (dy * y).sum(dim=-1, keepdim=True)) * scale)
        return ds @ bf16(k), ds.transpose(-1, -2) @ bf16(q), dv


def attention(q, k, v):
    """Causal softmax(q k^T / sqrt(hs)) v over [..., T, hs] as zeroth computes it in the current mode
    (k and v already repeated for grouped-query attention)."""
    if BF16_PRODUCTS[0]:
        return _Bf16Attention.apply(q, k, v)
    t, hs = q.shape[-2], q.shape[-1]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    att = (q @ k.transpose(-1, -2)) / math.sqrt(hs)
    return att.masked_fill(~causal, float("-inf")).softmax(dim=-1) @ v
