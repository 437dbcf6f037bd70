"""`gptkit estimate`: the states against hand arithmetic, the fake step against the same step on real
tensors, what checkpointing and sharding change, the largest batch, the command."""

from __future__ import annotations

import json
import math
import sys
import tempfile

import pytest
import torch
import torch.nn.functional as F
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from gptkit.cli import main
from gptkit.config import GPTConfig
from gptkit.model import GPT
from gptkit.train.config import TrainConfig
from gptkit.train.finetune.tasks import FinetuneConfig, LoRAConfig
from gptkit.train.loop import Trainer
from gptkit.train.memory.cuda_autocast import cuda_autocast_rules
from gptkit.train.memory.estimate import (
    EstimateOptions,
    FinetuneEstimateConfig,
    PretrainEstimateConfig,
    estimate,
    estimate_finetune,
    estimate_pretrain,
    model_config,
    parse_size,
    pretrain_simulation,
)
from gptkit.train.memory.simulation import build_trainer, simulate, simulated_ranks
from gptkit.train.memory.torch_internals import fake_tensor_mode
from gptkit.train.run import ModelShape, build_model, sequence_length

# 2 layers, d 32, 4 heads, vocabulary 512, context 64 (the "tiny" preset's, with 4 heads).
D, LAYERS, VOCAB, CONTEXT = 32, 2, 512, 64
SHAPE = ModelShape(preset="tiny", n_head=4)


def parameter_shapes() -> list[tuple[int, ...]]:
    """Every parameter of a post-LN GPT of the tiny shape, written out from the paper's network."""
    block = [(3 * D, D), (3 * D,), (D, D), (D,), (4 * D, D), (4 * D,), (D, 4 * D), (D,)]
    block += [(D,)] * 4  # the two LayerNorms' gains and biases
    return [(VOCAB, D), (CONTEXT, D)] + block * LAYERS


def pretrain(devices: int = 1, batch: int = 4, target: str = "gpu", **train) -> PretrainEstimateConfig:
    training = TrainConfig(batch_size=batch, precision="fp32", **train)
    return PretrainEstimateConfig(SHAPE, training, EstimateOptions(devices=devices, target=target))


def test_sizes_read_as_gpu_memory_is_sold():
    assert parse_size("24GB") == parse_size("24GiB") == parse_size("24g") == 24 * 2**30
    assert parse_size("512MB") == 512 * 2**20 and parse_size("1000") == 1000
    with pytest.raises(ValueError, match=r"memory: expected a size such as 24GB.*'lots'"):
        parse_size("lots")
    with pytest.raises(ValueError, match=r"devices.*at least 1"):
        EstimateOptions(devices=0)


def test_fsdp_over_one_device_keeps_what_it_offloads_on_the_host():
    """One process shards over a group of itself; with --fsdp-offload AdamW's two fp32 moments
    of every parameter are the host's, not the device's."""
    on_device = estimate_pretrain(pretrain(fsdp=True))
    offloaded = estimate_pretrain(pretrain(fsdp=True, fsdp_offload=True))
    parameters = sum(p.numel() for p in GPT(model_config(SHAPE)).parameters())
    assert on_device.states["optimizer_state"] >= 8 * parameters and on_device.host_bytes == 0
    assert offloaded.host["optimizer_state"] >= 8 * parameters
    assert offloaded.peak_bytes <= on_device.peak_bytes - 8 * parameters


def test_published_shapes_are_known_without_downloading():
    assert model_config(ModelShape(init="gpt2-xl")) == GPTConfig.from_preset("gpt2-xl")
    assert model_config(ModelShape(init="openai-gpt")) == GPTConfig.from_preset("gpt1")
    with pytest.raises(ValueError, match=r"n_layer.*loaded weights keep their shape"):
        model_config(ModelShape(init="gpt2", n_layer=3))
    with pytest.raises(ValueError, match=r"knows openai-gpt, gpt2.*give its shape"):
        model_config(ModelShape(init="someone/model"))


def test_a_longer_context_than_the_loaded_model_is_refused_by_the_estimate_and_the_run(tmp_path):
    """One rule for both: loaded weights keep their shape, a shorter context is allowed, a longer
    one (more positions than the model has rows of W_p) is not."""
    GPT(GPTConfig.from_preset("tiny")).save_pretrained(tmp_path)
    shorter, longer = (
        ModelShape(init=str(tmp_path), context_length=32),
        ModelShape(init=str(tmp_path), context_length=65),
    )
    assert model_config(shorter).context_length == CONTEXT  # the model's; runs train on 32 of it
    assert build_model(shorter, VOCAB).config.context_length == CONTEXT
    assert sequence_length(shorter, model_config(shorter)) == 32
    with pytest.raises(ValueError, match=r"context_length.*65 differs from the loaded model's 64"):
        model_config(longer)
    with pytest.raises(ValueError, match=r"context_length.*65 differs from the loaded model's 64"):
        build_model(longer, VOCAB)


