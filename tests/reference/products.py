"""The matrix products of the references, as zeroth computes them (models/gpt/cpu/gpt_kernels.cc):
in f32 runs plain f32 products; in zeroth's bf16 mode every product with a weight (the linear
layers, the routers, the experts, the LM head) takes its activations rounded to bf16 (nearest
even) and accumulates in f32, in the backward pass too: the input gradient is bf16(dy) W and the
weight gradient bf16(dy)^T bf16(x), with the inputs PyTorch's bf16 autocast gives them (autocast
also rounds the outputs, and runs attention's products in bf16). Attention's own products
(scores, weighted values) stay f32 here. `train` in gpt_reference.py switches the mode.
"""
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
