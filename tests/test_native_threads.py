"""gptkit.native's threads: the team is the size torch.set_num_threads says, in any thread; more
threads than cores still compute the step; one team at a time in a process (the server's engine
and embeddings batcher share a model)."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from gptkit import GPT, GPTConfig, generate, native
from gptkit.generation import SamplingParams
from gptkit.model import KVCache
from gptkit.model.layouts import Int8Linear, decoding_layout
from gptkit.serve.batcher import Batcher
from gptkit.serve.engine import Engine, GenerationRequest
from gptkit.tokenizer import Tokenizer

pytestmark = pytest.mark.skipif(not native.available(), reason="the native kernels are not used here")


def small_model() -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=211, context_length=48, n_layer=3, n_head=5, d_model=60, init_std=0.2)
    return GPT(config).eval()


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def decode_one_step(model: GPT) -> torch.Tensor:
    cache = KVCache(model.config, 2, 8, dtype=model.cache_dtype)
    with torch.no_grad():
        model(torch.tensor([[3, 4, 5], [6, 7, 8]]), cache=cache)
        calls = model.native_step.calls
        logits = model(torch.tensor([[9], [10]]), cache=cache).logits
    assert model.native_step.calls == calls + 1
    return logits


def test_the_kernels_follow_torch_set_num_threads(restore_threads):
    """The step, a product and a prompt's int8 product run on torch.get_num_threads() threads, also
    in a thread PyTorch never set up (a server's engine thread: OpenMP's own setting there is its
    default, the number of cores), and more threads than cores when asked."""
    model = decoding_layout(small_model())
    kernels = native.loaded()
    int8 = Int8Linear(torch.randn(40, 60))
    for threads in (1, 2, 3):
        torch.set_num_threads(threads)
        decode_one_step(model)
        assert kernels.last_team_size() == threads
        with torch.no_grad():
            model.lm_head(torch.randn(1, 60))
            assert kernels.last_team_size() == threads
            int8(torch.randn(9, 60))  # a prompt's rows
            assert kernels.last_team_size() == threads

    # A thread PyTorch never ran in: the kernels called first there, before any PyTorch operator
    # could set that thread's OpenMP count, which is OpenMP's default (the cores) until then.
    torch.set_num_threads(1)
    weight, x = torch.randn(40, 60), torch.randn(1, 60)
    packed = native.pack(weight)
    y, matrix = torch.empty(1, 40), native.matrix(packed, 40, 60)
    seen = []

    def engine_thread():
        kernels.product(matrix, native.FORMATS[torch.float32], x.data_ptr(), 1, y.data_ptr())
        seen.append(kernels.last_team_size())
        decode_one_step(model)
        seen.append(kernels.last_team_size())

    worker = threading.Thread(target=engine_thread)
    worker.start()
    worker.join()
    assert seen == [1, 1]
    torch.testing.assert_close(y, x @ weight.t())


@pytest.mark.parametrize("threads", [3, 4, 8])
def test_more_threads_than_cores_compute_the_same_step(threads, restore_threads):
    """Teams larger than the cores (the barrier then sleeps rather than spins): the blocks' numbers."""
    original = small_model()
    native_model = decoding_layout(copy.deepcopy(original))
    torch.set_num_threads(threads)
    cache = KVCache(original.config, 2, 8, dtype=torch.float32)
    with torch.no_grad():
        original(torch.tensor([[3, 4, 5], [6, 7, 8]]), cache=cache)
        expected = original(torch.tensor([[9], [10]]), cache=cache).logits
    for _ in range(20):
        torch.testing.assert_close(decode_one_step(native_model), expected, rtol=0, atol=1e-4)


def test_two_threads_decoding_at_once_get_what_each_gets_alone(restore_threads):
    """Two Python threads decoding through native kernels at the same time (one team at a time): the
    tokens each gets alone."""
    torch.set_num_threads(2)
    model = decoding_layout(small_model())
    prompts = [torch.tensor([[1, 2, 3]]), torch.tensor([[7, 8, 9, 10]])]
    alone = [generate(model, prompt, 24, temperature=0) for prompt in prompts]
    together: list = [None, None]

    def run(i):
        together[i] = generate(model, prompts[i], 24, temperature=0)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert all(torch.equal(a, b) for a, b in zip(alone, together))
    assert model.native_step.calls == 4 * 24  # every pass of the four decodes (prompt and steps) a native one


def test_the_servers_batchers_and_engine_hold_the_native_team(data_dir, monkeypatch):
    """A batcher's forward pass (embeddings, classification) and the engine's admissions and decoding
    steps run holding gptkit.native.TEAM: never two teams of threads at once on a model's cores."""
    held = []

    def run(items):
        held.append(native.TEAM._is_owned())
        return items

    batcher = Batcher(run, name="test", max_batch=4, max_queue=4, max_wait=0.0)
    assert batcher._run_alone([1, 2]) == [1, 2] and held == [True]

    tokenizer = Tokenizer.from_pretrained(data_dir / "gpt2_bpe")
    config = GPTConfig(vocab_size=len(tokenizer), context_length=32, n_layer=2, n_head=5, d_model=60)
    model = decoding_layout(GPT(config).eval())
    step = Engine._step

    def watched_step(self):
        held.append(native.TEAM._is_owned())
        return step(self)

    monkeypatch.setattr(Engine, "_step", watched_step)
    finished = threading.Event()
    engine = Engine(model, tokenizer, max_batch=2)
    engine.start()
    try:
        params = SamplingParams(max_tokens=3, temperature=0.0)
        events = []

        def deliver(event):
            events.append(event)
            if event.finish_reason or event.error:
                finished.set()

        engine.submit([GenerationRequest(0, tokenizer.encode("Hello"), params, deliver)])
        assert finished.wait(60)
    finally:
        engine.stop()
    assert len(held) > 1 and all(held)
    assert model.native_step.calls > 0
