"""Decoding: the KV cache against full recomputation and transformers; sampling sets by hand."""

from __future__ import annotations

import pytest
import torch

from gptkit import GPT, GPTConfig, KVCache
from gptkit.generation import SamplingParams, generate, generate_text, process_logits, sample, stream_text
from gptkit.tokenizer import Tokenizer


def tiny(ln_position: str) -> GPT:
    config = GPTConfig.from_preset("tiny", ln_position=ln_position, dropout=0.0)
    return GPT(config).eval()


@pytest.mark.parametrize("ln_position", ["post", "pre"])
def test_cached_decoding_equals_full_recomputation(ln_position):
    model = tiny(ln_position)
    prompt = torch.randint(0, 512, (2, 7))
    with torch.no_grad():
        cache = KVCache(model.config, 2, 30)
        logits = model(prompt, cache=cache).logits[:, -1]
        sequence = prompt
        for _ in range(20):
            full = model(sequence).logits[:, -1]  # no cache: the whole sequence again
            torch.testing.assert_close(logits, full, atol=1e-4, rtol=0)
            next_ids = logits.argmax(-1, keepdim=True)
            sequence = torch.cat([sequence, next_ids], dim=1)
            logits = model(next_ids, cache=cache).logits[:, -1]
    assert torch.equal(generate(model, prompt, 20, temperature=0), sequence)
    assert torch.equal(generate(model, prompt, 20, temperature=0, use_cache=False), sequence)


@pytest.mark.parametrize("ln_position", ["post", "pre"])
def test_a_cache_filled_in_chunks_gives_the_full_sequences_logits(ln_position):
    """Several new tokens after a non-empty cache (a prompt fed in chunks) need the causal mask
    offset by the past; one new token needs none. Every position's logits equal one full pass."""
    model = tiny(ln_position)
    ids = torch.randint(0, 512, (2, 12))
    with torch.no_grad():
        full = model(ids).logits
        cache = KVCache(model.config, 2, 12)
        chunks = [model(ids[:, start:end], cache=cache).logits for start, end in ((0, 5), (5, 6), (6, 12))]
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, atol=1e-5, rtol=1e-5)


def test_greedy_ids_equal_transformers_gpt2(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=97, n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=None, eos_token_id=None
    )
    reference = transformers.GPT2LMHeadModel(config).eval()
    reference.save_pretrained(tmp_path)
    ours = GPT.from_pretrained(tmp_path)
    prompt = torch.randint(0, 97, (3, 9))
    expected = reference.generate(
        prompt, max_new_tokens=30, do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(prompt)
    )
    assert torch.equal(generate(ours, prompt, 30, temperature=0), expected)


def test_left_padded_batch_equals_one_at_a_time():
    model = tiny("pre")
    short, long = torch.randint(0, 512, (1, 4)), torch.randint(0, 512, (1, 9))
    batch = torch.cat([torch.cat([torch.zeros(1, 5, dtype=torch.long), short], 1), long])
    mask = torch.tensor([[0] * 5 + [1] * 4, [1] * 9])
    out = generate(model, batch, 12, temperature=0, attention_mask=mask)
    assert torch.equal(out[0, 5:], generate(model, short, 12, temperature=0)[0])
    assert torch.equal(out[1], generate(model, long, 12, temperature=0)[0])


def test_top_k_and_top_p_never_sample_outside_the_allowed_set():
    probs = torch.tensor([[0.05, 0.5, 0.1, 0.2, 0.15]])
    logits = probs.log()
    generator = torch.Generator().manual_seed(0)

    def drawn(**settings) -> set[int]:
        params = SamplingParams(**settings)
        return set(sample(logits.expand(4000, -1), params, generator).tolist())

    assert drawn(top_k=2) == {1, 3}  # the two largest
    # Nucleus by hand: sorted 0.5 (id 1), 0.2 (id 3) reach 0.7 ≥ top_p; id 4 would start past it.
    assert drawn(top_p=0.7) == {1, 3}
    assert drawn(top_p=0.71) == {1, 3, 4}
    assert drawn(top_p=0.3) == {1}
    assert drawn(top_k=3, top_p=0.6) == {1, 3}
    assert drawn() == {0, 1, 2, 3, 4}
    assert drawn(temperature=0, top_k=3) == {1}  # greedy: the most likely, whatever else is set


