"""Pre-training: data shards, the schedule, exact resume, non-finite losses, DDP against one process."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gptkit import GPT, GPTConfig
from gptkit.data.prepare import prepare
from gptkit.data.sampler import EpochSampler
from gptkit.data.shards import TokenShard
from gptkit.data.windows import WindowSampler
from gptkit.model.weights import read_state_dict, save_state_dict
from gptkit.tokenizer import Tokenizer
from gptkit.train.config import TrainConfig
from gptkit.train.loop import NonFiniteLossError, Trainer
from gptkit.train.metrics_log import read_metrics
from gptkit.train.optim import (
    Muon,
    block_matrices,
    build_optimizer,
    build_optimizers,
    learning_rate,
    orthogonalize,
)
from gptkit.train.pretrain import make_evaluator
from tests.conftest import SMALL_VOCAB

REPO = Path(__file__).resolve().parents[1]


def alice_shards(tokenizer: Path, data_dir: Path, out: Path) -> Path:
    """Alice in Wonderland prepared with ``tokenizer``, a tenth held out."""
    prepare(tokenizer, [data_dir / "gutenberg" / "pg11.txt"], out, val_fraction=0.1, show_progress=False)
    return out


@pytest.fixture(scope="module")
def shards(data_dir, small_tokenizer, tmp_path_factory) -> Path:
    """About 66k tokens of the small tokenizer's 512, prepared once for this module: the loop's tests
    need real text, not GPT-2's 50,257-way output layer."""
    return alice_shards(small_tokenizer, data_dir, tmp_path_factory.mktemp("shards"))


@pytest.fixture(scope="module")
def gpt2_shards(data_dir, tmp_path_factory) -> Path:
    """About 60k GPT-2 tokens: for a loss judged against GPT-2's vocabulary."""
    return alice_shards(data_dir / "gpt2_bpe", data_dir, tmp_path_factory.mktemp("gpt2_shards"))


def small_model(vocab: int = SMALL_VOCAB, dropout: float = 0.1) -> GPT:
    torch.manual_seed(0)
    return GPT(
        GPTConfig(vocab_size=vocab, context_length=32, n_layer=2, n_head=2, d_model=32, dropout=dropout)
    )


# Data -------------------------------------------------------------------------------------------


def test_prepare_writes_tokens_that_decode_to_the_corpus(shards, data_dir):
    meta = json.loads((shards / "meta.json").read_text())
    assert meta["dtype"] == "uint16" and meta["tokenizer_style"] == "bytelevel"
    train, val = TokenShard.open(shards, "train"), TokenShard.open(shards, "val")
    assert len(train.tokens) == meta["counts"]["train"] and len(val.tokens) == meta["counts"]["val"]
    assert 0.05 < len(val.tokens) / (len(train.tokens) + len(val.tokens)) < 0.15
    tokenizer = Tokenizer.from_pretrained(shards / "tokenizer")
    text = (data_dir / "gutenberg" / "pg11.txt").read_text(encoding="utf-8").replace("\r\n", "\n")
    decoded = tokenizer.decode(train.tokens[:2000].tolist())
    assert text.startswith(decoded[:-5])
    assert train.tokens[-1] == tokenizer.special_tokens["<|endoftext|>"]  # the document's end


def test_prepare_jsonl_and_bad_rows(small_tokenizer, tmp_path):
    good = tmp_path / "docs.jsonl"
    good.write_text("\n".join(json.dumps({"text": f"document number {i}."}) for i in range(20)) + "\n")
    meta = prepare(
        small_tokenizer,
        [good],
        tmp_path / "out",
        val_fraction=0.25,
        show_progress=False,
    )
    tokenizer = Tokenizer.from_pretrained(small_tokenizer)
    lengths = [len(tokenizer.encode(f"document number {i}.")) + 1 for i in range(20)]  # + <|endoftext|>
    held_out = sum(lengths[3::4])  # every 4th document (1 / val_fraction)
    assert meta["counts"] == {"train": sum(lengths) - held_out, "val": held_out}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl, line 2: no field 'text'"):
        prepare(small_tokenizer, [bad], tmp_path / "out2", show_progress=False)
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        prepare(small_tokenizer, [tmp_path / "missing.txt"], tmp_path / "out3", show_progress=False)


def test_a_failed_prepare_leaves_the_old_shards_and_a_foreign_tokenizer_is_refused(
    data_dir, small_tokenizer, tmp_path
):
    from gptkit.data.shards import check_shard_tokenizer

    good = tmp_path / "docs.jsonl"
    good.write_text("\n".join(json.dumps({"text": f"document number {i}."}) for i in range(20)) + "\n")
    out = tmp_path / "shards"
    meta = prepare(small_tokenizer, [good], out, val_fraction=0.25, show_progress=False)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n["not", "an", "object"]\n')
    with pytest.raises(ValueError, match=r"bad.jsonl, line 2"):  # a GPT-1 tokenizer this time
        prepare(data_dir / "gpt1_bpe", [bad], out, show_progress=False)
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before  # the old shards and their own tokenizer, byte for byte
    # No debris: the shards, and the empty lock file that one prepare at a time holds.
    assert sorted(p.name for p in tmp_path.iterdir()) == [".shards.lock", "bad.jsonl", "docs.jsonl", "shards"]
    assert (tmp_path / ".shards.lock").read_text() == ""
    check_shard_tokenizer(out, meta)  # they belong together
    # Another tokenizer put beside the shards by hand: training would misread every token.
    Tokenizer.from_pretrained(data_dir / "gpt1_bpe").save_pretrained(out / "tokenizer")
    with pytest.raises(ValueError, match="not the tokenizer these shards were made with"):
        check_shard_tokenizer(out, meta)