def test_one_device_states_equal_hand_arithmetic():
    """fp32: 4 bytes a weight, its gradient 4, AdamW's two moments 8."""
    weights = sum(math.prod(shape) for shape in parameter_shapes())
    result = estimate_pretrain(pretrain())
    assert result.states == {
        "parameters": 4 * weights,
        "gradients": 4 * weights,
        "optimizer_state": 8 * weights,
    }
    assert result.by_category["parameters"] == 4 * weights
    assert result.peak_bytes == sum(result.by_category.values())


def test_fsdp_shards_each_parameter_along_its_first_dimension():
    """Rank 0's shard of every parameter: the first ceil(rows / 8) rows."""
    shard = sum(math.ceil(shape[0] / 8) * math.prod(shape[1:]) for shape in parameter_shapes())
    result = estimate_pretrain(pretrain(devices=8, batch=8, fsdp=True))
    assert result.states == {"parameters": 4 * shard, "gradients": 4 * shard, "optimizer_state": 8 * shard}


def test_ddp_adds_its_gradient_buckets_to_one_process():
    alone = estimate_pretrain(pretrain(batch=2))
    replicated = estimate_pretrain(pretrain(devices=8, batch=16))
    assert replicated.states == alone.states  # every rank holds everything
    assert replicated.peak_bytes == alone.peak_bytes + alone.states["gradients"]


def test_the_fake_step_is_the_real_step():
    """The same tracker over the same update on real tensors records the same peak (attention as
    this CPU runs it: with dropout, unfused)."""
    simulation = pretrain_simulation(pretrain(batch=4, target="cpu"))
    fake = simulate(simulation, 4)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as out_dir, simulated_ranks(1) as ctx:
        trainer = build_trainer(simulation, ctx, 4, out_dir)
        batch = simulation.make_batch(4)
        trainer.compute_gradients(batch)
        trainer.apply_gradients()
        tracker = MemTracker()
        tracker.track_external(trainer.model, *trainer.optimizers)
        with tracker:
            trainer.compute_gradients(batch)
            trainer.apply_gradients()
    (real,) = tracker.get_tracker_snapshot("peak").values()
    assert real["Total"] == fake.peak_bytes


def test_checkpointing_lowers_the_activations():
    peaks = {
        mode: estimate_pretrain(pretrain(batch=8, activation_checkpointing=mode)).by_category["activations"]
        for mode in ("none", "selective", "full")
    }
    assert peaks["none"] > peaks["selective"] > peaks["full"]


def test_the_largest_batch_fits_and_one_more_does_not():
    simulation = pretrain_simulation(pretrain(batch=1))
    one = simulate(simulation, 1)
    memory = int(one.peak_bytes * 3)  # room for a few sequences more
    result = estimate(simulation, memory)
    largest = result.max_batch_size
    usable = memory * 0.9
    assert largest > 1
    assert simulate(simulation, largest).peak_bytes <= usable < simulate(simulation, largest + 1).peak_bytes
    # A run whose own batch does not fit: the search goes below it, to the same answer.
    too_big = pretrain_simulation(pretrain(batch=largest + 3))
    assert estimate(too_big, memory).max_batch_size == largest


def test_lora_trains_only_its_adapters():
    """Rank 4 on c_attn only: A (4 × d) and B (3d × 4) per block, the three special tokens' rows,
    and the two-class head W_y (2 × d + 2); the rest is held but not trained."""
    finetune = FinetuneConfig(
        model=ModelShape(init="gpt2", n_layer=None, context_length=32),
        lora=LoRAConfig(rank=4, targets=["c_attn"]),
        training=TrainConfig(batch_size=2, precision="fp32"),
    )
    result = estimate_finetune(FinetuneEstimateConfig(finetune, EstimateOptions()))
    d = 768
    trained = 12 * (4 * d + 3 * d * 4) + 3 * d + (2 * d + 2)
    assert result.states["gradients"] == 4 * trained
    assert result.states["optimizer_state"] == 8 * trained


def finetune_activations(batch: int, choices: int | None = None, **task) -> int:
    finetune = FinetuneConfig(model=SHAPE, training=TrainConfig(batch_size=batch, precision="fp32"), **task)
    options = EstimateOptions(target="cpu")
    return estimate_finetune(FinetuneEstimateConfig(finetune, options, choices)).by_category["activations"]


