"""fp16: the fused loss's gradients under fp16 autocast, dynamic loss scaling in the loop (an
overflow skips exactly its update and halves the scale, on every FSDP2 rank), its exact resume, the
command on this CPU, and fp16 weights for inference."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gptkit import GPT, GPTConfig
from gptkit.generation import generate
from gptkit.generation.text import load_for_generation
from gptkit.model import fused_next_token_loss
from gptkit.model.weights import read_state_dict, save_state_dict
from gptkit.train.loop import NonFiniteLossError
from gptkit.train.metrics_log import read_metrics
from gptkit.train.precision import LossScaler
from tests.test_train import alice_shards, loop_config, make_trainer


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


def scaled_gradients(loss_of, leaves, loss_scale: float) -> list[torch.Tensor]:
    """d loss / d leaves under fp16 autocast, the loss times ``loss_scale`` before backward (as a
    GradScaler has it) and the gradients divided by it after."""
    for leaf in leaves:
        leaf.grad = None
    with torch.autocast("cpu", dtype=torch.float16):
        loss = loss_of()
    (loss * loss_scale).backward()
    return [leaf.grad / loss_scale for leaf in leaves]


# 2¹⁶ is torch.amp.GradScaler's first scale (inf in fp16); 2⁸, one it may have halved down to.
@pytest.mark.parametrize("loss_scale", [2.0**16, 2.0**8])
def test_fused_loss_gradients_under_fp16_autocast_match_cross_entropys(loss_scale):
    """The fused output layer + loss against torch's unfused F.linear + F.cross_entropy, both under
    fp16 autocast with the loss scaled; and at the scale a run starts with, against fp32 at the
    points autocast rounds to fp16. A large vocabulary: at initialisation each softmax
    probability is about 1/8192, and a token that is no target gets only those (over the
    positions counted) as its gradient."""
    torch.manual_seed(0)
    vocab, positions, d = 8192, 256, 64
    hidden = torch.randn(positions + 1, d, requires_grad=True)
    weight = (torch.randn(vocab, d) * 0.02).requires_grad_()
    labels = torch.randint(0, vocab, (positions + 1,))
    no_target = torch.ones(vocab, dtype=torch.bool)
    no_target[labels[1:]] = False
    fused = scaled_gradients(
        lambda: fused_next_token_loss(hidden[None], weight, labels[None]), (hidden, weight), loss_scale
    )
    assert all(torch.isfinite(g).all() for g in fused)
    unfused = scaled_gradients(
        lambda: F.cross_entropy(F.linear(hidden[:-1], weight), labels[1:]), (hidden, weight), loss_scale
    )
    # Both round the same values to fp16 (a relative step of 5e-4), summed in other orders.
    assert relative_error(fused[0], unfused[0]) < 2e-4
    assert relative_error(fused[1], unfused[1]) < 2e-4
    # The reference: fp32 at the points autocast rounds to fp16 (the product's inputs and output).
    rounded_hidden = hidden.detach().half().float().requires_grad_()
    rounded_weight = weight.detach().half().float().requires_grad_()
    logits = rounded_hidden[:-1] @ rounded_weight.t()
    logits = logits + (logits.half().float() - logits).detach()  # rounded, its gradient not
    F.cross_entropy(logits, labels[1:]).backward()
    # The gradients of tokens that are no target: at the first scale both are within 1e-3 of it;
    # at a small one, the probabilities times the scale fall among fp16's subnormals in torch's
    # own path too, and the fused one is to be no worse.
    errors = [relative_error(g[1][no_target], rounded_weight.grad[no_target]) for g in (fused, unfused)]
    assert errors[0] < max(1e-3, 1.25 * errors[1])
    if loss_scale == 2.0**16:
        assert relative_error(fused[0], rounded_hidden.grad) < 1e-3
        assert relative_error(fused[1], rounded_weight.grad) < 1e-3
        assert errors[1] < 1e-3


# The loop: dynamic loss scaling ------------------------------------------------------------------

# fp16 on this CPU runs on a slow path, and says so once per Trainer; here that is expected.
pytestmark = pytest.mark.filterwarnings("ignore:--precision fp16 on hardware without native fp16")


@pytest.fixture(scope="module")
def shards(data_dir, small_tokenizer, tmp_path_factory) -> Path:
    return alice_shards(small_tokenizer, data_dir, tmp_path_factory.mktemp("shards"))


class Overflow:
    """A gradient hook on one parameter that makes its gradient inf during the given updates
    (1-based, as the metrics log counts them), as an fp16 overflow in the backward pass would: the
    loss stays finite."""

    def __init__(self, parameter: torch.nn.Parameter, at: set[int]):
        self.at, self.trainer = at, None
        parameter.register_hook(self.hook)

    def hook(self, grad: torch.Tensor) -> torch.Tensor:
        return grad * math.inf if self.trainer.step + 1 in self.at else grad


class Snapshots:
    """A batch source that keeps the model's weights as each update starts (the previous one's)."""

    def __init__(self, source, model: torch.nn.Module):
        self.source, self.model, self.weights = source, model, []

    def next_batch(self):
        self.weights.append({k: v.clone() for k, v in self.model.state_dict().items()})
        return self.source.next_batch()

    def state_dict(self):
        return self.source.state_dict()

    def load_state_dict(self, state):
        self.source.load_state_dict(state)


def fp16_trainer(shards, out, overflow_at=(), interrupt_at=None, **overrides):
    config = loop_config(**{"precision": "fp16", "eval_every": 0, **overrides})
    trainer, model = make_trainer(shards, out, config, interrupt_at=interrupt_at)
    Overflow(model.wte.weight, set(overflow_at)).trainer = trainer
    return trainer, model


def logged(out: Path, field: str) -> list:
    return [r[field] for r in read_metrics(out / "metrics.jsonl") if field in r]


def test_fp16_training_follows_fp32_and_logs_its_scale(shards, tmp_path):
    """fp16 autocast with loss scaling trains as fp32 does (the same batches, the losses within
    fp16's rounding), logging the scale and no skipped update."""
    torch.manual_seed(0)
    fewer_files = dict(max_steps=12, eval_every=0, checkpoint_every=None)  # a checkpoint draws loss.png
    fp32, _ = make_trainer(shards, tmp_path / "fp32", loop_config(**fewer_files))
    fp32.fit()
    fp16, _ = fp16_trainer(shards, tmp_path / "fp16", **fewer_files)
    fp16.fit()
    expected, got = logged(tmp_path / "fp32", "loss"), logged(tmp_path / "fp16", "loss")
    assert got == pytest.approx(expected, rel=1e-2) and got[-1] < got[0] - 0.25
    assert logged(tmp_path / "fp16", "loss_scale") == [2.0**16] * 12
    assert logged(tmp_path / "fp16", "skipped_updates") == [0] * 12
    assert "loss_scale" not in read_metrics(tmp_path / "fp32" / "metrics.jsonl")[0]
    run = json.loads((tmp_path / "fp16" / "run_config.json").read_text())["resolved"]
    assert run["precision"] == "fp16"


def test_a_forced_overflow_skips_exactly_that_update_and_halves_the_scale(shards, tmp_path):
    trainer, model = fp16_trainer(shards, tmp_path, overflow_at={3}, max_steps=5, checkpoint_every=None)
    trainer.data = snapshots = Snapshots(trainer.data, model)
    trainer.fit()  # on_nonfinite is "stop": an overflow is not a non-finite loss
    weights = [*snapshots.weights, model.state_dict()]  # before updates 1..5, after 5
    changed = [any(not torch.equal(a[k], b[k]) for k in a) for a, b in zip(weights, weights[1:])]
    assert changed == [True, True, False, True, True]
    assert logged(tmp_path, "loss_scale") == [2.0**16, 2.0**16, 2.0**15, 2.0**15, 2.0**15]
    assert logged(tmp_path, "skipped_updates") == [0, 0, 1, 1, 1]
    assert all(math.isfinite(loss) for loss in logged(tmp_path, "loss"))
    norms = logged(tmp_path, "grad_norm")  # the skipped update's is infinite: null in strict JSON
    assert norms[2] is None and all(math.isfinite(norm) for i, norm in enumerate(norms) if i != 2)
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} in metrics.jsonl"))
    # AdamW counted 4 updates: the skipped one moved no moment either.
    assert {int(s["step"]) for s in trainer.optimizers[0].state.values()} == {4}