def test_prepare_refuses_what_is_not_text_and_reads_a_directorys_text_files(small_tokenizer, tmp_path):
    tokenizer = small_tokenizer
    binary = tmp_path / "program"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 4)
    with pytest.raises(ValueError, match=r"program: not a text file \(it holds NUL bytes\)"):
        prepare(tokenizer, [binary], tmp_path / "out", show_progress=False)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("café déjà vu, à bientôt. ".encode("latin-1") * 40)
    with pytest.raises(ValueError, match=r"latin1.txt: not UTF-8 text \(\d+ of its first 1,000 bytes"):
        prepare(tokenizer, [latin1], tmp_path / "out", show_progress=False)
    assert not (tmp_path / "out").exists()
    books = tmp_path / "books"
    (books / "more").mkdir(parents=True)
    (books / "a.txt").write_text("Alice was beginning to get very tired.\n" * 20)
    (books / "more" / "b.txt").write_bytes((b"Down the rabbit hole she went. " * 12 + b"\xff\n") * 3)
    (books / "notes.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00")  # not a text file: not read
    (books / "empty.txt").write_text("")
    with pytest.warns(UserWarning) as caught:
        meta = prepare(tokenizer, [books], tmp_path / "out", val_fraction=0.0, show_progress=False)
    messages = " | ".join(str(w.message) for w in caught)
    assert "empty.txt: empty file" in messages and "b.txt: 3 byte(s) that are not UTF-8" in messages
    assert [Path(f).name for f in meta["files"]] == ["a.txt", "empty.txt", "b.txt"]
    (tmp_path / "nothing").mkdir()
    with pytest.raises(
        FileNotFoundError,
        match="nothing is a directory with no .txt/.text/.md/.jsonl/.ndjson/.parquet/.arrow files",
    ):
        prepare(tokenizer, [tmp_path / "nothing"], tmp_path / "out2", show_progress=False)


def test_windows_are_drawn_without_replacement_and_shared_across_ranks(shards):
    shard = TokenShard.open(shards, "train")
    sampler = WindowSampler(shard, context_length=32, batch_size=8, seed=1)
    n_windows = shard.n_windows(32)
    n_batches = n_windows // 8
    seen = [tuple(w.tolist()) for _ in range(n_batches) for w in sampler.next_windows()]
    all_windows = {tuple(shard.window(i, 32).tolist()) for i in range(n_windows)}
    assert len(set(seen)) == len(seen) == n_batches * 8  # no window twice in an epoch
    assert set(seen) <= all_windows
    # Two ranks take the two halves of the same global batch.
    whole = WindowSampler(shard, 32, 8, seed=5).next_windows()
    halves = [WindowSampler(shard, 32, 8, seed=5, rank=r, world_size=2).next_windows() for r in (0, 1)]
    assert torch.equal(torch.cat(halves), whole)


def test_examples_grouped_by_length_still_make_a_seeded_epoch_and_resume_exactly():
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 90, (1000,), generator=generator).tolist()
    grouped = EpochSampler(1000, 16, seed=3, lengths=lengths)
    batches = [grouped.next_indices() for _ in range(grouped.steps_per_epoch)]
    seen = [i for batch in batches for i in batch]
    assert len(set(seen)) == len(seen) == 62 * 16  # each example at most once, remainder dropped

    def padded(batches):  # tokens once every batch is padded to its longest example
        return sum(len(b) * max(lengths[i] for i in b) for b in batches)

    random = EpochSampler(1000, 16, seed=3)
    random_batches = [random.next_indices() for _ in range(random.steps_per_epoch)]
    assert padded(batches) < 0.65 * padded(random_batches)  # uniform lengths: ~1.9x real tokens at random
    # Sorted within windows, but the batches' order is random: not in length order.
    longest = [max(lengths[i] for i in b) for b in batches]
    assert longest != sorted(longest)
    assert grouped.next_indices() != batches[0]  # a new epoch, a new order
    # The state is still two integers: a resumed sampler draws what an uninterrupted one draws.
    resumed = EpochSampler(1000, 16, seed=3, lengths=lengths)
    resumed.load_state_dict({"epoch": 0, "position": 16 * 10})
    assert resumed.next_indices() == batches[10]
    halves = [EpochSampler(1000, 16, 3, r, 2, lengths=lengths).next_indices() for r in (0, 1)]
    assert halves[0] + halves[1] == batches[0]
    with pytest.raises(ValueError, match="999 lengths for 1000 items"):
        EpochSampler(1000, 16, seed=3, lengths=lengths[:-1])


def test_schedule_and_weight_decay_groups():
    assert learning_rate(0, 1.0, 10, 110, "cosine") == pytest.approx(0.1)
    assert learning_rate(9, 1.0, 10, 110, "cosine") == pytest.approx(1.0)
    assert learning_rate(60, 1.0, 10, 110, "cosine") == pytest.approx(0.5)  # halfway down the cosine
    assert learning_rate(110, 1.0, 10, 110, "cosine") == pytest.approx(0.0, abs=1e-12)
    assert learning_rate(60, 1.0, 10, 110, "linear") == pytest.approx(0.5)
    # Warm-up, stable, decay: the full rate until the last 20% of the 100 updates after warm-up.
    assert learning_rate(89, 1.0, 10, 110, "wsd") == pytest.approx(1.0)
    assert learning_rate(100, 1.0, 10, 110, "wsd") == pytest.approx(0.5)
    assert learning_rate(109, 1.0, 10, 110, "wsd") == pytest.approx(0.05)
    model = small_model(vocab=100)
    decay, no_decay = build_optimizer(model, 1e-3, 0.01).param_groups
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest():
    model = small_model(vocab=100)
    muon, adamw = build_optimizers(model, "muon", 1e-3, 0.01)
    assert isinstance(muon, Muon) and isinstance(adamw, torch.optim.AdamW)
    in_muon = {id(p) for group in muon.param_groups for p in group["params"]}
    in_adamw = {id(p) for group in adamw.param_groups for p in group["params"]}
    names = {id(p): name for name, p in model.named_parameters()}
    # 2 blocks × (c_attn, attn.c_proj, c_fc, mlp.c_proj): the four weight matrices of each block.
    assert sorted(names[i] for i in in_muon) == sorted(
        f"h.{b}.{m}.weight"
        for b in range(2)
        for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    )
    assert not in_muon & in_adamw and in_muon | in_adamw == set(names)
    assert "wte.weight" in {names[i] for i in in_adamw}  # the tied embedding stays with AdamW
    assert len(block_matrices(model)) == 8
    _, slower = build_optimizers(model, "muon", 1e-3, 0.01, adamw_lr_scale=0.25)
    assert all(g["lr"] == pytest.approx(2.5e-4) and g["lr_scale"] == 0.25 for g in slower.param_groups)
    with pytest.raises(ValueError, match="adamw, muon"):
        build_optimizers(model, "sgd", 1e-3, 0.01)