def test_an_example_holds_one_sequence_per_answer_and_two_for_similarity():
    """The transformer runs every sequence of an example: 2 examples of 4 answers hold the activations
    of 8 one-sequence examples (the heads differ by a few hundred bytes), not those of 2."""
    one_each = {batch: finetune_activations(batch, task="classification") for batch in (2, 4, 8)}
    assert one_each[8] > 3 * one_each[2]
    assert finetune_activations(2, 4, task="multiple_choice") == pytest.approx(one_each[8], rel=0.01)
    assert finetune_activations(2, dataset="story_cloze") == pytest.approx(one_each[4], rel=0.01)  # 2 endings
    assert finetune_activations(2, dataset="race") == pytest.approx(one_each[8], rel=0.01)  # 4 options
    assert finetune_activations(2, task="similarity") == pytest.approx(one_each[4], rel=0.01)  # both orders


def test_multiple_choice_on_your_own_data_needs_its_answers_per_question(capsys):
    with pytest.raises(ValueError, match="--choices"):
        finetune_activations(2, task="multiple_choice")
    with pytest.raises(ValueError, match="--choices: applies to multiple-choice tasks"):
        finetune_activations(2, 4, task="classification")
    argv = ["estimate", "finetune", "--preset", "tiny", "--n-head", "4", "--task", "multiple_choice"]
    assert main([*argv, "--choices", "1", "--json"]) != 0
    assert "--choices" in capsys.readouterr().err
    assert main([*argv, "--choices", "3", "--precision", "fp32", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["peak_bytes"] > 0


def test_the_command_prints_json(capsys):
    argv = ["estimate", "pretrain", "--preset", "tiny", "--n-head", "4", "--batch-size", "4"]
    assert main([*argv, "--precision", "fp32", "--devices", "2", "--fsdp", "--memory", "1GB", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["devices"] == 2 and record["batch_size"] == 2
    assert set(record["by_category"]) == {
        "parameters",
        "gradients",
        "optimizer_state",
        "activations",
        "other",
    }
    assert record["peak_bytes"] == sum(record["by_category"].values())
    assert record["max_batch_size"] > 2
    assert main([*argv, "--precision", "fp32"]) == 0
    assert "peak" in capsys.readouterr().out


@pytest.mark.slow
def test_gpt2_xl_on_8_devices_with_fsdp():
    """1,557,611,200 weights; fp32 shards of an eighth each, AdamW's moments twice that."""
    config = PretrainEstimateConfig(
        ModelShape(preset="gpt2", n_layer=48, n_head=25, d_model=1600, context_length=1024),
        TrainConfig(batch_size=8, precision="fp32", fsdp=True),
        EstimateOptions(devices=8),
    )
    result = estimate_pretrain(config)
    assert result.by_category["parameters"] == pytest.approx(1.5576e9 * 4 / 8, rel=0.03)
    assert result.by_category["optimizer_state"] == pytest.approx(2 * 1.5576e9 * 4 / 8, rel=0.03)


class _OpDtypes(TorchDispatchMode):
    """The input dtypes of every operation on CPU tensors (CUDA's fake mirrors are not the step's)."""

    def __init__(self):
        super().__init__()
        self.seen: dict[str, set[tuple[torch.dtype, ...]]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tensors = [a for a in tree_flatten((args, kwargs or {}))[0] if isinstance(a, torch.Tensor)]
        if tensors and all(t.device.type == "cpu" for t in tensors):
            self.seen.setdefault(func.__name__, set()).add(tuple(t.dtype for t in tensors))
        return func(*args, **(kwargs or {}))


def test_gpu_target_follows_cuda_autocast(monkeypatch):
    """FSDP2's bf16 parameters make the residual stream bf16, and the simulated update's operations
    then take the dtypes CUDA autocast gives them (PyTorch's AMP documentation, "CUDA Ops that can
    autocast to float32 / float16"): LayerNorm in fp32, its input, weight and bias cast up (CPU
    autocast leaves it in bf16); the matrix products and attention in bf16."""
    recorder = _OpDtypes()
    compute_gradients = Trainer.compute_gradients

    def recorded(self, batch):
        with recorder:
            return compute_gradients(self, batch)

    monkeypatch.setattr(Trainer, "compute_gradients", recorded)
    shape = ModelShape(preset="gpt2", n_layer=2, n_head=4, d_model=D, context_length=CONTEXT)
    training = TrainConfig(batch_size=16, precision="bf16", fsdp=True)
    simulate(pretrain_simulation(PretrainEstimateConfig(shape, training, EstimateOptions(devices=8))), 2)
    seen = recorder.seen
    assert seen["native_layer_norm.default"] == {(torch.float32,) * 3}
    for product in ("addmm.default", "mm.default"):
        assert {dtype for dtypes in seen[product] for dtype in dtypes} == {torch.bfloat16}, product
    attention = [name for name in seen if name.startswith("_scaled_dot_product") and "backward" not in name]
    assert attention and all(seen[name] == {(torch.bfloat16,) * 3} for name in attention)


# PyTorch's AMP documentation, "CUDA Ops that can autocast to float32" and "... to float16" (the
# lower precision): a few of each, called with inputs of the other precision.
CUDA_FP32 = {
    "layer_norm": lambda x: F.layer_norm(x, (D,), x.new_ones(D), x.new_zeros(D)),
    "softmax": lambda x: F.softmax(x, -1),
    "log_softmax": lambda x: F.log_softmax(x, -1),
    "nll_loss": lambda x: F.nll_loss(x, torch.zeros(x.size(0), dtype=torch.long)),
    "exp": torch.exp,
}
CUDA_LOWER = {
    "linear": lambda x: F.linear(x, x),
    "mm": lambda x: x @ x.t(),
    "bmm": lambda x: torch.bmm(x[None], x[None]),
    "addmm": lambda x: torch.addmm(x, x, x),
    "scaled_dot_product_attention": lambda x: F.scaled_dot_product_attention(x[None], x[None], x[None]),
}


@pytest.mark.parametrize("lower", [torch.bfloat16, torch.float16])
def test_cuda_autocast_rules_on_cpu_tensors(lower):
    """Under the rules, CPU autocast gives each operation CUDA autocast's dtype; without them,
    CPU autocast's own (LayerNorm and softmax stay in the lower precision on a CPU)."""
    with fake_tensor_mode():
        low, full = torch.randn(D, D, dtype=lower), torch.randn(D, D)
        with torch.autocast("cpu", dtype=lower):
            cpu = {name: op(low).dtype for name, op in CUDA_FP32.items()}
        with cuda_autocast_rules(), torch.autocast("cpu", dtype=lower):
            for name, op in CUDA_FP32.items():
                assert op(low).dtype == torch.float32, name
            for name, op in CUDA_LOWER.items():
                assert op(full).dtype == lower, name
        with torch.autocast("cpu", dtype=lower):  # the CPU's own rules are back
            assert {name: op(low).dtype for name, op in CUDA_FP32.items()} == cpu
    assert cpu["layer_norm"] == cpu["softmax"] == lower


def test_offload_counts_the_states_on_the_host():
    """--fsdp-offload: rank 0's fp32 shards, their gradients and AdamW's two moments are on the host
    (the hand arithmetic of the sharding test), and the device no longer holds them."""
    shard = sum(math.ceil(shape[0] / 8) * math.prod(shape[1:]) for shape in parameter_shapes())
    kept = estimate_pretrain(pretrain(devices=8, batch=8, fsdp=True))
    offloaded = estimate_pretrain(pretrain(devices=8, batch=8, fsdp=True, fsdp_offload=True))
    assert kept.host_bytes == 0
    assert offloaded.host["parameters"] == 4 * shard and offloaded.host["gradients"] == 4 * shard
    assert offloaded.host["optimizer_state"] >= 8 * shard  # the moments, and the step's temporaries
    assert offloaded.by_category["parameters"] == offloaded.by_category["optimizer_state"] == 0
    assert offloaded.peak_bytes == sum(offloaded.by_category.values())
    assert offloaded.peak_bytes <= kept.peak_bytes - 4 * shard - 8 * shard


def test_compile_is_simulated_without_compiling():
    result = estimate_pretrain(pretrain(compile=True))
    assert result.peak_bytes == estimate_pretrain(pretrain()).peak_bytes
    assert any("--compile simulated without compiling" in note for note in result.notes)


def test_a_missing_private_torch_api_is_one_line(monkeypatch, capsys):
    """The trackers live in torch's private modules: a torch without one stops the estimate with one
    line that names the missing piece and the torch version."""
    monkeypatch.setitem(sys.modules, "torch.distributed._tools.mem_tracker", None)  # import fails
    argv = ["estimate", "pretrain", "--preset", "tiny", "--n-head", "4", "--batch-size", "2"]
    assert main([*argv, "--precision", "fp32"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "torch.distributed._tools.mem_tracker.MemTracker" in line and torch.__version__ in line
