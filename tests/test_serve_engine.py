"""The server's engine in this process, without HTTP: the decoding step it shares with the library,
and the logprobs its completions are answered with.

References: the library's own text functions (for the step), and the returned text itself (offsets
must index it, and the tokens must add up to it, as in OpenAI's API).
"""

from __future__ import annotations

import threading

import pytest
import torch

from gptkit import GPT, GPTConfig
from gptkit.generation import SamplingParams, generate_text
from gptkit.serve.engine import Engine, GenerationRequest
from gptkit.serve.responses import Choice, LogprobsWriter, completion_body
from gptkit.tokenizer import Tokenizer


class FixedLogits(torch.nn.Module):
    """An output layer that scores every position alike: ``scores`` (V,) whatever the input."""

    def __init__(self, scores: torch.Tensor):
        super().__init__()
        self.scores = scores

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.scores.expand(*hidden.shape[:-1], -1)


def complete(
    model: GPT, tokenizer: Tokenizer, prompt: str, params: SamplingParams, echo: bool = False
) -> Choice:
    """One sequence through the engine, assembled as the server assembles a choice."""
    prompt_ids = tokenizer.encode(prompt)
    choice = Choice(0, prompt_ids, prompt, echo=echo)
    finished = threading.Event()

    def deliver(event) -> None:
        choice.add(event)
        if choice.done:
            finished.set()

    engine = Engine(model, tokenizer, max_batch=2)
    engine.start()
    try:
        engine.submit([GenerationRequest(0, prompt_ids, params, deliver)])
        assert finished.wait(60), "the engine finished the sequence"
    finally:
        engine.stop()
    assert choice.error is None
    return choice


def test_the_engine_and_the_library_never_choose_a_token_without_text(data_dir):
    """A model with rows the tokenizer has no text for, scored highest: both doors take the same
    step and choose among the tokenizer's ids only."""
    tokenizer = Tokenizer.from_pretrained(data_dir / "gpt2_bpe")
    model = GPT(
        GPTConfig(vocab_size=len(tokenizer), n_special=3, context_length=32, n_layer=1, n_head=1, d_model=8)
    )
    scores = torch.zeros(model.config.total_vocab_size)
    scores[len(tokenizer) :] = 100.0  # the rows past the tokenizer's vocabulary
    the = tokenizer.encode(" the")[0]
    scores[the] = 50.0
    model.lm_head = FixedLogits(scores)
    params = SamplingParams(max_tokens=4, temperature=0)
    library = generate_text(model.eval(), tokenizer, "Once", params=params)
    served = complete(model, tokenizer, "Once", params)
    assert library == served.text == " the" * 4
    # Sampled, too: the masked rows' 100 would otherwise take every draw.
    sampled = complete(model, tokenizer, "Once", SamplingParams(max_tokens=8, temperature=1.0, seed=0))
    assert sampled.text == " the" * 8


def test_an_end_of_text_id_the_model_has_no_row_for_neither_ends_nor_pads(data_dir):
    """GPT-2's tokenizer on a model with a 1,000-token vocabulary: id 50256 is no token of it."""
    tokenizer = Tokenizer.from_pretrained(data_dir / "gpt2_bpe")
    model = GPT(GPTConfig(vocab_size=1000, context_length=32, n_layer=1, n_head=1, d_model=8)).eval()
    params = SamplingParams(max_tokens=5, temperature=0)
    short, long = tokenizer.decode([64]), tokenizer.decode([262, 286, 290, 257])  # "a", " the of and a"
    assert max(tokenizer.encode(short + long)) < 1000
    batch = generate_text(model, tokenizer, [short, long], params=params)  # left-padded
    assert batch == [
        generate_text(model, tokenizer, short, params=params),
        complete(model, tokenizer, long, params).text,
    ]


@pytest.mark.parametrize("vocabulary", ["gpt1_bpe", "gpt2_bpe"])
@pytest.mark.parametrize("echo", [False, True], ids=["completion", "echo"])
def test_logprobs_tokens_add_up_to_the_text_and_offsets_index_it(data_dir, vocabulary, echo):
    """OpenAI's contract: ``text_offset[i]`` is where token i's text starts in the returned text,
    and the tokens joined are that text; GPT-1's text is detokenized (``king 's`` → ``king's``), so
    its tokens cannot be each id's raw text."""
    tokenizer = Tokenizer.from_pretrained(data_dir / vocabulary)
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=len(tokenizer), context_length=64, n_layer=1, n_head=2, d_model=16, init_std=0.2
    )
    model = GPT(config).eval()
    prompt = "it is the king's horse, said he."
    params = SamplingParams(max_tokens=24, temperature=0, logprobs=1, prompt_logprobs=echo)
    choice = complete(model, tokenizer, prompt, params, echo=echo)
    body = completion_body("cmpl-1", 0, "m", [choice], len(choice.prompt_ids), LogprobsWriter(tokenizer))
    [answer] = body["choices"]
    text, logprobs = answer["text"], answer["logprobs"]
    ids = (choice.prompt_ids if echo else []) + [token for token, _ in choice.scored]
    assert (
        len(logprobs["tokens"]) == len(logprobs["text_offset"]) == len(ids) == len(logprobs["token_logprobs"])
    )
    # Offsets count in the prompt followed by the completion, whether the prompt is echoed or not.
    full = text if echo else prompt + text
    start = 0 if echo else len(prompt)
    assert full[start:] == "".join(logprobs["tokens"])
    for token, offset in zip(logprobs["tokens"], logprobs["text_offset"]):
        assert offset == start and full[offset : offset + len(token)] == token
        start += len(token)
    # Each token has its own text (a few may wait for the next one), not all of it on the last.
    assert sum(1 for token in logprobs["tokens"] if token) >= len(ids) - 4
    if vocabulary == "gpt2_bpe" and not any("\ufffd" in tokenizer.decode([i]) for i in ids):
        # Byte-level: each token's text is its own decoding, as OpenAI's GPT-2 tokens are.
        assert logprobs["tokens"] == [tokenizer.decode([i]) for i in ids]
