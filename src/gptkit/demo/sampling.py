"""The demo's last stage: the creativity sweep's recommended setting, then a few continuations."""

from __future__ import annotations

from gptkit.demo.plan import MARGIN_SECONDS, Deadline
from gptkit.evaluate.tradeoff import passages_from_text, sweep
from gptkit.generation import SamplingParams, generate_text

PROMPTS = ["It was a dark and stormy night, and", "The king said to his daughter", "Alice looked at the"]
SAMPLE_TOKENS = 30
# The sweep's passages: enough that, with a deadline, it runs until the time is up rather than out of
# passages (so that the demo ends in the last minute of its budget); 12 without one.
BUDGETED_PASSAGES, UNBUDGETED_PASSAGES = 400, 12


def recommended_sampling(model, ids: list[int], seconds: float | None = None) -> dict:
    """The sampling setting the creativity sweep recommends on held-out text ``ids`` (its samples'
    NLL closest to the true text's; :mod:`gptkit.evaluate.tradeoff`), on as many passages as
    ``seconds`` hold; with the passages it used."""
    count = UNBUDGETED_PASSAGES if seconds is None else BUDGETED_PASSAGES
    passages = passages_from_text(ids, prompt_tokens=32, new_tokens=24, count=count)
    report = sweep(
        model,
        passages,
        temperatures=(0.6, 0.8, 1.0),
        top_ps=(None, 0.9),
        samples_per_prompt=2,
        seconds=seconds,
    )
    return report["recommended"] | {"passages": report["passages"]}


def sample(model, tokenizer, held_out: list[int], deadline: Deadline | None) -> tuple[dict, dict[str, str]]:
    """The last stage: the recommended setting on ``held_out`` ids, swept until the budget's margin
    (None: 12 passages), and a continuation of each prompt."""
    seconds = None if deadline is None else max(0.0, deadline.left() - MARGIN_SECONDS)
    setting = recommended_sampling(model, held_out, seconds)
    print(
        f"    recommended: temperature {setting['temperature']}, top-p {setting['top_p'] or 'off'} "
        f"(swept on {setting['passages']} held-out passages)"
    )
    params = SamplingParams(
        max_tokens=SAMPLE_TOKENS, temperature=setting["temperature"], top_p=setting["top_p"], seed=0
    )
    samples = generate_text(model, tokenizer, PROMPTS, params=params)
    for prompt, text in zip(PROMPTS, samples):
        print(f"    {prompt} → {' '.join(text.split())}")  # newlines folded for display
    return setting, dict(zip(PROMPTS, samples))
