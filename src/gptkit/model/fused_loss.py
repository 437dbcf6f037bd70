"""The output layer fused with the next-token loss: training's loss without (positions × vocabulary)
fp32 logits (``GPT.forward`` with ``compute_logits=False``)."""

from __future__ import annotations

import torch

from gptkit.config import IGNORE_INDEX

# What the logits' gradient is stored times (see _FusedLMLoss): a power of two, so exact in every
# format, within fp16's range (65504) with room to spare.
_LOGIT_GRAD_SCALE = 2.0**12


class _FusedLMLoss(torch.autograd.Function):
    """Σ cross-entropy(h·W^T, target) / count, fusing the output layer with the loss.

    The forward pass runs a chunk of positions at a time: fp32 logits of the chunk, their
    log-sum-exp, and at once the gradient with respect to the logits, (softmax − one-hot) / count,
    stored in the compute dtype. Backward is then two matmuls. Nothing of size (positions ×
    vocabulary) is ever held in fp32 beyond one chunk, and no log-softmax graph is kept. Matmuls
    run in the autocast dtype.

    fp16 (5 exponent bits) needs the upstream gradient (the loss scale S) where autocast's own
    backward has it: on the logits' gradient before the products, (softmax − one-hot)·S/count, so
    that small probabilities stay above fp16's underflow and an overflow is the scaler's to see.
    Divided by the count in the forward pass, a 50,257-way softmax's 1/50257 fell among fp16's
    subnormals, and S cast to fp16 made 65536 inf. So fp16 stores 2¹²·(softmax − one-hot) (a power
    of two, exact, keeping probabilities down to 1.5e-8 at full precision) and applies S / (2¹²·count)
    in the backward pass, a chunk at a time.

    The logits are computed transposed, (vocabulary × chunk) = W·h^T: with the vocabulary as the
    long side the fp32 product runs ~1.7× faster on CPU than h·W^T over a few hundred rows
    (docs/results.md), the backward products gain too, and the softmax reduces over dim 0 as well.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_positions: int):
        device = hidden.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        valid = targets != IGNORE_INDEX
        count = valid.sum().clamp(min=1)
        h, w = hidden.to(dtype), weight.to(dtype)
        # (vocabulary, positions): column j is d loss / d logits of position j (fp16: times 2¹²·count).
        grad_logits_t = torch.empty(weight.size(0), hidden.size(0), dtype=dtype, device=hidden.device)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        stored = _LOGIT_GRAD_SCALE if dtype == torch.float16 else 1 / count
        with torch.autocast(device, enabled=False):
            for start in range(0, hidden.size(0), chunk_positions):
                cols = slice(start, start + chunk_positions)
                logits = (w @ h[cols].t()).float()  # (V, chunk)
                chunk_targets = targets[cols].clamp(min=0)[None, :]
                keep = valid[None, cols]
                picked = logits.gather(0, chunk_targets)
                # One exp pass gives both the log-sum-exp and the softmax: exp(l - max) summed is s,
                # log-sum-exp = max + log s, softmax = exp(l - max) / s.
                col_max = logits.amax(dim=0, keepdim=True)
                exps = logits.sub_(col_max).exp_()
                col_sum = exps.sum(dim=0, keepdim=True)
                total += ((col_max + col_sum.log() - picked) * keep).sum()
                exps.scatter_add_(0, chunk_targets, -col_sum)  # s·(softmax − one-hot)
                torch.mul(exps, keep * stored / col_sum, out=grad_logits_t[:, cols])
        ctx.save_for_backward(h, w, grad_logits_t, count)
        ctx.hidden_dtype, ctx.weight_dtype, ctx.chunk_positions = hidden.dtype, weight.dtype, chunk_positions
        return total / count

    @staticmethod
    def backward(ctx, grad_output):
        h, w, grad_logits_t, count = ctx.saved_tensors
        with torch.autocast(h.device.type, enabled=False):
            if grad_logits_t.dtype == torch.float16:
                scale = grad_output.float() / (count * _LOGIT_GRAD_SCALE)  # fp32: never inf
                grad_hidden, grad_weight = _scaled_products(grad_logits_t, h, w, scale, ctx.chunk_positions)
            else:  # bf16 has fp32's range
                scale = grad_output.to(grad_logits_t.dtype)
                grad_hidden = (grad_logits_t.t() @ w).mul_(scale)
                grad_weight = (grad_logits_t @ h).mul_(scale)
        return grad_hidden.to(ctx.hidden_dtype), grad_weight.to(ctx.weight_dtype), None, None


def _scaled_products(
    grad_logits_t: torch.Tensor, h: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, chunk_positions: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp16's backward products: the scale folded into the logits' gradient a chunk of positions
    at a time (one chunk's copy at once, as the forward pass holds), the output weight's gradient
    summed over the chunks in fp32."""
    grad_hidden = torch.empty_like(h)
    grad_weight = torch.zeros(w.shape, dtype=torch.float32, device=w.device)
    for start in range(0, h.size(0), chunk_positions):
        cols = slice(start, start + chunk_positions)
        scaled = grad_logits_t[:, cols] * scale  # fp16 (a 0-d fp32 factor keeps the dtype)
        grad_hidden[cols] = scaled.t() @ w
        grad_weight += (scaled @ h[cols]).float()
    return grad_hidden, grad_weight


def fused_next_token_loss(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk_positions: int | None = None
) -> torch.Tensor:
    """The loss of :func:`gptkit.model.network.next_token_loss` from h_n and the tied output
    weight, fused (see above).

    ``chunk_positions``: positions whose logits are held at once; by default a multiple of 64 near
    32M logits (128 MB in fp32), where the product runs at the matmul peak (an odd width such as
    414 runs ~30% slower than 384 on CPU).
    """
    d = hidden.size(-1)
    rows = hidden[:, :-1, :].reshape(-1, d)  # position i predicts token i+1
    targets = labels[:, 1:].reshape(-1)
    if chunk_positions is None:
        chunk_positions = max(64, (1 << 25) // weight.size(0) // 64 * 64)
    elif chunk_positions < 1:
        raise ValueError(f"chunk_positions must be at least 1, got {chunk_positions}")
    return _FusedLMLoss.apply(rows, weight, targets, chunk_positions)
