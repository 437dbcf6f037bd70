"""How the engine runs the model for a step: the tokens of its sequences in, the logits of those that
get a next token out. Two runners, one a kind of model:

* :class:`PagedRunner`, for a model in a native layout (:mod:`gptkit.model.native_step`): the keys
  and values in pages (:class:`~gptkit.serve.pages.PagedCache`), and one native call a step for
  every token of it, a decoding sequence's next input beside chunks of prompts, the output layer
  and greedy decoding's argmax included. A prompt never stalls the running sequences beyond the
  tokens the step's budget gives it, and needs no padding.
* :class:`SlotRunner`, for any other model (a GPU, PyTorch's layouts): a row of a
  :class:`~gptkit.serve.slots.SlotCache` a sequence; a joining prompt is run (all but its last
  token) by ``GPT.forward`` as it takes its row, left-padded with the others joining, then each step
  runs one token of every row.

Both give a sequence the numbers it would get alone: its logits do not depend on what else runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gptkit.model import GPT, KVCache
from gptkit.model.native_step import StepTokens
from gptkit.serve.pages import PagedCache
from gptkit.serve.slots import SlotCache


@dataclass
class StepOutput:
    """The sequences that get a next token from a step, in order, with their logits (n, V), fp32,
    and (from the native step) the most likely choosable id of each."""

    rows: list
    logits: torch.Tensor | None
    argmax: list[int] | None = None


class PagedRunner:
    """The native step over a paged cache of ``pages`` pages for at most ``max_sequences``."""

    chunked = True  # prompts run in chunks inside the steps

    def __init__(self, model: GPT, pages: int, max_sequences: int, n_choosable: int):
        self.model, self.step_fn = model, model.native_step
        self.cache = PagedCache(model.config, pages, max_sequences, self.step_fn.cache_dtype)
        self.n_choosable = n_choosable
        vocabulary = model.config.total_vocab_size
        self.logits = torch.empty(max_sequences, vocabulary, dtype=torch.float32)
        self.argmax = torch.empty(max_sequences, dtype=torch.int32)

    def positions(self, request) -> int:
        return len(request.prompt_ids) + request.params.max_tokens

    def ever_fits(self, request) -> bool:
        return self.cache.ever_fits(self.positions(request))

    def reserve(self, request) -> bool:
        """Take a row and the pages of the whole sequence, if free (cheap: under the engine's lock)."""
        if not self.cache.fits(self.positions(request)):
            return False
        request.row = self.cache.reserve(self.positions(request))
        request.length, request.pending = 0, list(request.prompt_ids)
        return True

    def start(self, requests: list) -> list:
        """Nothing to run before a step: every prompt runs in the steps. Returns what failed (none)."""
        return []

    def release(self, request) -> None:
        """Give back the sequence's row and pages (once: a second call does nothing)."""
        if request.row >= 0:
            self.cache.release(request.row)
            request.row = -1

    def step(self, work: list[tuple]) -> StepOutput:
        """One native call for ``work``: (sequence, number of its pending tokens to run now) pairs."""
        ids, sequence, column, wanted, rows = [], [], [], [], []
        for request, count in work:
            ids += request.pending[:count]
            sequence += [request.row] * count
            column += range(request.length, request.length + count)
            if count == len(request.pending):  # its last pending token: it gets a next token
                wanted.append(len(ids) - 1)
                rows.append(request)
        ids_t, column_t = torch.tensor(ids), torch.tensor(column, dtype=torch.int32)
        x = self.model.embed(ids_t, column_t).to(torch.float32, copy=True).contiguous()
        tokens = StepTokens(
            x,
            torch.tensor(sequence, dtype=torch.int32),
            column_t,
            self.cache.keys,
            self.cache.values,
            self.cache.block_table,
        )
        n = len(wanted)
        logits, argmax = self.logits[:n], self.argmax[:n]
        self.step_fn.run(tokens, torch.tensor(wanted, dtype=torch.int32), logits, argmax, self.n_choosable)
        for request, count in work:
            request.length += count
            del request.pending[:count]
        return StepOutput(rows, logits, argmax.tolist())


class SlotRunner:
    """``GPT.forward`` over a :class:`SlotCache` of ``max_sequences`` rows of the whole context."""

    chunked = False  # a prompt runs whole as it joins

    def __init__(self, model: GPT, max_sequences: int):
        self.model = model
        parameter = next(model.parameters())
        self.device, self.cache_dtype = parameter.device, model.cache_dtype
        self.cache = SlotCache(model.config, max_sequences, self.device, self.cache_dtype)
        self.by_row: list = []  # the running sequences, by cache row
        self.reserved = 0

    def ever_fits(self, request) -> bool:
        return True  # the engine checked the context

    def reserve(self, request) -> bool:
        if self.reserved == self.cache.max_batch:
            return False
        self.reserved += 1
        request.row = 0  # held; its cache row is its place in by_row once started
        return True

    def start(self, requests: list) -> list:
        """Run the joining prompts (all but their last token) and copy them into free rows; returns
        the requests whose prompts failed (out of memory, say): the running ones go on."""
        if not requests:
            return []
        prefixes = [request.prompt_ids[:-1] for request in requests]
        width = max(len(prefix) for prefix in prefixes)
        try:
            source = self._prefill(prefixes, width) if width else None
        except Exception:  # noqa: BLE001 (the caller logs, ends and releases these)
            return requests
        self.cache.make_room(width)
        for i, (request, prefix) in enumerate(zip(requests, prefixes)):
            self.cache.add(source, i, len(prefix))
            self.by_row.append(request)
            request.length, request.pending = len(prefix), [request.prompt_ids[-1]]
        return []

    def _prefill(self, prefixes: list[list[int]], width: int) -> KVCache:
        """The keys/values of ``prefixes``, left-padded to ``width`` in one batch."""
        source = KVCache(self.model.config, len(prefixes), width, self.device, self.cache_dtype)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prefixes], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prefixes], device=self.device)
        self.model(ids, attention_mask=mask, cache=source, compute_logits=False)  # (k, width)
        return source

    def release(self, request) -> None:
        """Give back the sequence's row (once: a second call does nothing)."""
        if request.row < 0:
            return
        request.row = -1
        self.reserved -= 1
        if request not in self.by_row:  # reserved, never started
            return
        row = self.by_row.index(request)
        moved = self.cache.remove(row)
        if moved is not None:
            self.by_row[row] = self.by_row[moved]
        self.by_row.pop()

    def step(self, work: list[tuple]) -> StepOutput:
        """One token of every row (the engine's work is every running sequence, one token each)."""
        if sorted(id(r) for r, _ in work) != sorted(id(r) for r in self.by_row):
            raise RuntimeError("a slot cache's step runs every row, one token each")
        self.cache.reserve_column()
        ids = torch.tensor([[request.pending[0]] for request in self.by_row], device=self.device)
        logits = self.model(
            ids,
            attention_mask=self.cache.attention_mask(),
            position_ids=self.cache.position_ids(),
            cache=self.cache,
        ).logits[:, -1, :]  # (rows, V)
        for request in self.by_row:
            request.length += 1
            request.pending.clear()
        return StepOutput(list(self.by_row), logits.float())