@pytest.mark.parametrize("on_nonfinite", ["stop", "skip"])
def test_a_nonfinite_loss_under_fp16_is_on_nonfinites_and_leaves_the_scale(shards, tmp_path, on_nonfinite):
    """A NaN loss is no overflow of the scaled gradients: --on-nonfinite decides (stop, or skip and
    go on: the next update unscales afresh), and the scale stays."""
    trainer, model = fp16_trainer(
        shards, tmp_path, max_steps=4, on_nonfinite=on_nonfinite, checkpoint_every=None
    )

    def nan_loss(module, inputs, output):
        if trainer.step + 1 == 2:
            output.loss = output.loss * math.nan
        return output

    model.register_forward_hook(nan_loss)
    if on_nonfinite == "stop":
        with pytest.raises(NonFiniteLossError, match="step 2: loss is nan"):
            trainer.fit()
        assert trainer.loss_scaler.metrics() == {"loss_scale": 2.0**16, "skipped_updates": 0}
        return
    with pytest.warns(UserWarning, match="step 2: loss is nan.*skipping"):
        trainer.fit()
    assert logged(tmp_path, "loss_scale") == [2.0**16] * 4
    assert logged(tmp_path, "skipped_updates") == [0] * 4


def test_resume_restores_the_loss_scale_bit_for_bit(shards, tmp_path):
    """Stopped after update 4 and resumed in a fresh Trainer, the run ends on the uninterrupted
    run's weights and scaler state exactly. The scale is moved off its start by an overflow at
    update 2 and grows back every 3 clean updates (growth_interval=3, which only the checkpoint
    can tell the resumed Trainer)."""

    def scaler_every_3(trainer):
        trainer.loss_scaler.growth_interval = 3
        return trainer

    straight, straight_model = fp16_trainer(shards, tmp_path / "a", overflow_at={2})
    scaler_every_3(straight).fit()
    first, _ = fp16_trainer(shards, tmp_path / "b", overflow_at={2}, interrupt_at=5)
    with pytest.raises(KeyboardInterrupt, match="interrupted at step 4"):
        scaler_every_3(first).fit()
    assert first.loss_scaler.state_dict() != straight.loss_scaler.state_dict()
    torch.manual_seed(12345)  # a fresh process would not share the first run's RNG
    second, model = fp16_trainer(shards, tmp_path / "b")
    second.resume(second.latest_checkpoint(), read_state_dict)
    assert second.loss_scaler.state_dict() == first.loss_scaler.state_dict()
    second.fit()
    # 2¹⁶, halved at 2, doubled after 3, 4, 5 and again after 6, 7, 8.
    assert logged(tmp_path / "a", "loss_scale") == [2.0**16] + [2.0**15] * 3 + [2.0**16] * 3 + [2.0**17]
    assert logged(tmp_path / "b", "loss_scale") == logged(tmp_path / "a", "loss_scale")
    assert second.loss_scaler.state_dict() == straight.loss_scaler.state_dict()
    assert second.loss_scaler.state_dict()["skipped"] == 1
    expected, got = straight_model.state_dict(), model.state_dict()
    assert all(torch.equal(expected[k], got[k]) for k in expected)


