"""gptkit.data.batching: the batches and padding every scorer, trainer and server path uses.

References: the batches written out by hand, and a model run on each sequence alone.
"""

from __future__ import annotations

import pytest
import torch

from gptkit import GPT, GPTConfig
from gptkit.data.batching import PAD_TO_MULTIPLE, length_batches, pad_right, padded_length


def test_longest_first_chunks_keep_ties_in_their_given_order():
    lengths = [3, 9, 5, 9, 1, 5]
    assert length_batches(lengths, 2, longest_first=True) == [[1, 3], [2, 5], [0, 4]]
    assert length_batches(lengths, 4) == [[4, 0, 2, 5], [1, 3]]  # shortest first
    assert length_batches([], 4) == []
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        length_batches(lengths, 0)


def test_slack_starts_a_new_batch_where_padding_would_cost_too_much():
    lengths = [10, 11, 20, 21]
    # Shortest first: 20 after 10, 11 would compute 3 × 20 = 60 tokens for 41 (> 1.25×).
    assert length_batches(lengths, 8, slack=1.25) == [[0, 1], [2, 3]]
    # Longest first the batch is padded to its first: 10 after 21, 20, 11 would compute 4 × 21 = 84
    # for 62 (> 1.25×); 11 after 21, 20: 63 for 52 (≤ 1.25×).
    assert length_batches(lengths, 8, longest_first=True, slack=1.25) == [[3, 2, 1], [0]]
    assert length_batches(lengths, 8, slack=None) == [[0, 1, 2, 3]]


def test_padding_rounds_up_to_the_multiple_but_never_past_the_context():
    assert PAD_TO_MULTIPLE == 16
    assert [padded_length(n) for n in (1, 16, 17)] == [16, 16, 32]
    assert padded_length(17, max_length=20) == 20 and padded_length(25, max_length=20) == 25
    ids = pad_right([[5, 6, 7], [8]], pad_id=9)
    assert ids.tolist() == [[5, 6, 7] + [9] * 13, [8] + [9] * 15]


def test_right_padding_changes_no_logit_of_a_real_token():
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_preset("tiny", dropout=0.0)).eval()
    sequences = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]]
    with torch.no_grad():
        batched = model(pad_right(sequences)).logits
        for row, sequence in enumerate(sequences):
            alone = model(torch.tensor([sequence])).logits[0]
            torch.testing.assert_close(batched[row, : len(sequence)], alone, atol=1e-5, rtol=1e-5)
