"""Continuous batching: one thread owns the model and runs one loop of steps for every request.

Each turn of the loop:

1. sequences waiting in the (bounded) queue join while the runner has room for them (a row and,
   for the paged cache, the pages of their prompt and longest completion);
2. one step of the model (:mod:`gptkit.serve.runners`): every decoding sequence's next input and,
   within the step's token budget, the next chunk of each joining prompt; the sequences whose last
   pending token ran get logits;
3. each of those takes the library's decoding step (:class:`~gptkit.generation.sampling.DecodeStep`)
   with its own settings and random generator (greedy ones, the common case, all at once); the
   rows that finished (length, stop string, end of text, cancelled, out of time) leave;
4. the step's events go to each request's event loop in one hand-off.

A sequence reads exactly what it would read alone, whoever shares the step with it. The engine
times each phase of its loop (:class:`PhaseTimes`), exported on the server's ``/metrics``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from gptkit import native
from gptkit.generation.incremental import IncrementalText
from gptkit.generation.sampling import DecodeStep, SamplingParams
from gptkit.model import GPT
from gptkit.serve.runners import PagedRunner, SlotRunner, StepOutput
from gptkit.tokenizer import Tokenizer

logger = logging.getLogger("gptkit.serve")

# The phases of the loop the engine times (seconds, summed; /metrics' gptkit_engine_phase_seconds_total).
PHASES = ("admission", "prefill", "decode", "sampling", "detokenize", "handoff")


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
    """One sequence to decode: ``index`` is its choice number within its HTTP request. ``deliver``
    gets its events: on the engine's thread, or, with ``loop``, on that event loop (the step's
    events for one loop go in one hand-off)."""

    index: int
    prompt_ids: list[int]
    params: SamplingParams
    deliver: Callable[[Event], None]
    deadline: float | None = None  # the engine's clock() after which it ends with error "timeout"
    loop: asyncio.AbstractEventLoop | None = None
    cancelled: bool = False
    # The engine's state, from admission on.
    generated: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)  # tokens to run: the prompt's, then the last one
    length: int = 0  # the positions in the cache
    row: int = -1  # the runner's row
    text: IncrementalText | None = None
    generator: torch.Generator | None = None

    def cancel(self) -> None:
        """Stop decoding (the client went away); the engine frees its row at its next step."""
        self.cancelled = True


class PhaseTimes:
    """Seconds spent in each of the loop's phases (and the steps' tokens), read by /metrics."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.prefill_tokens = 0
        self.decode_tokens = 0

    @contextmanager
    def phase(self, name: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - started


class Engine:
    """Owns ``model`` and decodes every submitted sequence in one continuously batched loop.

    ``max_batch``: sequences decoded together; ``cache_pages``: the paged cache's pages (a model in
    a native layout; default: enough for ``max_batch`` sequences of the whole context);
    ``step_tokens``: the most prompt tokens a step runs beside the decoding ones."""

    def __init__(
        self,
        model: GPT,
        tokenizer: Tokenizer,
        max_batch: int = 16,
        max_queue: int = 64,
        clock: Callable[[], float] = time.monotonic,
        cache_pages: int | None = None,
        step_tokens: int = 256,
    ):
        """``clock`` is what the sequences' deadlines are read on (a test's clock need not wait)."""
        if max_batch < 1 or max_queue < 1 or step_tokens < 1:
            raise ValueError(
                f"max_batch, max_queue and step_tokens must be >= 1, got {max_batch}, {max_queue}, {step_tokens}"
            )
        self.model = model.eval()
        self.clock = clock
        self.tokenizer = tokenizer
        self.max_batch, self.max_queue, self.step_tokens = max_batch, max_queue, step_tokens
        self.device = next(model.parameters()).device
        self.decode_step = DecodeStep.for_tokenizer(model.config.total_vocab_size, tokenizer)
        if model.native_step is not None:
            pages = cache_pages or max_batch * -(-model.config.context_length // 16)
            self.runner = PagedRunner(
                model, pages, max_batch, self.decode_step.n_choosable or model.config.total_vocab_size
            )
        else:
            self.runner = SlotRunner(model, max_batch)
        self._waiting: deque[GenerationRequest] = deque()
        self._running: list[GenerationRequest] = []  # in the order they joined
        self._condition = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._outbox: dict[asyncio.AbstractEventLoop, list] = defaultdict(list)
        # Counters, read by /metrics.
        self.times = PhaseTimes()
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
            if not self.runner.ever_fits(request):
                raise ValueError(
                    f"a prompt of {len(request.prompt_ids)} tokens and max_tokens={request.params.max_tokens} "
                    "do not fit in this server's key/value cache (--cache-mib)"
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
                    with self.times.phase("admission"):
                        joining = self._take_waiting()
                try:
                    # One team of threads at a time on the model's cores: not beside a batcher's
                    # forward pass (gptkit.serve.batcher holds the same lock).
                    with native.TEAM:
                        self._turn(joining)
                except Exception:  # a bug or out of memory: end what runs, keep serving
                    logger.exception("decoding step failed")
                    self._end_all(joining)
                self._flush()
        with self._condition:
            ended = list(self._waiting) + self._running
            self._waiting.clear()
            self._running = []
        for request in ended:
            self._send(request, Event(request.index, error="shutdown"))
        self._flush()

    def _turn(self, joining: list[GenerationRequest]) -> None:
        with self.times.phase("admission"):
            self._admit(joining)
            self._drop_ended()
        if self._running:
            self._step()

    def _end_all(self, joining: list[GenerationRequest]) -> None:
        """After a failed turn: every running sequence (and any that was joining) ends, its row freed."""
        ending = self._running + [request for request in joining if request not in self._running]
        for request in ending:
            self._send(request, Event(request.index, error="internal"))
            self.runner.release(request)
        self._running.clear()

    def _take_waiting(self) -> list[GenerationRequest]:
        """Waiting sequences that have room now, their rows reserved (the queue's order kept: the
        first that does not fit waits, and those behind it)."""
        joining: list[GenerationRequest] = []
        now = self.clock()
        while self._waiting:
            request = self._waiting[0]
            if request.cancelled:
                self.cancelled_sequences += 1
            elif request.deadline is not None and now > request.deadline:
                self._send(request, Event(request.index, error="timeout"))
            elif self.runner.reserve(request):
                joining.append(request)
            else:
                break
            self._waiting.popleft()
        return joining

    def _admit(self, joining: list[GenerationRequest]) -> None:
        failed = self.runner.start(joining)
        if failed:
            logger.error("the prompts of %d joining sequences could not be run", len(failed))
        for request in joining:
            if request in failed:
                self._send(request, Event(request.index, error="internal"))
                self.runner.release(request)
                continue
            self._running.append(request)
            self._start(request)

    def _start(self, request: GenerationRequest) -> None:
        """A sequence's decoding state, as it takes its row."""
        self.prompt_tokens += len(request.prompt_ids)
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
        for request in list(self._running):
            if request.cancelled:
                self.cancelled_sequences += 1
                self._leave(request)
            elif request.deadline is not None and now > request.deadline:
                self._send(request, Event(request.index, error="timeout"))
                self._leave(request)

    def _leave(self, request: GenerationRequest) -> None:
        self.runner.release(request)
        self._running.remove(request)

    def _schedule(self) -> list[tuple[GenerationRequest, int]]:
        """This step's work: one token of every decoding sequence, then prompt chunks in the order
        their sequences joined while the step's budget of prompt tokens lasts."""
        work = [(request, 1) for request in self._running if request.generated or len(request.pending) == 1]
        budget = self.step_tokens
        for request in self._running:
            if budget <= 0:
                break
            if not request.generated and len(request.pending) > 1:
                count = min(len(request.pending), budget)
                work.append((request, count))
                budget -= count
        return work

    def _step(self) -> None:
        """One step: the model, then a token for every sequence whose pending tokens all ran."""
        work = self._schedule()
        prompt_tokens = sum(count for request, count in work if not request.generated)
        with self.times.phase("prefill" if prompt_tokens else "decode"):
            output = self.runner.step(work)
        self.steps += 1
        self.times.prefill_tokens += prompt_tokens
        self.times.decode_tokens += sum(1 for request, _ in work if request.generated)
        if not output.rows:
            return
        with self.times.phase("sampling"):
            chosen = self._choose(output)
        ended = []
        for request, (token, ends, scored) in zip(output.rows, chosen):
            try:
                if token is None or self._advance(request, token, ends, scored):
                    ended.append(request)
            except Exception:  # this sequence only: the others in the batch go on
                logger.exception("a sequence failed after its step")
                self._send(request, Event(request.index, error="internal"))
                ended.append(request)
        for request in ended:
            self._leave(request)

    def _choose(self, output: StepOutput) -> list[tuple[int | None, bool, TokenLogprob | None]]:
        """(token, whether it ends the sequence, its log-probability if asked) of each row: greedy
        rows from the step's argmax (or one argmax for all), the others drawn row by row."""
        rows, logits = output.rows, self.decode_step.mask(output.logits)
        greedy = [r.params.greedy and r.params.repetition_penalty == 1.0 for r in rows]
        tokens: list[int | None] = [None] * len(rows)
        if any(greedy):
            best = output.argmax if output.argmax is not None else logits.argmax(-1).tolist()
            tokens = [b if g else None for b, g in zip(best, greedy)]
        for i, request in enumerate(rows):
            if tokens[i] is None:
                try:
                    tokens[i] = self._sample(request, logits[i : i + 1])
                except Exception:  # this sequence only
                    logger.exception("sampling failed")
                    self._send(request, Event(request.index, error="internal"))
        wanting = [i for i, r in enumerate(rows) if r.params.logprobs is not None and tokens[i] is not None]
        scored: list[TokenLogprob | None] = [None] * len(rows)
        if wanting:
            logprobs = self._log_softmax(logits[wanting])
            for j, i in enumerate(wanting):
                top = self._top(logprobs[j : j + 1], rows[i].params.logprobs)[0]
                scored[i] = TokenLogprob(float(logprobs[j, tokens[i]]), top)
        ends = set(self.decode_step.end_ids)
        return [(t, t in ends, s) for t, s in zip(tokens, scored)]

    def _sample(self, request: GenerationRequest, logits: torch.Tensor) -> int:
        """The row's next token, drawn with its settings and generator."""
        params = request.params
        previous = None
        if params.repetition_penalty != 1.0:
            previous = torch.tensor([request.prompt_ids + request.generated], device=self.device)
        token, _ = self.decode_step(logits, params, request.generator, previous)
        return int(token)

    def _advance(
        self, request: GenerationRequest, token: int, ends: bool, scored: TokenLogprob | None
    ) -> bool:
        """Record ``token`` for ``request`` and tell it; True when the sequence has ended."""
        if ends:  # the end of text: not part of the completion
            with self.times.phase("detokenize"):
                text = request.text.flush()
            self._finish(request, "stop", text)
            return True
        request.generated.append(token)
        self.generated_tokens += 1
        with self.times.phase("detokenize"):
            text = request.text.push(token)
        if request.text.stopped:
            self._finish(request, "stop", text, token, scored)
            return True
        if len(request.generated) >= request.params.max_tokens:
            with self.times.phase("detokenize"):
                text += request.text.flush()
            self._finish(request, "length", text, token, scored)
            return True
        request.pending.append(token)
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

    # Events ------------------------------------------------------------------------------------

    def _send(self, request: GenerationRequest, event: Event) -> None:
        """Tell ``request`` now (no event loop) or with the rest of this turn's events (its loop)."""
        if request.loop is not None:
            self._outbox[request.loop].append((request.deliver, event))
            return
        _deliver(request.deliver, event)

    def _flush(self) -> None:
        """This turn's events, one hand-off per event loop."""
        if not self._outbox:
            return
        with self.times.phase("handoff"):
            for loop, events in self._outbox.items():
                try:
                    loop.call_soon_threadsafe(_deliver_all, events)
                except RuntimeError:  # the loop is closed (shutdown): nobody to tell
                    logger.debug("could not hand events to a closed event loop")
            self._outbox.clear()


def _deliver(deliver: Callable[[Event], None], event: Event) -> None:
    try:
        deliver(event)
    except Exception:  # the request's reader is gone (shutdown): nobody to tell
        logger.debug("could not deliver an event", exc_info=True)


def _deliver_all(events: list) -> None:
    """On an event loop: one turn's events of its requests."""
    for deliver, event in events:
        _deliver(deliver, event)