@pytest.mark.parametrize(
    "state, message",
    [
        ({"scale": "big", "_growth_tracker": 0}, "the loss scale is 'big', expected a positive number"),
        ({"scale": -1.0, "_growth_tracker": 0}, "the loss scale is -1.0"),
        ({"scale": 2.0, "_growth_tracker": 1.5}, "the loss scale's growth counter is 1.5, expected a count"),
        ({"scale": 2.0, "_growth_tracker": 1}, "skipped updates is None, expected a count"),
    ],
)
def test_a_damaged_loss_scale_in_a_checkpoint_is_one_line_naming_it(state, message):
    scaler = LossScaler(torch.float16, torch.device("cpu"))
    with pytest.raises(ValueError, match=f"step-0000004: {message}"):
        scaler.load_state_dict(state, "step-0000004")


# Inference ---------------------------------------------------------------------------------------


def test_fp16_weights_load_and_decode_with_the_cache_as_they_compute(small_tokenizer, tmp_path):
    """--dtype fp16 loads the weights as float16 (on a CPU too: a storage format there, whose
    slow products the printed reason names), and cached decoding gives the logits of the whole
    sequence computed again in fp16, close to fp32's."""
    torch.manual_seed(0)
    reference = GPT(GPTConfig.from_preset("tiny", dropout=0.0)).eval()
    save_state_dict(reference.config, reference.state_dict(), tmp_path)
    for name in small_tokenizer.iterdir():
        shutil.copy(name, tmp_path)
    model, _ = load_for_generation(tmp_path, dtype="fp16", device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.float16}
    prompt = torch.randint(0, 512, (2, 5))
    ids = generate(model, prompt, 12, temperature=0)
    with torch.no_grad():
        again = model(ids).logits[:, prompt.size(1) - 1 : -1].float()
        exact = reference(ids).logits[:, prompt.size(1) - 1 : -1]
    assert torch.equal(again.argmax(-1), ids[:, prompt.size(1) :])  # each cached step's choice
    torch.testing.assert_close(again, exact, atol=2e-2, rtol=0)