def test_temperature_and_repetition_penalty_by_hand():
    logits = torch.tensor([[2.0, -1.0, 0.5, 4.0]])
    torch.testing.assert_close(process_logits(logits, SamplingParams(temperature=2.0)), logits / 2)
    params = SamplingParams(repetition_penalty=2.0)
    penalised = process_logits(logits, params, previous_ids=torch.tensor([[0, 1]]))
    torch.testing.assert_close(penalised, torch.tensor([[1.0, -2.0, 0.5, 4.0]]))


def test_sampling_is_reproducible_with_a_seed_and_low_temperature_is_greedy():
    model = tiny("post")
    prompt = torch.randint(0, 512, (1, 5))

    def sampled(seed, **kwargs):
        return generate(model, prompt, 15, temperature=kwargs.pop("temperature", 1.0), seed=seed, **kwargs)

    assert torch.equal(sampled(3), sampled(3))
    assert not torch.equal(sampled(3), sampled(4))
    assert torch.equal(sampled(3, temperature=1e-4), generate(model, prompt, 15, temperature=0))


def test_end_token_stops_its_row_only_and_pads_it():
    """Row 0 makes the end token first; row 1 never makes it and decodes on to its full length."""
    torch.manual_seed(0)  # weights of its own, whatever ran before: for them the two rows' ends differ
    model = tiny("pre")
    prompt = torch.randint(0, 512, (2, 4), generator=torch.Generator().manual_seed(0))
    greedy = generate(model, prompt, 10, temperature=0)
    end = int(greedy[0, 4])
    assert end not in greedy[1, 4:].tolist() and end != 511, "the prompts give the rows different ends"
    out = generate(model, prompt, 10, temperature=0, eos_token_id=end, pad_token_id=511)
    # By hand: row 0 keeps its end token, then only padding; row 1 is its greedy sequence, whole.
    expected = torch.stack([torch.cat([greedy[0, :5], torch.full((9,), 511)]), greedy[1]])
    assert out.shape == (2, 14) and torch.equal(out, expected)


def test_context_overflow_is_a_clear_error():
    model = tiny("post")
    with pytest.raises(ValueError, match="60 tokens \\+ 10 new tokens exceeds the model's context of 64"):
        generate(model, torch.zeros(1, 60, dtype=torch.long), 10)


def test_streamed_text_equals_generated_text_and_stops(small_tokenizer):
    tokenizer = Tokenizer.from_pretrained(small_tokenizer)
    config = GPTConfig(
        vocab_size=len(tokenizer),
        context_length=64,
        n_layer=1,
        n_head=2,
        d_model=16,
        ln_position="pre",
        dropout=0.0,
    )
    # Random weights: a greedy continuation may be all bytes that never complete a character (then
    # it arrives as one piece at the end, and seen in a full run, whose earlier tests leave other
    # global state). The test is about streaming: take the first seed whose text streams in pieces.
    for seed in range(10):
        torch.manual_seed(seed)
        model = GPT(config).eval()
        pieces = list(stream_text(model, tokenizer, "Once upon a time", max_new_tokens=20, temperature=0))
        if len(pieces) > 1:
            break
    assert len(pieces) > 1, f"no seed of 10 gave a continuation in more than one piece: {pieces}"
    [whole] = generate_text(model, tokenizer, ["Once upon a time"], max_new_tokens=20, temperature=0)
    assert "".join(pieces) == whole
    # One prompt as a string is one prompt (not one per character), and gives a string.
    assert generate_text(model, tokenizer, "Once upon a time", max_new_tokens=20, temperature=0) == whole
    stop = whole[3:6]
    stopped = "".join(
        stream_text(model, tokenizer, "Once upon a time", max_new_tokens=20, temperature=0, stop=[stop])
    )
    assert stopped == whole[: whole.find(stop)]
    with pytest.warns(UserWarning, match="left-truncated"):
        list(stream_text(model, tokenizer, "word " * 100, max_new_tokens=4))


