"""Continuous batching: one thread owns the model and runs one decode loop for every request.

Each turn of the loop:

1. sequences waiting in the (bounded) queue take the free rows of the :class:`SlotCache`: their
   prompts but the last token are run through the model together (left-padded) and copied in;
2. one decoding step feeds every running row its next token (a joining row: its last prompt token)
   with its own position ids and a mask over its own columns;
3. each row takes the library's decoding step (:class:`~gptkit.generation.sampling.DecodeStep`)
   with its own settings and random generator; rows that finished (length, stop
   string, end of text, cancelled, out of time) leave, and their rows are free for the next turn.

A sequence therefore reads exactly what it would read alone, whoever shares the batch with it.
Results go back through each sequence's ``deliver`` callback, from the engine's thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from gptkit import native
from gptkit.generation.incremental import IncrementalText
from gptkit.generation.sampling import DecodeStep, SamplingParams
from gptkit.model import GPT, KVCache
from gptkit.serve.slots import SlotCache
from gptkit.tokenizer import Tokenizer

logger = logging.getLogger("gptkit.serve")


@dataclass
class TokenLogprob:
    """log P of a token and the most likely alternatives at its position: [(token id, log P)]."""

    logprob: float | None
    top: list[tuple[int, float]] | None


@dataclass
class Event:
    """What the engine tells a request about one of its sequences."""

    index: int
    text: str = ""
    token_id: int | None = None
    logprob: TokenLogprob | None = None
    prompt_logprobs: list[TokenLogprob] | None = None  # sent once, before the first token
    finish_reason: str | None = None  # "length" or "stop" on the last event
    completion_tokens: int = 0
    error: str | None = None  # "timeout", "shutdown" or "internal": the sequence ended without a finish


class QueueFull(Exception):
    """The waiting queue has no room for the sequences of a request."""


class EngineStopped(Exception):
    """The engine is shutting down and takes no new sequences."""


@dataclass(eq=False)
class GenerationRequest:
    """One sequence to decode: ``index`` is its choice number within its HTTP request."""

    index: int
    prompt_ids: list[int]
    params: SamplingParams
    deliver: Callable[[Event], None]
    deadline: float | None = None  # the engine's clock() after which it ends with error "timeout"
    cancelled: bool = False
    # The engine's state, from admission on.
    generated: list[int] = field(default_factory=list)
    next_input: int = 0
    text: IncrementalText | None = None
    generator: torch.Generator | None = None

    def cancel(self) -> None:
        """Stop decoding (the client went away); the engine frees its row at its next step."""
        self.cancelled = True


class Engine:
    """Owns ``model`` and decodes every submitted sequence in one continuously batched loop."""

    def __init__(
        self,
        model: GPT,
        tokenizer: Tokenizer,
        max_batch: int = 16,
        max_queue: int = 64,
        clock: Callable[[], float] = time.monotonic,
    ):
        """``clock`` is what the sequences' deadlines are read on (a test's clock need not wait)."""
        if max_batch < 1 or max_queue < 1:
            raise ValueError(f"max_batch and max_queue must be >= 1, got {max_batch} and {max_queue}")
        self.model = model.eval()
        self.clock = clock
        self.tokenizer = tokenizer
        self.max_batch, self.max_queue = max_batch, max_queue
        parameter = next(model.parameters())
        self.device, self.cache_dtype = parameter.device, model.cache_dtype
        self.cache = SlotCache(model.config, max_batch, self.device, self.cache_dtype)
        self.decode_step = DecodeStep.for_tokenizer(model.config.total_vocab_size, tokenizer)
        self._waiting: deque[GenerationRequest] = deque()
        self._running: list[GenerationRequest] = []  # by cache row
        self._condition = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        # Counters, read by /metrics.
        self.generated_tokens = 0
        self.prompt_tokens = 0
        self.cancelled_sequences = 0
        self.finished_sequences = 0
        self.steps = 0

    # Life cycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gptkit-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop; sequences still waiting or running end with error "shutdown"."""
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def queue_length(self) -> int:
        return len(self._waiting)

    @property
    def batch_size(self) -> int:
        return len(self._running)

    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        """Queue all of ``requests`` or none: QueueFull when they do not fit."""
        context = self.model.config.context_length
        for request in requests:
            if not request.prompt_ids or len(request.prompt_ids) + request.params.max_tokens > context:
                raise ValueError(
                    f"a prompt of {len(request.prompt_ids)} tokens (at least 1) and max_tokens="
                    f"{request.params.max_tokens} must fit in the model's context of {context} tokens"
                )
        with self._condition:
            if self._stopping:
                raise EngineStopped("the server is shutting down")
            if len(self._waiting) + len(requests) > self.max_queue:
                raise QueueFull(
                    f"the queue holds {len(self._waiting)} of at most {self.max_queue} waiting sequences; "
                    f"this request needs {len(requests)} more: retry later"
                )
            self._waiting.extend(requests)
            self._condition.notify_all()

    def wake(self) -> None:
        """Have the loop look at its sequences now (one was cancelled)."""
        with self._condition:
            self._condition.notify_all()

    # The loop -----------------------------------------------------------------------------------

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self._condition:
                    while not (self._waiting or self._running or self._stopping):
                        self._condition.wait()
                    if self._stopping:
                        break
                    joining = self._take_waiting()
                try:
                    # One team of threads at a time on the model's cores: not beside a batcher's
                    # forward pass (gptkit.serve.batcher holds the same lock).
                    with native.TEAM:
                        self._admit(joining)
                        self._drop_ended()
                        if self._running:
                            self._step()
                except Exception:  # a bug or out of memory: end what runs, keep serving
                    logger.exception("decoding step failed")
                    for request in self._running:
                        self._send(request, Event(request.index, error="internal"))
                    self._running.clear()
                    while self.cache.rows:
                        self.cache.remove(self.cache.rows - 1)
        with self._condition:
            ended = list(self._waiting) + self._running
            self._waiting.clear()
            self._running = []
        for request in ended:
            self._send(request, Event(request.index, error="shutdown"))

    def _take_waiting(self) -> list[GenerationRequest]:
        joining: list[GenerationRequest] = []
        now = self.clock()
        while self._waiting and len(joining) < self.cache.free_rows():
            request = self._waiting.popleft()
            if request.cancelled:
                self.cancelled_sequences += 1
            elif request.deadline is not None and now > request.deadline:
                self._send(request, Event(request.index, error="timeout"))
            else:
                joining.append(request)
        return joining

    def _admit(self, joining: list[GenerationRequest]) -> None:
        """Run the joining prompts (all but their last token) and copy them into free rows."""
        if not joining:
            return
        prefixes = [request.prompt_ids[:-1] for request in joining]
        width = max(len(prefix) for prefix in prefixes)
        try:
            source = self._prefill(prefixes, width) if width else None
        except Exception:  # out of memory, say: these sequences end, the running ones go on
            logger.exception("prefill failed")
            for request in joining:
                self._send(request, Event(request.index, error="internal"))
            return
        self.cache.make_room(width)
        for i, (request, prefix) in enumerate(zip(joining, prefixes)):
            self.cache.add(source, i, len(prefix))
            self._running.append(request)
            self._start(request)

    def _prefill(self, prefixes: list[list[int]], width: int) -> KVCache:
        """The keys/values of ``prefixes``, left-padded to ``width`` in one batch."""
        source = KVCache(self.model.config, len(prefixes), width, self.device, self.cache_dtype)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prefixes], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prefixes], device=self.device)
        self.model(ids, attention_mask=mask, cache=source, compute_logits=False)  # (k, width)
        return source

    def _start(self, request: GenerationRequest) -> None:
        """A sequence's decoding state, as it takes its row."""
        self.prompt_tokens += len(request.prompt_ids)
        request.next_input = request.prompt_ids[-1]
        request.text = IncrementalText(self.tokenizer, request.prompt_ids, request.params.stop)
        request.generator = torch.Generator(device=self.device)
        if request.params.seed is not None:
            request.generator.manual_seed(request.params.seed)
        else:
            request.generator.seed()
        if request.params.prompt_logprobs:
            self._send(request, Event(request.index, prompt_logprobs=self._score_prompt(request)))

    def _score_prompt(self, request: GenerationRequest) -> list[TokenLogprob]:
        """log P of each prompt token after the ones before it (the first has none), as for echo."""
        ids = torch.tensor([request.prompt_ids], device=self.device)
        logprobs = self._log_softmax(self.model(ids).logits[0, :-1])  # (P - 1, V)
        chosen = logprobs.gather(1, ids[0, 1:, None])[:, 0].tolist()
        tops = self._top(logprobs, request.params.logprobs or 0)
        return [TokenLogprob(None, None)] + [TokenLogprob(c, t) for c, t in zip(chosen, tops)]

    def _drop_ended(self) -> None:
        """Free the rows of cancelled sequences and of those past their deadline."""
        now = self.clock()
        for row in reversed(range(len(self._running))):
            request = self._running[row]
            if request.cancelled:
                self.cancelled_sequences += 1
                self._leave(row)
            elif request.deadline is not None and now > request.deadline:
                self._send(request, Event(request.index, error="timeout"))
                self._leave(row)

    def _leave(self, row: int) -> None:
        moved = self.cache.remove(row)
        if moved is not None:
            self._running[row] = self._running[moved]
        self._running.pop()

    def _step(self) -> None:
        """One token for every running sequence."""
        self.cache.reserve_column()
        ids = torch.tensor([[request.next_input] for request in self._running], device=self.device)
        logits = self.model(
            ids,
            attention_mask=self.cache.attention_mask(),
            position_ids=self.cache.position_ids(),
            cache=self.cache,
        ).logits[:, -1, :]  # (rows, V)
        self.steps += 1
        # Masked for the whole batch here, so that the log-probabilities reported are those of the
        # tokens that may be chosen; the step masks each row again (the same ids, already -inf).
        logits = self.decode_step.mask(logits)
        wants_logprobs = [r.params.logprobs is not None for r in self._running]
        logprobs = self._log_softmax(logits) if any(wants_logprobs) else None
        ended = []
        for row, request in enumerate(self._running):
            try:
                token, ends = self._sample(request, logits[row : row + 1])
                scored = None
                if wants_logprobs[row]:
                    top = self._top(logprobs[row : row + 1], request.params.logprobs)[0]
                    scored = TokenLogprob(float(logprobs[row, token]), top)
                if self._advance(request, token, ends, scored):
                    ended.append(row)
            except Exception:  # this sequence only: the others in the batch go on
                logger.exception("sampling failed")
                self._send(request, Event(request.index, error="internal"))
                ended.append(row)
        for row in reversed(ended):
            self._leave(row)

    def _sample(self, request: GenerationRequest, logits: torch.Tensor) -> tuple[int, bool]:
        """The row's next token, and whether it ends the sequence."""
        params = request.params
        previous = None
        if params.repetition_penalty != 1.0:
            previous = torch.tensor([request.prompt_ids + request.generated], device=self.device)
        token, ends = self.decode_step(logits, params, request.generator, previous)
        return int(token), bool(ends)

    def _advance(
        self, request: GenerationRequest, token: int, ends: bool, scored: TokenLogprob | None
    ) -> bool:
        """Record ``token`` for ``request`` and tell it; True when the sequence has ended."""
        if ends:  # the end of text: not part of the completion
            self._finish(request, "stop", request.text.flush())
            return True
        request.generated.append(token)
        self.generated_tokens += 1
        text = request.text.push(token)
        if request.text.stopped:
            self._finish(request, "stop", text, token, scored)
            return True
        if len(request.generated) >= request.params.max_tokens:
            self._finish(request, "length", text + request.text.flush(), token, scored)
            return True
        request.next_input = token
        self._send(request, Event(request.index, text=text, token_id=token, logprob=scored))
        return False

    def _finish(self, request, reason: str, text: str, token=None, scored=None) -> None:
        self.finished_sequences += 1
        event = Event(request.index, text=text, token_id=token, logprob=scored, finish_reason=reason)
        event.completion_tokens = len(request.generated)
        self._send(request, event)

    @staticmethod
    def _log_softmax(logits: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits.float(), dim=-1)

    @staticmethod
    def _top(logprobs: torch.Tensor, k: int) -> list[list[tuple[int, float]]]:
        """The k most likely (token id, log P) of each row of ``logprobs`` (N, V)."""
        if k == 0:
            return [[] for _ in range(logprobs.size(0))]
        values, ids = torch.topk(logprobs, k, dim=-1)
        return [list(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]

    @staticmethod
    def _send(request: GenerationRequest, event: Event) -> None:
        try:
            request.deliver(event)
        except Exception:  # the request's event loop is gone (shutdown): nobody to tell
            logger.debug("could not deliver an event", exc_info=True)