# FSDP2: one rank's overflow is every rank's ---------------------------------------------------------


def step_sharded(rank: int, world_size: int, port: int, overflow_rank: int | None, results) -> None:
    """A parameter sharded over the ranks as FSDP2 shards it (a DTensor, Shard(0)), its gradient
    scaled as the loss scaler leaves it; ``overflow_rank``'s shard holds an inf. Each rank then
    unscales and steps; the result: (applied, the scale after, whether its shard moved)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        mesh = init_device_mesh("cpu", (world_size,))
        shard = torch.ones(2, 2)
        param = torch.nn.Parameter(DTensor.from_local(shard.clone(), mesh, [Shard(0)]))
        scaler = LossScaler(torch.float16, torch.device("cpu"))
        scale = scaler.scale(torch.ones(())).item()  # the first scale, as backward saw it
        grad = torch.full((2, 2), 0.5 * scale)
        if rank == overflow_rank:
            grad[0, 0] = math.inf
        param.grad = DTensor.from_local(grad, mesh, [Shard(0)])
        optimizer = torch.optim.SGD([param], lr=1.0)
        scaler.unscale([optimizer])
        applied = scaler.step([optimizer])
        results[rank] = (applied, scaler.metrics()["loss_scale"], not torch.equal(param.to_local(), shard))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_an_overflow_in_one_ranks_shard_skips_the_update_on_every_rank():
    import torch.multiprocessing as mp

    from gptkit.testing.processes import free_port

    outcomes = {}
    for overflow_rank in (None, 1):
        with mp.Manager() as manager:
            results = manager.dict()
            mp.spawn(step_sharded, args=(2, free_port(), overflow_rank, results), nprocs=2, join=True)
            outcomes[overflow_rank] = dict(results)
    assert outcomes[None] == {0: (True, 2.0**16, True), 1: (True, 2.0**16, True)}
    assert outcomes[1] == {0: (False, 2.0**15, False), 1: (False, 2.0**15, False)}


@pytest.mark.slow
def test_gptkit_pretrain_precision_fp16_trains_on_this_cpu(shards, tmp_path):
    """The command itself, 200 updates of a tiny model in fp16 on the CPU: it warns that fp16 is slow
    here, records fp16, and the loss falls as fp32's does (6.24 to 4.97 both, when this was written)."""
    import subprocess
    import sys

    command = [
        *(sys.executable, "-m", "gptkit", "pretrain", "--data", str(shards), "--out", str(tmp_path)),
        *("--preset", "tiny", "--context-length", "64", "--batch-size", "8", "--max-steps", "200"),
        *("--warmup-steps", "20", "--lr", "3e-3", "--log-every", "10", "--eval-every", "0"),
        *("--checkpoint-every", "100", "--precision", "fp16", "--no-progress"),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--precision fp16 on hardware without native fp16" in done.stderr
    losses = logged(tmp_path, "loss")
    assert len(losses) == 21 and sum(losses[-3:]) / 3 < losses[0] - 1.0
    assert logged(tmp_path, "skipped_updates")[-1] == 0
    assert json.loads((tmp_path / "run_config.json").read_text())["resolved"]["precision"] == "fp16"