@pytest.mark.parametrize(
    "sentence",
    [
        'it is a well-known fact, "he said." and/or we cannot only wait...',
        "i didn't know 1,000 of them -- and she's gone (for now)!",
    ],
)
def test_streamed_gpt1_text_is_the_whole_text_even_when_joining_rewrites_its_end(
    data_dir, monkeypatch, sentence
):
    """GPT-1's detokenizer rewrites the end of a text as tokens arrive ("well -" → "well-known",
    an opening quote attaches to the next word): the stream must still add up to the final text."""
    import gptkit.generation.text as text_module

    tokenizer = Tokenizer.from_pretrained(data_dir / "gpt1_bpe")
    prompt_ids, scripted = tokenizer.encode("so"), tokenizer.encode(sentence)
    model = GPT(GPTConfig(vocab_size=len(tokenizer), context_length=64, n_layer=1, n_head=1, d_model=8))

    def scripted_ids(model, input_ids, params, **kwargs):  # the model's choices, fixed
        yield from (torch.tensor([token]) for token in scripted[: params.max_tokens])

    monkeypatch.setattr(text_module, "stream_ids", scripted_ids)
    pieces = list(stream_text(model, tokenizer, "so", max_new_tokens=len(scripted)))
    full = tokenizer.decode_text(prompt_ids + scripted)
    assert "".join(pieces) == full[len(tokenizer.decode_text(prompt_ids)) :]
    assert len(pieces) > 3  # it streamed, rather than printing everything at the end
    assert "well-known" in full or "didn't" in full
    stopped = "".join(stream_text(model, tokenizer, "so", max_new_tokens=len(scripted), stop=[","]))
    assert stopped == full[len("so") :].split(",")[0]


def test_the_decode_step_masks_ids_without_text_and_ends_at_its_end_ids():
    from gptkit.generation import DecodeStep

    logits = torch.tensor([[0.0, 3.0, 1.0, 9.0], [2.0, 0.0, 1.0, 9.0]])
    greedy = SamplingParams(temperature=0)
    ids, ends = DecodeStep(n_choosable=3, end_ids=(1,))(logits, greedy)
    assert ids.tolist() == [1, 0] and ends.tolist() == [True, False]  # id 3 is never chosen
    assert logits[0, 3] == 9.0  # the caller's logits are left alone
    ids, ends = DecodeStep.for_ids([0, 3])(logits, greedy)  # no mask: every id may be chosen
    assert ids.tolist() == [3, 3] and ends.tolist() == [True, True]


def test_the_text_functions_decode_step_follows_the_tokenizer(data_dir):
    from gptkit.generation import DecodeStep

    tokenizer = Tokenizer.from_pretrained(data_dir / "gpt2_bpe")
    assert DecodeStep.for_tokenizer(50257 + 3, tokenizer) == DecodeStep(50257, (50256,))
    assert DecodeStep.for_tokenizer(1000, tokenizer) == DecodeStep(1000, ())  # no row for <|endoftext|>
    gpt1 = Tokenizer.from_pretrained(data_dir / "gpt1_bpe")
    assert DecodeStep.for_tokenizer(len(gpt1), gpt1) == DecodeStep(len(gpt1), ())


def test_defaults_are_sampling_params_alone():
    """Every door that is given no setting decodes with SamplingParams()'s."""
    from gptkit.generation.sampling import sampling_params
    from gptkit.generation.text import GenerateConfig

    assert sampling_params() == SamplingParams()
    assert sampling_params(max_tokens=5) == SamplingParams(max_tokens=5)
    assert GenerateConfig(model="m").sampling == SamplingParams()
