"""The ``gptkit`` model type of lm-evaluation-harness: a gptkit model answering lm-eval's ``LM`` API.

lm-eval asks a model three things, answered here on gptkit's own code:
- ``loglikelihood``: log P(continuation | context) and whether greedy decoding would produce the
  continuation, many pairs per forward pass (:func:`gptkit.evaluate.lm.continuation_scores`:
  longest first, right-padded; a context too long is cut from the left);
- ``loglikelihood_rolling``: a whole text's log-likelihood in lm-eval's own rolling windows;
- ``generate_until``: continuations through gptkit's generation (:class:`SamplingParams`; lm-eval's
  ``do_sample=False`` is greedy, temperature 0), batched, cut at the task's stop strings.

Importing this module imports lm-eval and registers the type, so that ``lm_eval.simple_evaluate(
model="gptkit", model_args="pretrained=DIR")`` works. :mod:`gptkit.evaluate.harness` (``gptkit
harness``) imports it when it runs, so that reading the commands' flags never imports lm-eval.
"""

from __future__ import annotations

import json
import warnings
from collections import defaultdict
from typing import Any

import torch

# The one place lm-eval is first imported, behind the error message that names the extra to install.
try:
    import lm_eval.models  # noqa: F401 (lm-eval's own model types are registered before ours)
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError("gptkit harness needs lm-evaluation-harness: pip install -e '.[eval]'") from e

from gptkit.data.batching import length_batches
from gptkit.evaluate.lm import DEFAULT_BATCH_SIZE, continuation_scores
from gptkit.generation import SamplingParams, generate_text
from gptkit.generation.text import start_ids
from gptkit.hardware import Precision, resolve_device, resolve_precision
from gptkit.model import GPT
from gptkit.tokenizer import END_OF_TEXT, Tokenizer

DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's default when a task sets no max_gen_toks


@register_model("gptkit")
class GptkitLM(TemplateLM):
    """A gptkit model (a run directory or any directory ``GPT.from_pretrained`` reads) for lm-eval.

    ``pretrained``: the model directory; ``tokenizer``: its tokenizer's directory (default: the
    model's); ``dtype``: float32 (default, exact), bfloat16 or auto (bfloat16 where the hardware multiplies
    it natively; see :func:`gptkit.hardware.resolve_precision`); ``batch_size``: sequences per forward
    pass (lm-eval's ``--batch_size``; ``auto`` or ``auto:N`` means the default, 32); ``device``: cpu, cuda, ...
    """

    def __init__(
        self,
        pretrained: str,
        tokenizer: str | None = None,
        dtype: Precision = "float32",
        batch_size: int | str | None = None,
        device: str | None = None,
        **unused: Any,
    ):
        super().__init__()
        if unused:
            warnings.warn(f"gptkit model: ignoring model_args {', '.join(sorted(unused))}", stacklevel=2)
        self._device = resolve_device(device or "auto")
        try:
            choice = resolve_precision(dtype, self._device, "scoring")
        except ValueError as e:
            raise ValueError(f"gptkit model: dtype: {e}") from None
        self.model = GPT.from_pretrained(pretrained, dtype=choice.dtype, device=str(self._device))
        self.model.eval()
        self.gptkit_tokenizer = Tokenizer.from_pretrained(tokenizer or pretrained)
        automatic = batch_size is None or str(batch_size).startswith("auto")  # lm-eval's auto, auto:N
        self.batch_size = DEFAULT_BATCH_SIZE if automatic else int(batch_size)
        self.max_length = self.model.config.context_length
        # What an empty context is scored after, and where generation ends: GPT-2's <|endoftext|>
        # (GPT-1's _start_ where there is none, as gptkit's own scoring does).
        self._prefix_token_id = start_ids(self.model, self.gptkit_tokenizer)[0]
        self.end_of_text = END_OF_TEXT if END_OF_TEXT in self.gptkit_tokenizer.special_tokens else None

    @property
    def eot_token_id(self) -> int:
        return self._prefix_token_id

    @property
    def device(self) -> torch.device:
        return self._device

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return self.gptkit_tokenizer.encode(string)

    def tok_decode(self, tokens: list[int], **kwargs: Any) -> str:
        return self.gptkit_tokenizer.decode(tokens)

    def _loglikelihood_tokens(
        self,
        requests: list[tuple[tuple[str, str], list[int], list[int]]],
        disable_tqdm: bool = False,
        **kwargs,
    ) -> list[tuple[float, bool]]:
        """(log P(continuation | context), greedy?) of lm-eval's already tokenized pairs."""
        pairs = [(context, continuation) for _, context, continuation in requests]
        scores = continuation_scores(self.model, pairs, self.batch_size)
        results = [(score.logprob, score.greedy) for score in scores]
        for (strings, _, _), result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", strings, result)
        return results

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        """Each text's log-likelihood: lm-eval's rolling windows (every token predicted once, with as
        much context before it as fits), all windows of all texts scored in shared batches.

        gptkit's scorer feeds a window's last token too, so a window predicts context − 1 tokens (lm-eval's
        ``hf`` backend: context); texts shorter than the context are scored alike.
        """
        windows, owners = [], []
        for index, (text,) in enumerate(request.args for request in requests):
            for window in get_rolling_token_windows(
                token_list=self.tok_encode(text),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length - 1,
                context_len=1,
            ):
                windows.append(make_disjoint_window(window))
                owners.append(index)
        totals = [0.0] * len(requests)
        for owner, score in zip(owners, continuation_scores(self.model, windows, self.batch_size)):
            totals[owner] += score.logprob
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        """Continuations through gptkit's decoding: requests with the same generation settings run
        as batches of similar prompt lengths (longest first), each cut at its first stop string."""
        groups: dict[str, list[int]] = defaultdict(list)
        for index, request in enumerate(requests):
            groups[json.dumps(request.args[1], sort_keys=True, default=str)].append(index)
        results = [""] * len(requests)
        for indices in groups.values():
            params = self.sampling_params(requests[indices[0]].args[1])
            lengths = [len(requests[i].args[0]) for i in indices]  # characters: the prompts are text
            for positions in length_batches(lengths, self.batch_size, longest_first=True):
                batch = [indices[position] for position in positions]
                prompts = [requests[i].args[0] for i in batch]
                with warnings.catch_warnings():  # a prompt too long is left-truncated, as lm-eval's hf does
                    warnings.filterwarnings("ignore", message="prompt of .* left-truncated")
                    texts = generate_text(self.model, self.gptkit_tokenizer, prompts, params=params, raw=True)
                for i, text in zip(batch, texts):
                    results[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return results

    def sampling_params(self, gen_kwargs: dict) -> SamplingParams:
        """lm-eval's generation settings as gptkit's: ``until`` → stop strings, ``max_gen_toks`` →
        max_tokens (at most context − 1, leaving room for the prompt), ``do_sample=False`` → greedy."""
        settings = normalize_gen_kwargs(gen_kwargs, DEFAULT_MAX_GEN_TOKS)
        stop = handle_stop_sequences(settings.pop("until", None), eos=self.end_of_text)
        max_tokens = min(settings.pop("max_gen_toks"), self.max_length - 1)
        sampled = settings.pop("do_sample", False)
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=float(settings.pop("temperature", 1.0)) if sampled else 0.0,
            top_k=settings.pop("top_k", None),
            top_p=settings.pop("top_p", None),
            stop=tuple(stop),
        )
