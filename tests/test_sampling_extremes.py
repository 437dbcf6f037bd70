"""Sampling settings at the edges the server accepts (found by fuzzing it from its schema): a
top_p or a repetition penalty so small that float32 holds it as 0, or that overflows a logit to
infinity, still samples, and samples what the settings' limit says."""

from __future__ import annotations

import torch

from gptkit.generation.sampling import SamplingParams, sample


def test_a_top_p_of_float32_zero_keeps_the_most_likely_token():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(1))
    params = SamplingParams(top_p=5e-324, temperature=1.0)  # 0 in float32: only the top token remains
    assert torch.equal(sample(logits, params, torch.Generator().manual_seed(0)), logits.argmax(-1))


def test_a_vanishing_repetition_penalty_overflows_no_logit_to_nan():
    """A penalty below 1 favours repeats: near 0, a repeated token's positive logit / penalty is +inf
    in float32; the sample is then one of those tokens, never a NaN failure."""
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(2)).abs() + 0.1  # all positive
    previous = torch.tensor([[5, 9], [1, 2], [30, 31]])
    params = SamplingParams(repetition_penalty=5e-324, temperature=0.7)
    for seed in range(5):
        ids = sample(logits, params, torch.Generator().manual_seed(seed), previous)
        assert all(int(token) in row.tolist() for token, row in zip(ids, previous)), ids
