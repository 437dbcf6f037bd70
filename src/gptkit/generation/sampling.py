"""The one contract for choosing tokens: :class:`SamplingParams` (checked once, and the only place
decoding's defaults are written) and :class:`DecodeStep`, the one step logits → mask → sample → stop.

Every door into decoding uses these: :func:`gptkit.generation.generate` and ``stream_ids``, the
text functions, ``gptkit generate``, the server's engine and the creativity sweep. Greedy decoding
has one spelling, ``temperature=0``: the most likely token, with top-k and top-p unused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from gptkit.tokenizer import END_OF_TEXT, Tokenizer

MAX_LOGPROBS = 5  # alternatives per token, as OpenAI's legacy completions allow
# Temperatures below this decode greedily: dividing logits by less can overflow to inf (NaN
# probabilities), and the sample would be the most likely token anyway.
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """How a sequence is decoded: how many tokens, how each is chosen, where it stops.

    ``temperature`` 0 is greedy. ``top_k``/``top_p`` keep the k most likely tokens / the smallest set
    whose probability reaches p; ``repetition_penalty`` > 1 makes tokens already in the sequence less
    likely (CTRL). ``seed`` fixes the random choices. ``stop`` strings end the text before them.
    ``logprobs`` (server): also report the chosen token's log-probability and the k best
    alternatives; ``prompt_logprobs``: score the prompt's tokens too.
    """

    # The help texts are `gptkit generate`'s flags' (its config holds a SamplingParams); ``deprecated``
    # names old flags that still work, ``cli=False`` fields are the server's only.
    max_tokens: int = field(
        default=16,
        metadata={"help": "Tokens to generate per sample.", "deprecated": ("max_new_tokens",)},
    )
    temperature: float = field(
        default=1.0,
        metadata={
            "help": "Divide the logits by this: < 1 safer, > 1 more adventurous; 0: always the most likely "
            "token.",
            "deprecated_switches": {"greedy": 0.0},  # --greedy: --temperature 0
        },
    )
    top_k: int | None = field(default=None, metadata={"help": "Sample among the k most likely tokens only."})
    top_p: float | None = field(
        default=None, metadata={"help": "Sample among the most likely tokens whose probability reaches p."}
    )
    repetition_penalty: float = field(
        default=1.0, metadata={"help": "Penalise tokens already in the text (> 1), CTRL-style."}
    )
    seed: int | None = field(default=None, metadata={"help": "Random seed, for reproducible samples."})
    stop: tuple[str, ...] = field(
        default=(), metadata={"help": "Stop before this string (repeatable).", "repeat": True}
    )
    logprobs: int | None = field(default=None, metadata={"cli": False})
    prompt_logprobs: bool = field(default=False, metadata={"cli": False})

    def __post_init__(self) -> None:
        if not isinstance(self.stop, tuple):  # a string, a list, or None from a caller's default
            stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
            object.__setattr__(self, "stop", stop)
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a number >= 0 (0 means greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in 0..{MAX_LOGPROBS}, got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    def generator(self, device: torch.device | str = "cpu") -> torch.Generator | None:
        """A random generator seeded with ``seed`` (None without a seed: torch's global one)."""
        if self.seed is None:
            return None
        return torch.Generator(device=device).manual_seed(self.seed)


GREEDY = SamplingParams(temperature=0.0)


def sampling_params(
    params: SamplingParams | None = None,
    max_tokens: int | None = None,
    do_sample: bool | None = None,
    **settings,
) -> SamplingParams:
    """``params`` (default: ``SamplingParams(**settings)``, whose defaults are the only ones) with
    ``max_tokens`` applied, for functions that take either. ``do_sample=False``: the old spelling of
    ``temperature=0``, kept for scripts written against it."""
    if params is not None and settings:
        raise TypeError(f"give SamplingParams or keyword settings, not both (got {', '.join(settings)})")
    if params is None:
        params = SamplingParams(**settings)
    if do_sample is False:
        params = replace(params, temperature=0.0)
    if max_tokens is not None:
        params = replace(params, max_tokens=max_tokens)
    return params


def process_logits(
    logits: torch.Tensor, params: SamplingParams, previous_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """Next-token logits (B, V) → the logits to sample from (float32); banned tokens get -inf.

    ``previous_ids`` (B, T): the sequence so far, for the repetition penalty. Greedy decoding
    applies only the penalty: temperature, top-k and top-p do not change the most likely token.
    """
    logits = logits.float()
    penalty = params.repetition_penalty
    if penalty != 1.0 and previous_ids is not None and previous_ids.numel():
        # CTRL (Keskar et al., 2019): make tokens already in the sequence less likely.
        seen = torch.gather(logits, 1, previous_ids)
        seen = torch.where(seen > 0, seen / penalty, seen * penalty)
        logits = logits.scatter(1, previous_ids, seen)
    if params.greedy:
        return logits
    if params.temperature != 1.0:
        logits = logits / params.temperature
    # A penalty or a temperature near 0 (5e-324) overflows a logit to +inf, and softmax of inf is
    # NaN: the largest float keeps the order and samples the same tokens.
    logits = logits.clamp(max=torch.finfo(logits.dtype).max)
    if params.top_k is not None and params.top_k < logits.size(-1):
        kth_largest = torch.topk(logits, params.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if params.top_p is not None and params.top_p < 1.0:
        # Nucleus (Holtzman et al., 2020): the smallest set of tokens whose probability reaches top_p.
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = sorted_logits.softmax(-1)
        mass_before = probs.cumsum(-1) - probs  # probability of the tokens ranked above each one
        remove_sorted = mass_before >= params.top_p
        remove_sorted[:, 0] = False  # the top token stays, even for a top_p that is 0 in float32
        remove = remove_sorted.scatter(1, order, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def sample(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    previous_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """The next token of each row of ``logits`` (B, V): (B,) ids."""
    logits = process_logits(logits, params, previous_ids)
    if params.greedy:
        return logits.argmax(-1)
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(1)


@dataclass(frozen=True)
class DecodeStep:
    """One decoding step, the same for the library and the server: logits → mask → sample → stop.

    ``n_choosable``: ids from here on are never chosen (rows of the model that the tokenizer cannot
    turn into text; None: every row may be). ``end_ids``: a chosen id among these ends its sequence.
    """

    n_choosable: int | None = None
    end_ids: tuple[int, ...] = ()

    @classmethod
    def for_tokenizer(cls, total_vocab_size: int, tokenizer: Tokenizer) -> DecodeStep:
        """Only ids ``tokenizer`` decodes; its end-of-text, when the model has a row for it, ends."""
        eos = tokenizer.special_tokens.get(END_OF_TEXT)
        ends = (eos,) if eos is not None and eos < total_vocab_size else ()
        return cls(min(len(tokenizer), total_vocab_size), ends)

    @classmethod
    def for_ids(cls, end_ids: int | Sequence[int] | None = None) -> DecodeStep:
        """No tokenizer to consult: every row may be chosen; ``end_ids`` (one id or several) end."""
        ends = (end_ids,) if isinstance(end_ids, int) else tuple(int(i) for i in end_ids or ())
        return cls(None, ends)

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` (B, V) as float32, with the ids that may not be chosen at -inf."""
        logits = logits.float()
        if self.n_choosable is not None and logits.size(-1) > self.n_choosable:
            logits = logits.clone()  # .float() of float32 logits is the caller's tensor: not in place
            logits[:, self.n_choosable :] = float("-inf")
        return logits

    def __call__(
        self,
        logits: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator | None = None,
        previous_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The next token of each row of ``logits`` (B, V), and whether it ends its row: two (B,)."""
        ids = sample(self.mask(logits), params, generator, previous_ids)
        if not self.end_ids:
            return ids, torch.zeros_like(ids, dtype=torch.bool)
        return ids, torch.isin(ids, torch.tensor(self.end_ids, device=ids.device))