def test_muon_matches_torchs_muon_and_orthogonalizes():
    """Ours in bf16 takes torch.optim.Muon's steps (the same rule); fp32, for CPUs without native
    bf16, gives the same directions more precisely: singular values near 1, singular vectors kept."""
    torch.manual_seed(0)
    shapes = [(48, 16), (16, 64)]
    ours = [torch.nn.Parameter(torch.randn(*s) * 0.1) for s in shapes]
    reference = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    mine = Muon(ours, lr=0.02, weight_decay=0.1, ns_dtype=torch.bfloat16)
    theirs = torch.optim.Muon(reference, lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    for _ in range(3):
        for a, b in zip(ours, reference):
            a.grad = torch.randn_like(a)
            b.grad = a.grad.clone()
        mine.step()
        theirs.step()
    for a, b in zip(ours, reference):
        assert torch.allclose(a, b, atol=2e-3), (a - b).abs().max()
    matrix = torch.randn(32, 80, dtype=torch.float64)
    u, _, vt = torch.linalg.svd(matrix, full_matrices=False)
    result = orthogonalize(matrix, dtype=torch.float64)
    core = u.t() @ result @ vt.t()  # diagonal where the singular vectors are kept
    assert torch.allclose(core, torch.diag(torch.diagonal(core)), atol=1e-6)
    assert 0.5 < torch.diagonal(core).min() and torch.diagonal(core).max() < 1.5
    with pytest.raises(ValueError, match="2-D matrices only"):
        Muon([torch.nn.Parameter(torch.zeros(3))], lr=0.1)


def test_fp32_training_orthogonalises_in_fp32_even_on_bf16_hardware(shards, tmp_path, monkeypatch):
    """Muon's Newton-Schulz iteration follows the training precision, not what the hardware offers:
    --precision fp32 on a CPU that claims native bf16 still iterates in fp32."""
    import gptkit.train.optim as optim
    from gptkit.hardware import bf16_native

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert bf16_native(torch.device("cpu")).native  # the premise: this CPU now looks bf16-native
    ran_in = []

    def recording(matrix, steps=5, dtype=torch.float32):
        result = orthogonalize(matrix, steps, dtype)
        ran_in.append(result.dtype)  # the dtype the iteration's own tensors had
        return result

    monkeypatch.setattr(optim, "orthogonalize", recording)
    trainer, _ = make_trainer(shards, tmp_path, loop_config(max_steps=2, optimizer="muon", eval_every=0))
    trainer.fit()
    assert len(ran_in) == 2 * 8  # two updates of the blocks' eight matrices
    assert set(ran_in) == {torch.float32}


# The loop ---------------------------------------------------------------------------------------


class InterruptAt:
    """A batch source that presses Ctrl-C when asked for batch number ``at``."""

    def __init__(self, source, at: int):
        self.source, self.at, self.calls = source, at, 0

    def next_batch(self):
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        return self.source.next_batch()

    def state_dict(self):
        return self.source.state_dict()

    def load_state_dict(self, state):
        self.source.load_state_dict(state)


def make_trainer(shards, out_dir, config, model=None, interrupt_at=None, **trainer_options):
    model = model or small_model()
    shard = TokenShard.open(shards, "train")
    data = WindowSampler(shard, 32, config.batch_size, config.seed)
    if interrupt_at:
        data = InterruptAt(data, interrupt_at)
    evaluate = make_evaluator(TokenShard.open(shards, "val"), 32, 8, 4, torch.device("cpu"))
    return Trainer(
        model,
        config,
        data,
        out_dir,
        save_model=lambda d, s: save_state_dict(model.config, s, d),
        evaluate=evaluate,
        **trainer_options,
    ), model


def loop_config(**overrides) -> TrainConfig:
    values = dict(
        max_steps=8,
        batch_size=8,
        micro_batch_size=4,
        lr=3e-3,
        warmup_steps=2,
        eval_every=4,
        checkpoint_every=3,
        log_every=1,
        progress=False,
        seed=7,
        precision="fp32",  # numerics compared to 1e-6 must not depend on the CPU's bf16 support
    )
    return TrainConfig(**{**values, **overrides})


@pytest.mark.slow
def test_loss_falls_and_files_are_written(gpt2_shards, tmp_path):
    model = small_model(vocab=50257)
    trainer, _ = make_trainer(gpt2_shards, tmp_path, loop_config(max_steps=30, eval_every=10), model=model)
    trainer.fit()
    records = read_metrics(tmp_path / "metrics.jsonl")
    losses = [r["loss"] for r in records if "loss" in r]
    assert losses[-1] < losses[0] - 1.0
    val = [r["val_loss"] for r in records if "val_loss" in r]
    assert len(val) == 3 and val[-1] < val[0] - 0.5 and val[-1] < math.log(50257) - 1.0  # below uniform
    assert (tmp_path / "loss.png").stat().st_size > 1000
    assert json.loads((tmp_path / "checkpoints" / "latest.json").read_text())["step"] == 30
    # MFU by hand: 6 FLOPs per weight of each matrix per token (the blocks' 12·d², the tied
    # embedding once, the positions) at the logged pace, over the matmul peak measured here.
    from gptkit.hardware import matmul_peak_flops

    d, blocks = 32, 2
    per_token = 6 * (blocks * 12 * d * d + 50257 * d + 32 * d)
    peak = matmul_peak_flops(torch.device("cpu"), torch.float32)  # cached: the value the run used
    for r in (r for r in records if "loss" in r):
        assert r["mfu"] == pytest.approx(r["tokens_per_s"] * per_token / peak, rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_interrupted_and_resumed_run_matches_uninterrupted(shards, tmp_path, optimizer):
    """Ctrl-C after step 5 saves a checkpoint; resuming gives the same losses, dropout included,
    and both optimizers' state (Muon's momentum beside AdamW's moments) comes back."""
    straight, _ = make_trainer(shards, tmp_path / "a", loop_config(optimizer=optimizer))
    straight.fit()
    expected = [r["loss"] for r in read_metrics(tmp_path / "a" / "metrics.jsonl") if "loss" in r]

    first, _ = make_trainer(shards, tmp_path / "b", loop_config(optimizer=optimizer), interrupt_at=6)
    with pytest.raises(KeyboardInterrupt, match=r"interrupted at step 5 \(SIGINT\); checkpoint saved"):
        first.fit()
    assert json.loads((tmp_path / "b" / "checkpoints" / "latest.json").read_text())["step"] == 5
    torch.manual_seed(12345)  # a fresh process would not share the first run's RNG
    second, _ = make_trainer(shards, tmp_path / "b", loop_config(optimizer=optimizer), model=small_model())
    second.resume(second.latest_checkpoint(), read_state_dict)
    second.fit()
    resumed = [r["loss"] for r in read_metrics(tmp_path / "b" / "metrics.jsonl") if "loss" in r]
    assert len(resumed) == len(expected) == 8
    assert resumed == pytest.approx(expected, abs=1e-6)


class NaNAfter(torch.nn.Module):
    """Wraps a GPT; its loss turns NaN from forward call ``at`` on."""

    def __init__(self, gpt, at):
        super().__init__()
        self.gpt, self.at, self.calls = gpt, at, 0

    def forward(self, **batch):
        out = self.gpt(**batch)
        self.calls += 1
        if self.calls >= self.at:
            out.loss = out.loss * float("nan")
        return out


def test_nonfinite_loss_stops_naming_the_step_and_keeps_the_good_checkpoint(shards, tmp_path):
    gpt = small_model()
    model = NaNAfter(gpt, at=2 * 4 + 1)  # 2 micro-batches a step: step 5 is the first bad one
    trainer, _ = make_trainer(shards, tmp_path, loop_config(checkpoint_every=2), model=model)
    trainer.save_model = lambda d, s: save_state_dict(
        gpt.config, {k.removeprefix("gpt."): v for k, v in s.items()}, d
    )
    with pytest.raises(NonFiniteLossError, match="step 5: loss is nan"):
        trainer.fit()
    latest = trainer.latest_checkpoint()
    assert latest.name == "step-0000004"
    assert all(torch.isfinite(t).all() for t in read_state_dict(latest).values())


def test_nonfinite_loss_can_be_skipped(shards, tmp_path):
    gpt = small_model()
    model = NaNAfter(gpt, at=2 * 6 + 1)
    trainer, _ = make_trainer(shards, tmp_path, loop_config(on_nonfinite="skip", eval_every=0), model=model)
    trainer.save_model = lambda d, s: save_state_dict(
        gpt.config, {k.removeprefix("gpt."): v for k, v in s.items()}, d
    )
    with pytest.warns(UserWarning, match="step 7: loss is nan.*skipping"):
        trainer.fit()
    assert trainer.step == 8
    assert all(torch.isfinite(p).all() for p in gpt.parameters())


# Command line and processes ---------------------------------------------------------------------


def run_pretrain(shards, out, *extra, nproc=1):
    args = [
        "--data",
        str(shards),
        "--out",
        str(out),
        "--preset",
        "tiny",
        "--context-length",
        "32",
        "--dropout",
        "0",
        "--batch-size",
        "8",
        "--micro-batch-size",
        "2",
        "--max-steps",
        "6",
        "--warmup-steps",
        "2",
        "--lr",
        "1e-3",
        "--log-every",
        "1",
        "--eval-every",
        "3",
        "--eval-windows",
        "8",
        "--checkpoint-every",
        "3",
        "--precision",
        "fp32",
        "--no-progress",
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if nproc == 1:
        cmd = [sys.executable, "-m", "gptkit", "pretrain", *args]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            "-m",
            "gptkit",
            "pretrain",
            *args,
        ]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return [r["loss"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r]


def assert_same_model(one: Path, two: Path) -> None:
    """The models two runs wrote are the same model, to fp32's rounding of one process's sums."""
    a, b = GPT.from_pretrained(one), GPT.from_pretrained(two)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_match_one_process(shards, tmp_path, strategy):
    """torchrun with 2 CPU processes (gloo; DDP with no_sync accumulation, or FSDP2) = 1 process,
    same global batch."""
    single = run_pretrain(shards, tmp_path / "one")
    double = run_pretrain(shards, tmp_path / "two", *(["--fsdp"] if strategy == "fsdp" else []), nproc=2)
    assert len(single) == len(double) == 6
    assert double == pytest.approx(single, abs=1e-5)
    assert_same_model(tmp_path / "one", tmp_path / "two")


@pytest.mark.slow
def test_cli_config_file_resume_and_outputs(shards, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("train:\n  weight_decay: 0.05\n  seed: 3\n  schedule: constant\n")
    out = tmp_path / "run"
    losses = run_pretrain(shards, out, "--config", str(config))
    resolved = json.loads((out / "run_config.json").read_text())
    assert resolved["train"]["weight_decay"] == 0.05 and resolved["train"]["seed"] == 3
    assert resolved["resolved"]["precision"] == "fp32" and resolved["resolved"]["max_steps"] == 6
    # --resume continues the run: with a constant rate (the schedule does not depend on the length),
    # 6 updates + 3 resumed ones equal 9 updates straight through.
    resumed = run_pretrain(shards, out, "--config", str(config), "--resume", "--max-steps", "9")
    straight = run_pretrain(shards, tmp_path / "straight", "--config", str(config), "--max-steps", "9")
    assert resumed[:6] == losses and len(resumed) == 9
    assert resumed == pytest.approx(straight, abs=1e-6)
    assert json.loads((out / "checkpoints" / "latest.json").read_text())["step"] == 9
    for name in ("config.json", "model.safetensors", "encoder.json", "loss.png"):
        assert (out / name).exists(), name
    assert GPT.from_pretrained(out).config.context_length == 32
    again = subprocess.run(
        [sys.executable, "-m", "gptkit", "pretrain", "--data", str(shards), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert again.returncode == 2 and "already holds a run: pass --resume" in again.stderr
    assert all(math.isfinite(x) for x in losses)
    assert np.isfinite(np.asarray(losses)).all()


def test_resume_skips_a_damaged_latest_checkpoint_for_the_newest_intact_one(shards, tmp_path):
    trainer, _ = make_trainer(shards, tmp_path, loop_config())  # checkpoints at 3, 6, 8; 2 kept
    trainer.fit()
    checkpoints = tmp_path / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("step-*")) == ["step-0000006", "step-0000008"]
    weights = checkpoints / "step-0000008" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit of a weight: the file still loads
    weights.write_bytes(bytes(data))
    again, _ = make_trainer(shards, tmp_path, loop_config(max_steps=10), model=small_model())
    with pytest.warns(UserWarning, match=r"step-0000008 \(model.safetensors does not match its checksum\)"):
        assert again.latest_checkpoint().name == "step-0000006"
    (checkpoints / "step-0000008" / "train_state.pt").unlink()
    with pytest.warns(UserWarning, match=r"step-0000008 \(no train_state.pt\); resuming from step-0000006"):
        again.resume(again.latest_checkpoint(), read_state_dict)
    assert again.step == 6
    # The pointer itself cut to nothing (a power loss before it reached the disk): the newest
    # intact checkpoint, with a warning naming the pointer.
    (checkpoints / "latest.json").write_text("")
    with pytest.warns(UserWarning, match=r"latest.json \(.*latest.json: not valid JSON: the file is empty\)"):
        assert again.latest_checkpoint().name == "step-0000006"


def test_a_full_disk_names_the_checkpoint_and_leaves_no_debris(shards, tmp_path):
    import errno

    trainer, model = make_trainer(shards, tmp_path, loop_config(max_steps=3, checkpoint_every=3))
    trainer.fit()  # step-3 is intact
    for _ in range(2):
        trainer._update()

    def full_disk(directory, state):
        (directory / "model.safetensors").write_bytes(b"\0" * 1000)  # half written, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device", str(directory / "model.safetensors"))

    trainer.step, trainer.save_model = 5, full_disk
    with pytest.raises(
        OSError, match=r"could not write checkpoint step-0000005 in .*checkpoints: No space"
    ) as e:
        trainer.save_checkpoint()
    assert e.value.errno == errno.ENOSPC and "MB are free. The previous checkpoint is intact" in str(e.value)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest.json", "step-0000003"]


@pytest.mark.slow
def test_a_full_disk_in_torchs_zip_writer_is_one_line_and_the_run_resumes_exactly(
    shards, tmp_path, monkeypatch
):
    """torch's zip writer reports a full disk as a RuntimeError, not an OSError: the half-written
    staging folder still goes, the error is one line (an OSError, which the CLI prints without a
    traceback) naming the step, the folder and the free space, and once there is room the run
    resumes from the previous checkpoint to the uninterrupted run's losses."""
    straight, _ = make_trainer(shards, tmp_path / "a", loop_config())
    straight.fit()
    expected = [r["loss"] for r in read_metrics(tmp_path / "a" / "metrics.jsonl") if "loss" in r]

    save = torch.save

    def disk_fills_at_step_6(obj, path, *args, **kwargs):
        if Path(path).parent.name == ".step-0000006.tmp":
            Path(path).write_bytes(b"PK\x03\x04" + b"\0" * 1000)  # the archive's start, then no room
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1088 vs 1024")
        return save(obj, path, *args, **kwargs)

    run = tmp_path / "b"
    first, _ = make_trainer(shards, run, loop_config())
    with monkeypatch.context() as patches:
        patches.setattr(torch, "save", disk_fills_at_step_6)
        with pytest.raises(OSError) as error:
            first.fit()
    message = str(error.value)
    assert message.startswith(
        f"could not write checkpoint step-0000006 in {run / 'checkpoints'}: RuntimeError: [enforce fail at "
        "inline_container.cc:672] . unexpected pos 1088 vs 1024; a checkpoint takes about "
    ), message
    free = re.search(
        r", ([\d,]+) MB are free\. The previous checkpoint is intact: free space, then --resume$", message
    )
    assert free and "\n" not in message
    assert (
        abs(int(free[1].replace(",", "")) - shutil.disk_usage(run).free / 1e6) < 1000
    )  # the free space here
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest.json", "step-0000003"]

    torch.manual_seed(12345)  # a fresh process would not share the first run's RNG
    second, _ = make_trainer(shards, run, loop_config(), model=small_model())
    second.resume(second.latest_checkpoint(), read_state_dict)
    second.fit()
    resumed = [r["loss"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r]
    assert len(resumed) == len(expected) == 8
    assert resumed == pytest.approx(expected, abs=1e-6)
    assert second.latest_checkpoint() == run / "checkpoints" / "step-0000008"


@pytest.mark.slow
def test_a_failed_first_checkpoint_says_there_is_none_to_resume_from(shards, tmp_path, monkeypatch):
    def no_room(obj, path, *args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    trainer, _ = make_trainer(shards, tmp_path, loop_config(max_steps=3, checkpoint_every=3))
    monkeypatch.setattr(torch, "save", no_room)
    with pytest.raises(
        OSError, match=r"step-0000003 .*MB are free\. No checkpoint was written yet: free space"
    ):
        trainer.fit()
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == []


def test_loss_png_is_drawn_at_each_checkpoint_and_never_twice_for_the_same_records(
    shards, tmp_path, monkeypatch
):
    import gptkit.train.metrics_log as metrics_log

    drawn = []  # the records each drawing of loss.png showed
    monkeypatch.setattr(metrics_log, "plot_metrics", lambda metrics, png: drawn.append(read_metrics(metrics)))
    trainer, _ = make_trainer(shards, tmp_path, loop_config())  # checkpoints at 3, 6 and 8 (the end)
    trainer.fit()
    assert [records[-1]["step"] for records in drawn] == [3, 6, 8]
    assert drawn[-1] == read_metrics(tmp_path / "metrics.jsonl")  # the whole run, drawn once at its end


def test_tensorboard_gets_the_same_numbers_as_metrics_jsonl(shards, tmp_path, monkeypatch):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    trainer, _ = make_trainer(shards, tmp_path, loop_config(log_to=["tensorboard"]))
    trainer.fit()
    records = read_metrics(tmp_path / "metrics.jsonl")
    events = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()  # TensorBoard's own reader, on the event files
    for name in ("loss", "lr", "grad_norm", "tokens_per_s", "val_loss"):
        expected = [(r["step"], r[name]) for r in records if name in r]
        got = [(e.step, e.value) for e in events.Scalars(name)]
        assert [s for s, _ in got] == [s for s, _ in expected] and len(expected) >= 2
        assert [v for _, v in got] == pytest.approx([v for _, v in expected], rel=1e-6)  # float32
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # not installed
    with pytest.raises(ImportError, match=r"pip install -e '\.\[tensorboard\]'"):
        make_trainer(shards, tmp_path / "again", loop_config(log_to=["tensorboard"]))


def test_a_torn_last_metrics_line_is_dropped_and_a_damaged_one_before_it_named(tmp_path):
    from gptkit.train.metrics_log import MetricsLogger
    from gptkit.train.rundir import RunDir

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.4}\n{"step": 3, "lo')  # power lost
    with pytest.warns(UserWarning, match=r"metrics.jsonl, line 3: an unfinished record"):
        assert [r["step"] for r in read_metrics(path)] == [1, 2]
    with pytest.warns(UserWarning):
        MetricsLogger(RunDir(tmp_path)).truncate(2)  # what --resume does: the file is whole again
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    path.write_text('{"step": 1}\n{"step": 2, oops}\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl, line 2: not a JSON record"):
        read_metrics(path)


@pytest.mark.slow
def test_a_second_writer_is_refused_and_a_dead_writers_lock_is_taken_over(shards, tmp_path):
    from gptkit.train.rundir import RunDir

    out = tmp_path / "run"
    command = [sys.executable, "-m", "gptkit", "pretrain", "--data", str(shards), "--out", str(out)]
    command += ["--preset", "tiny", "--context-length", "32", "--batch-size", "4", "--max-steps", "3"]
    command += ["--eval-every", "0", "--no-progress"]
    with RunDir(out).writer_lock("finetune"):  # this process writes the run
        second = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert second.returncode == 2
    assert f"is being written by `gptkit finetune` (pid {os.getpid()}" in second.stderr
    assert not (out / "checkpoints").exists()  # the second writer wrote nothing
    # A writer killed while holding the lock leaves its record; the OS released the lock itself.
    record = {"pid": 999999, "host": "elsewhere", "command": "pretrain", "since": "yesterday"}
    (out / ".lock").write_text(json.dumps(record))
    taken = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert "taking over the lock left by `gptkit pretrain` (pid 999999 on elsewhere" in taken.stderr
    assert (out / ".lock").read_text() == ""  # released cleanly: nothing for the next writer to report


# SIGTERM (exit 143) is stopped at points hypothesis draws in tests/test_faults.py; Ctrl-C here.
@pytest.mark.slow
@pytest.mark.parametrize("signum", ["SIGINT"])
def test_a_signal_mid_run_then_resume_gives_the_uninterrupted_weights_bit_for_bit(shards, tmp_path, signum):
    """A signal lands wherever the run is (mid-update, most often): the update in flight finishes,
    a checkpoint is saved, the process exits 128 + the signal's number, and --resume ends on the same
    weights as a run never stopped."""
    import signal
    import time

    from safetensors.torch import load_file

    def command(out: Path, *extra: str) -> list[str]:
        return [
            *(sys.executable, "-m", "gptkit", "pretrain", "--data", str(shards), "--out", str(out)),
            *("--preset", "tiny", "--context-length", "32", "--batch-size", "8", "--micro-batch-size", "4"),
            *("--max-steps", "36", "--warmup-steps", "2", "--checkpoint-every", "15", "--eval-every", "0"),
            *("--log-every", "1", "--precision", "fp32", "--no-progress", *extra),
        ]

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    straight = subprocess.run(
        command(tmp_path / "straight"), cwd=REPO, env=env, capture_output=True, timeout=300
    )
    assert straight.returncode == 0, straight.stderr[-2000:]
    out = tmp_path / "stopped"
    process = subprocess.Popen(command(out), cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and len(read_metrics(metrics)) >= 6):
        time.sleep(0.05)
    process.send_signal(getattr(signal, signum))
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + getattr(signal, signum), stderr[-2000:]
    stopped_at = json.loads((out / "checkpoints" / "latest.json").read_text())["step"]
    assert 6 <= stopped_at < 36 and f"interrupted at step {stopped_at} ({signum})" in stderr
    resumed = subprocess.run(command(out, "--resume"), cwd=REPO, env=env, capture_output=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    expected = load_file(tmp_path / "straight" / "model.safetensors")
    got = load_file(out / "model.safetensors")
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[k], got[k]) for k in expected)


# Configs check themselves; time budgets ----------------------------------------------------------


@pytest.mark.parametrize(
    "values, message",
    [
        (dict(max_steps=0), r"max_steps \(--max-steps\): must be a positive number of updates, got 0"),
        (dict(checkpoint_every=0), r"checkpoint_every .*must be a positive number of updates, got 0"),
        (dict(keep_checkpoints=0), r"keep_checkpoints .*must be positive, got 0"),
        (dict(eval_every=-1), r"eval_every .*must be >= 0"),
        (dict(batch_size=10, micro_batch_size=4), r"4 does not divide the batch of 10: .* such as 2"),
        (dict(max_steps=10, warmup_steps=20), r"20 warm-up updates are more than the 10 of training"),
        (
            dict(precision="fp8"),
            r"precision .*must be one of auto, fp32, bf16, fp16, float32, bfloat16, float16, got 'fp8'",
        ),
        (dict(lr=0), r"lr .*must be > 0"),
        (dict(beta2=1.0), r"beta2 .*must be in \[0, 1\)"),
        (dict(time_budget="5 minutes"), r"expected a duration such as 90s, 5m or 1h30m"),
        (dict(optimizer="sgd"), r"optimizer .*must be one of adamw, muon"),
        (dict(optimizer="muon", fsdp=True), r"muon does not run with --fsdp .*use DDP"),
        (dict(adamw_lr_scale=0), r"adamw_lr_scale .*must be > 0"),
        (dict(schedule="step"), r"schedule .*must be one of cosine, linear, wsd, constant"),
    ],
)
def test_train_config_rejects_bad_values_saying_what_to_change(values, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**values)


def test_default_warmup_is_the_papers_2000_capped_at_a_tenth_of_training():
    assert TrainConfig().warmup_for(100_000) == 2000
    assert TrainConfig(max_steps=300).warmup_for(300) == 30
    assert TrainConfig(warmup_steps=5).warmup_for(300) == 5


def test_parse_duration():
    from gptkit.train.config import parse_duration

    assert parse_duration("90") == parse_duration("90s") == 90
    assert parse_duration("5m") == 300 and parse_duration("1h30m") == 5400 and parse_duration("2.5m") == 150
    for bad in ("", "m", "5x", "0s", "-3s"):
        with pytest.raises(ValueError, match="time budget"):
            parse_duration(bad)


class FakeClock:
    """Time that passes only when the trainer works: ``update`` seconds a batch, ``evaluation`` an eval."""

    def __init__(self, trainer, update: float, evaluation: float):
        self.now, self.update, self.evaluation = 0.0, update, evaluation
        trainer.clock = lambda: self.now
        next_batch, evaluate = trainer.data.next_batch, trainer.evaluate

        def timed_batch():
            self.now += self.update
            return next_batch()

        def timed_evaluate(model):
            self.now += self.evaluation
            return evaluate(model)

        trainer.data.next_batch, trainer.evaluate = timed_batch, timed_evaluate


def budget_config(**overrides) -> TrainConfig:
    values = dict(max_steps=100_000, warmup_steps=10_000, eval_every=10, checkpoint_every=10_000)
    return TrainConfig(**{**loop_config().__dict__, **values, "time_budget": "100s", **overrides})


# The budget tests count seconds on a fake clock; what an update computes does not matter to them,
# so their updates are the cheapest real ones: a 64-token vocabulary, random windows.
TINY_VOCAB = 64


class TinyBatches:
    """Seeded random windows: batch n is the same in a run and in its resumption."""

    def __init__(self, batch_size: int, seed: int):
        self.batch_size, self.seed, self.batches = batch_size, seed, 0

    def next_batch(self) -> dict:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.batches)
        self.batches += 1
        ids = torch.randint(0, TINY_VOCAB, (self.batch_size, 32), generator=generator)
        return {"input_ids": ids, "labels": ids}

    def state_dict(self) -> dict:
        return {"batches": self.batches}

    def load_state_dict(self, state: dict) -> None:
        self.batches = state["batches"]


def tiny_evaluate(model) -> dict[str, float]:
    ids = torch.randint(0, TINY_VOCAB, (4, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return {"val_loss": float(model(input_ids=ids, labels=ids).loss)}


def budget_trainer(out_dir, config, interrupt_at=None) -> Trainer:
    model = small_model(vocab=TINY_VOCAB)
    data = TinyBatches(config.batch_size, config.seed)
    return Trainer(
        model,
        config,
        InterruptAt(data, interrupt_at) if interrupt_at else data,
        out_dir,
        save_model=lambda d, s: save_state_dict(model.config, s, d),
        evaluate=tiny_evaluate,
    )


def test_time_budget_plans_the_schedule_for_the_updates_that_fit(tmp_path):
    """1 s an update and 5 s an evaluation, 100 s: after 5 updates (5 s) and one timed evaluation (5 s),
    97% of the budget less that and the final evaluation leaves 82 s at 1 + 5/10 s an update: 54
    more updates, 59 in all."""
    config = budget_config()
    trainer = budget_trainer(tmp_path, config)
    FakeClock(trainer, update=1.0, evaluation=5.0)
    trainer.fit()
    plan = json.loads((tmp_path / "run_config.json").read_text())["resolved"]["time_budget_plan"]
    assert plan["planned_steps"] == 59 and trainer.step == 59
    assert plan["seconds_per_update"] == 1.0 and plan["seconds_per_evaluation"] == 5.0
    assert plan["warmup_steps"] == round(10_000 * 59 / 100_000) == 6  # warm-up keeps its share
    assert json.loads((tmp_path / "checkpoints" / "latest.json").read_text())["step"] == 59
    records = read_metrics(tmp_path / "metrics.jsonl")
    lrs = [r["lr"] for r in records if "lr" in r]
    assert lrs[-1] == pytest.approx(learning_rate(58, 3e-3, 6, 59, "cosine"))
    assert [r["step"] for r in records if "val_loss" in r] == [5, 10, 20, 30, 40, 50, 59]
    assert config.max_steps == 100_000  # the caller's config is not changed


def test_time_budget_stops_at_the_deadline_with_a_checkpoint(tmp_path):
    trainer = budget_trainer(tmp_path, budget_config(eval_every=0))
    clock = FakeClock(trainer, update=1.0, evaluation=0.0)
    slow_down = trainer.data.next_batch

    def slower():  # updates take 3 s once the plan is made: the plan cannot hold
        if trainer.plan:
            clock.now += 2.0
        return slow_down()

    trainer.data.next_batch = slower
    trainer.fit()
    assert trainer.plan.stopped_at_deadline and trainer.plan.planned_steps == trainer.step
    assert trainer.step == 5 + 32  # planned 97 after 5 s, then 3 s an update until 100 s have passed
    assert json.loads((tmp_path / "checkpoints" / "latest.json").read_text())["step"] == 37
    resolved = json.loads((tmp_path / "run_config.json").read_text())["resolved"]
    assert resolved["max_steps"] == 37 and resolved["time_budget_plan"]["stopped_at_deadline"]


def test_a_run_that_slows_down_is_planned_again_and_still_finishes_its_schedule(tmp_path):
    """1 s an update while the plan is made (97 updates in 100 s), 1.2 s after it. Halfway (update 49,
    at 5 + 44 × 1.2 = 57.8 s) the pace is measured again: 97 - 57.8 = 39.2 s leave room for 32 more,
    81 in all; at three quarters (update 61, 72.2 s) 24.8 s still fit 20 more: 81 stands. The run ends
    at 96.2 s with its decay complete, where the first plan would have been cut at the deadline
    (update 84). A pace that holds changes nothing: the other budget tests keep their first plan."""
    trainer = budget_trainer(tmp_path, budget_config(eval_every=0, schedule="wsd", warmup_steps=0))
    clock = FakeClock(trainer, update=1.0, evaluation=0.0)
    steady = trainer.data.next_batch

    def slower():
        if trainer.plan:
            clock.now += 0.2
        return steady()

    trainer.data.next_batch = slower
    trainer.fit()
    plan = trainer.plan
    assert plan.replanned_at == (49,) and plan.planned_steps == trainer.step == 81
    assert not plan.stopped_at_deadline and clock.now == pytest.approx(5 + 76 * 1.2)
    lrs = [r["lr"] for r in read_metrics(tmp_path / "metrics.jsonl") if "lr" in r]
    assert lrs[-1] == pytest.approx(learning_rate(80, 3e-3, 0, 81, "wsd"))  # the decay's last step


def test_a_deadline_before_the_plan_ends_the_run_and_a_resume_has_nothing_left(tmp_path):
    trainer = budget_trainer(tmp_path, budget_config(eval_every=0, time_budget="3s"))
    FakeClock(trainer, update=1.0, evaluation=0.0)  # 3 s are gone before 5 updates could be timed
    trainer.fit()
    assert trainer.step == 3 and trainer.plan.planned_steps == 3 and trainer.plan.stopped_at_deadline
    again = budget_trainer(tmp_path, budget_config(eval_every=0, time_budget="3s"))
    again.resume(again.latest_checkpoint(), read_state_dict)
    again.fit()
    assert again.step == 3  # complete as it stood


def test_resuming_a_budgeted_run_keeps_its_plan(tmp_path):
    first = budget_trainer(tmp_path, budget_config(eval_every=0), interrupt_at=9)
    FakeClock(first, update=1.0, evaluation=0.0)
    with pytest.raises(KeyboardInterrupt):
        first.fit()
    assert first.plan.planned_steps == 97
    second = budget_trainer(tmp_path, budget_config(eval_every=0))
    second.resume(second.latest_checkpoint(), read_state_dict)
    assert (second.max_steps, second.warmup_steps, second.step) == (97, first.warmup_steps, 8)


@pytest.mark.slow
def test_init_with_dropout_applies_the_rate_to_every_layer(shards, tmp_path):
    model = small_model(dropout=0.1)
    model.set_dropout(0.3)
    rates = {m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)}
    assert rates == {0.3} and all(block.attn.dropout == 0.3 for block in model.h)
    assert model.config.dropout == 0.3
    # A rate of 0 in training mode computes exactly what evaluation mode does.
    model.set_dropout(0.0)
    ids = torch.randint(0, 100, (2, 16))
    torch.testing.assert_close(model.train()(ids).logits, model.eval()(ids).logits)
    # Through the command: the recorded rate is the one the layers used.
    start = tmp_path / "start"
    small_model().save_pretrained(start)
    out = tmp_path / "run"
    run_pretrain(shards, out, "--init", str(start), "--dropout", "0.3", "--max-steps", "2")
    assert json.loads((out / "run_config.json").read_text())["model"]["dropout"] == 0.3
    assert GPT.from_pretrained(out).config.dropout == 0.3
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
        small_model().set_dropout(1.0)
