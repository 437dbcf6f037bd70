"""The creativity–hallucination trade-off of sampling, measured.

For each sampling setting (temperature, optionally top-p) and each held-out passage, the first
``prompt_tokens`` tokens are the prompt; the model samples ``new_tokens`` tokens and the true next
``new_tokens`` tokens are kept as the reference. Per setting:

- **diversity** (creativity): distinct-1 and distinct-2 — unique unigrams/bigrams over all generated
  tokens of the setting — and the share of samples that repeat a 4-gram of their own;
- **fidelity** (the other side of hallucination): the samples' per-token negative log-likelihood
  under the model itself at temperature 1 (``sample_nll``: how far sampling strays into what the
  model considers unlikely), and the unigram F1 overlap with the true continuation.

Human text sits at a particular NLL under a model (``reference_nll``, the true continuations'):
samples far below it are dull and repetitive, samples far above it drift away from anything the
model has evidence for. The recommended setting is the one whose ``sample_nll`` is closest to the
reference NLL — the calibration criterion of Holtzman et al. (2020).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from gptkit.evaluate.lm import continuation_logprob
from gptkit.generation import SamplingParams, generate
from gptkit.generation.text import InferenceConfig
from gptkit.model import GPT


@dataclass
class SettingResult:
    temperature: float
    top_p: float | None
    distinct_1: float
    distinct_2: float
    repeated_4gram_share: float
    sample_nll: float
    overlap_f1: float


def _distinct(samples: Sequence[Sequence[int]], n: int) -> float:
    grams = [tuple(s[i : i + n]) for s in samples for i in range(len(s) - n + 1)]
    return len(set(grams)) / max(len(grams), 1)


def _repeats_4gram(sample: Sequence[int]) -> bool:
    grams = [tuple(sample[i : i + 4]) for i in range(len(sample) - 3)]
    return len(grams) != len(set(grams))


def _unigram_f1(sample: Sequence[int], reference: Sequence[int]) -> float:
    common = sum((Counter(sample) & Counter(reference)).values())
    if not common:
        return 0.0
    precision, recall = common / len(sample), common / len(reference)
    return 2 * precision * recall / (precision + recall)


def passages_from_text(
    ids: Sequence[int], prompt_tokens: int, new_tokens: int, count: int
) -> list[tuple[list[int], list[int]]]:
    """Evenly spaced (prompt, true continuation) pairs from a token sequence."""
    span = prompt_tokens + new_tokens
    if len(ids) < span:
        raise ValueError(f"the text has {len(ids)} tokens; each passage needs {span}")
    step = max((len(ids) - span) // max(count - 1, 1), 1)
    starts = list(range(0, len(ids) - span + 1, step))[:count]
    return [(list(ids[s : s + prompt_tokens]), list(ids[s + prompt_tokens : s + span])) for s in starts]


@torch.no_grad()
def sweep(
    model: GPT,
    passages: Sequence[tuple[list[int], list[int]]],
    temperatures: Sequence[float],
    top_ps: Sequence[float | None] = (None,),
    samples_per_prompt: int = 2,
    seed: int = 0,
    seconds: float | None = None,
) -> dict:
    """Sample at every setting and measure diversity and fidelity (see the module docstring). With
    ``seconds``, passages stop being added once that much time has passed (at least one is taken):
    every setting is measured on the same passages."""
    model.eval()
    new_tokens = len(passages[0][1])
    settings = [(temperature, top_p) for top_p in top_ps for temperature in temperatures]
    # One generator per setting, each drawing passage after passage, as if the setting ran alone.
    generators = [torch.Generator().manual_seed(seed) for _ in settings]
    samples: list[list[list[int]]] = [[] for _ in settings]
    nll, f1 = [0.0] * len(settings), [0.0] * len(settings)
    reference_nll, used, started = 0.0, 0, time.perf_counter()
    for prompt, truth in passages:
        reference_nll -= continuation_logprob(model, prompt, truth)[0]
        batch = torch.tensor([prompt] * samples_per_prompt)
        for i, (temperature, top_p) in enumerate(settings):
            params = SamplingParams(max_tokens=new_tokens, temperature=temperature, top_p=top_p)
            out = generate(model, batch, params=params, generator=generators[i])[:, len(prompt) :].tolist()
            for sample in out:
                samples[i].append(sample)
                nll[i] -= continuation_logprob(model, prompt, sample)[0] / len(sample)
                f1[i] += _unigram_f1(sample, truth)
        used += 1
        if seconds is not None and time.perf_counter() - started >= seconds:
            break
    reference_nll /= used * new_tokens
    results = [
        SettingResult(
            temperature=temperature, top_p=top_p,
            distinct_1=_distinct(samples[i], 1), distinct_2=_distinct(samples[i], 2),
            repeated_4gram_share=sum(map(_repeats_4gram, samples[i])) / len(samples[i]),
            sample_nll=nll[i] / len(samples[i]), overlap_f1=f1[i] / len(samples[i]),
        )
        for i, (temperature, top_p) in enumerate(settings)
    ]  # fmt: skip
    best = min(results, key=lambda r: abs(r.sample_nll - reference_nll))
    return {
        "reference_nll": reference_nll,
        "passages": used,
        "samples_per_prompt": samples_per_prompt,
        "new_tokens": new_tokens,
        "settings": [asdict(r) for r in results],
        "recommended": {"temperature": best.temperature, "top_p": best.top_p},
    }


def format_table(report: dict) -> str:
    lines = [
        f"reference NLL of the true continuations: {report['reference_nll']:.3f} nats/token",
        "temperature  top_p  distinct-1  distinct-2  repeats-4gram  sample NLL  overlap F1",
    ]
    for r in report["settings"]:
        top_p = "-" if r["top_p"] is None else f"{r['top_p']:.2f}"
        lines.append(
            f"{r['temperature']:>11.2f}  {top_p:>5}  {r['distinct_1']:>10.3f}  {r['distinct_2']:>10.3f}  "
            f"{r['repeated_4gram_share']:>13.2f}  {r['sample_nll']:>10.3f}  {r['overlap_f1']:>10.3f}"
        )
    rec = report["recommended"]
    lines.append(
        f"recommended: temperature {rec['temperature']}" + (f", top_p {rec['top_p']}" if rec["top_p"] else "")
    )
    return "\n".join(lines)


def plot(report: dict, path: str | Path) -> None:
    """Diversity (distinct-2) against fidelity (sample NLL), one point per setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for top_p in sorted({r["top_p"] for r in report["settings"]}, key=lambda v: (v is None, v)):
        rows = [r for r in report["settings"] if r["top_p"] == top_p]
        ax.plot(
            [r["sample_nll"] for r in rows],
            [r["distinct_2"] for r in rows],
            "o-",
            label="no top-p" if top_p is None else f"top-p {top_p}",
        )
        for r in rows:
            ax.annotate(
                f"T={r['temperature']:g}",
                (r["sample_nll"], r["distinct_2"]),
                fontsize=8,
                textcoords="offset points",
                xytext=(4, 4),
            )
    ax.axvline(report["reference_nll"], color="grey", linestyle="--", label="true continuations' NLL")
    ax.set_xlabel("sample NLL under the model (nats/token): higher = drifting from the data")
    ax.set_ylabel("distinct-2: higher = more diverse")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def save_report(report: dict, out_dir: str | Path) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tradeoff.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "tradeoff.txt").write_text(format_table(report) + "\n")
    plot(report, out_dir / "tradeoff.png")


