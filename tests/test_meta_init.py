"""Meta-device initialisation under FSDP2 on 2 gloo processes: each process holds only its shards,
and they are the ordinary CPU build's weights with the same seed, bit for bit (so the init's
statistics are the model's own N(0, 0.02) and a seeded run is reproducible)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch.multiprocessing as mp

from gptkit import GPT, GPTConfig
from gptkit.testing.processes import free_port, torchrun_environment
from gptkit.train.config import TrainConfig
from gptkit.train.distributed import meta_init
from gptkit.train.distributed.meta_init import dim0_rows

# Uneven on purpose: 37 rows of the embedding do not split evenly over 2 processes.
CONFIG = GPTConfig(vocab_size=37, context_length=16, n_layer=2, n_head=2, d_model=8)


def sharded_then_gathered(
    rank: int, world_size: int, port: int, config: GPTConfig, offload: bool, init: str | None, results
):
    """New weights of ``config``, or pre-training's build of ``init``'s weights (a model folder)."""
    from gptkit.train.distributed.meta_init import build_sharded
    from gptkit.train.distributed.processes import (
        full_model_state_dict,
        init_distributed,
        shutdown_distributed,
    )
    from gptkit.train.pretrain import build_wrapped
    from gptkit.train.run import ModelShape

    torchrun_environment(rank, world_size, port)
    torch.set_num_threads(1)
    ctx = init_distributed("cpu")
    try:
        torch.manual_seed(0)
        train = TrainConfig(max_steps=1, fsdp=True, fsdp_offload=offload)
        if init is None:
            model, wrapped = build_sharded(lambda: GPT(config), ctx, train)
        else:
            # The ordinary way loads the whole model in every process first: here it must not run.
            whole = AssertionError("the whole model was loaded")
            with mock.patch.object(GPT, "from_pretrained", side_effect=whole):
                model, wrapped = build_wrapped(ModelShape(init=init), config.vocab_size, ctx, train)
        next_draws = torch.rand(4)  # the generator left where the ordinary build leaves it
        held = sum(p.to_local().numel() for p in model.parameters())
        state = full_model_state_dict(wrapped, ctx)
        buffers = {name: b.clone() for name, b in model.named_buffers()}
        results[rank] = {
            "held": held, "state": dict(state) if rank == 0 else None, "buffers": buffers, "next": next_draws
        }  # fmt: skip
    finally:
        shutdown_distributed()


def run_two_processes(config: GPTConfig, offload: bool = False, init: str | None = None) -> dict:
    with mp.Manager() as manager:
        results = manager.dict()
        args = (2, free_port(), config, offload, init, results)
        mp.spawn(sharded_then_gathered, args=args, nprocs=2, join=True)
        return dict(results)


def test_dim0_rows_are_fsdp2s_chunks():
    for rows, world_size in [(5, 2), (37, 2), (1, 2), (10, 4), (3, 8)]:
        full = torch.arange(rows)
        chunks = full.chunk(world_size)
        for rank in range(world_size):
            start, stop = dim0_rows(rows, rank, world_size)
            expected = chunks[rank].tolist() if rank < len(chunks) else []
            assert full[start:stop].tolist() == expected, (rows, world_size, rank)


@pytest.mark.parametrize("shape", [(37, 8), (101, 3), (64, 16), (41, 2), (5, 1000)])
@pytest.mark.parametrize("init", ["normal", "uniform", "tensor_normal"])
def test_a_parameter_filled_block_by_block_is_the_whole_calls_values(monkeypatch, shape, init):
    """Each rank's rows, made a few rows at a time, are the rows of one whole call, and the generator
    ends where the whole call leaves it: ATen draws one value an element, in order, and turns each
    aligned 16 into normals (a size not divisible by 16 draws its last 16 again)."""
    monkeypatch.setattr(meta_init, "BLOCK_BYTES", 64)  # blocks of a few rows, the last one uneven
    func, args = {
        "normal": (torch.nn.init.normal_, (0.0, 0.02)),
        "uniform": (torch.nn.init.uniform_, (-0.5, 0.5)),
        "tensor_normal": (torch.Tensor.normal_, (1.0, 3.0)),
    }[init]
    torch.manual_seed(7)
    call = meta_init._InitCall(func, args, {}, torch.get_rng_state())
    whole = torch.empty(shape)
    func(whole, *args)
    after = torch.rand(3)
    blocks = call.blocks(torch.Size(shape), torch.float32)
    assert blocks is not None and len(blocks) > 1  # the test reaches the block-wise path
    scratch = meta_init._Scratch()
    for rank in range(3):
        start, stop = dim0_rows(shape[0], rank, 3)
        out = torch.full((stop - start, *shape[1:]), float("nan"))
        call.fill(torch.Size(shape), torch.float32, scratch, (start, stop), out)
        assert torch.equal(out, whole[start:stop])
        assert torch.equal(torch.rand(3), after)
    assert scratch.buffer.numel() <= call.largest_block(torch.Size(shape), torch.float32) < whole.numel() * 4


@pytest.mark.slow
@pytest.mark.parametrize("position_encoding", ["learned", "sinusoidal"])
def test_meta_init_gives_each_process_its_shards_of_the_ordinary_init(position_encoding):
    config = GPTConfig(**{**CONFIG.to_dict(), "position_encoding": position_encoding})
    got = run_two_processes(config, offload=position_encoding == "sinusoidal")
    torch.manual_seed(0)
    ordinary = GPT(config)
    expected = ordinary.state_dict()
    next_draws = torch.rand(4)
    state = got[0]["state"]
    assert state.keys() == expected.keys()
    for name in expected:
        assert torch.equal(state[name], expected[name]), name
    # Each process held its half (the embedding's 37 rows split 19 + 18), never the whole model.
    total = sum(p.numel() for p in ordinary.parameters())
    assert got[0]["held"] + got[1]["held"] == total and max(got[0]["held"], got[1]["held"]) < 0.6 * total
    assert torch.equal(got[0]["next"], next_draws) and torch.equal(got[1]["next"], next_draws)
    for rank in (0, 1):  # the computed buffers are made again, not left as to_empty's memory
        for name, buffer in ordinary.named_buffers():
            assert torch.equal(got[rank]["buffers"][name], buffer), name


@pytest.mark.slow
def test_meta_init_statistics_are_the_models_init_and_reproducible():
    """Against the paper's init rather than the code's: N(0, 0.02) for the matrices, N(0, 0.02/√(2·n_layer))
    for GPT-2's residual projections, LayerNorm 1 and 0, biases 0; two seeded runs alike."""
    config = GPTConfig(
        vocab_size=512, context_length=64, n_layer=2, n_head=4, d_model=64, scale_residual_init=True
    )
    first, second = run_two_processes(config)[0]["state"], run_two_processes(config)[0]["state"]
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert first["wte.weight"].std().item() == pytest.approx(0.02, rel=0.05)
    assert first["wte.weight"].mean().item() == pytest.approx(0.0, abs=0.02 * 0.05)
    residual = torch.cat([first[f"h.{i}.mlp.c_proj.weight"].flatten() for i in range(2)])
    assert residual.std().item() == pytest.approx(0.02 / (2 * 2) ** 0.5, rel=0.05)
    assert torch.equal(first["h.0.ln_1.weight"], torch.ones(64)) and not first["h.1.attn.c_attn.bias"].any()


@pytest.mark.slow
def test_loaded_weights_are_sharded_from_the_file(tmp_path):
    """--init under FSDP2: each process reads the file's tensors one at a time and keeps its rows."""
    torch.manual_seed(3)
    saved = GPT(CONFIG)
    saved.save_pretrained(tmp_path / "model")
    got = run_two_processes(CONFIG, init=str(tmp_path / "model"))
    state = got[0]["state"]
    assert state.keys() == saved.state_dict().keys()
    assert all(torch.equal(state[k], v) for k, v in saved.state_dict().items())
    assert max(got[0]["held"], got[1]["held"]) < 0.6 * sum(p.numel() for p in saved.parameters())
