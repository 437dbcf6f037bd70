"""`gptkit estimate`: the states against hand arithmetic, the fake step against the same step on real
tensors, what checkpointing and sharding change, the largest batch, the command."""

from __future__ import annotations

import json
import math
import tempfile

import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker

from gptkit.cli import main
from gptkit.config import GPTConfig
from gptkit.train.config import TrainConfig
from gptkit.train.estimate import (
    EstimateOptions,
    FinetuneEstimateConfig,
    PretrainEstimateConfig,
    build_trainer,
    estimate,
    estimate_finetune,
    estimate_pretrain,
    model_config,
    parse_size,
    pretrain_simulation,
    simulate,
    simulated_ranks,
)
from gptkit.train.finetune import FinetuneConfig, LoRAConfig
from gptkit.train.run import ModelShape

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
    with pytest.raises(ValueError, match=r"--fsdp shards a run across devices: give --devices N"):
        estimate_pretrain(pretrain(fsdp=True))


def test_published_shapes_are_known_without_downloading():
    assert model_config(ModelShape(init="gpt2-xl")) == GPTConfig.from_preset("gpt2-xl")
    assert model_config(ModelShape(init="openai-gpt")) == GPTConfig.from_preset("gpt1")
    with pytest.raises(ValueError, match=r"n_layer.*loaded weights keep their shape"):
        model_config(ModelShape(init="gpt2", n_layer=3))
    with pytest.raises(ValueError, match=r"knows openai-gpt, gpt2.*give its shape"):
        model_config(ModelShape(init="someone/model"))


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