@dataclass
class TradeoffConfig(InferenceConfig):
    """Sweep temperature (and top-p): the diversity against fidelity of samples, measured."""

    model: str = field(metadata={"help": "Model folder or Hub name (gpt2, openai-gpt, org/name@rev)."})
    prompts: str = field(metadata={"help": "Held-out text; passages are cut from it."})
    tokenizer: str | None = field(
        default=None, metadata={"help": "Tokenizer folder or Hub name (default: the model's)."}
    )
    out: str = field(
        default="tradeoff", metadata={"help": "Directory for tradeoff.json, tradeoff.txt and tradeoff.png."}
    )
    temperatures: str = field(
        default="0.2,0.5,0.7,0.9,1.0,1.2,1.5", metadata={"help": "Comma-separated temperatures."}
    )
    top_p: str | None = field(
        default=None, metadata={"help": "Comma-separated top-p values to sweep as well."}
    )
    passages: int = field(default=24, metadata={"help": "Passages cut from --prompts."})
    prompt_tokens: int = field(default=32, metadata={"help": "Prompt tokens per passage."})
    max_tokens: int = field(
        default=32,
        metadata={
            "help": "Tokens sampled per passage (and true continuation kept).",
            "deprecated": ("new_tokens",),
        },
    )
    samples: int = field(default=2, metadata={"help": "Samples per passage and setting."})
    seed: int = field(default=0, metadata={"help": "Random seed."})


def run_tradeoff(config: TradeoffConfig) -> dict:
    """Load the model, cut the passages, sweep, and write the report into ``config.out``."""
    model, tokenizer = config.load(config.model, config.tokenizer)
    ids = tokenizer.encode(Path(config.prompts).read_text(encoding="utf-8"))
    passages = passages_from_text(ids, config.prompt_tokens, config.max_tokens, config.passages)
    temperatures = [float(t) for t in config.temperatures.split(",")]
    top_ps = [None] + [float(p) for p in config.top_p.split(",")] if config.top_p else [None]
    report = sweep(model, passages, temperatures, top_ps, config.samples, config.seed)
    save_report(report, config.out)
    return report
