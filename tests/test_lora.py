"""LoRA: the layer against its formula, adapters against peft on transformers' form of the same
base, fine-tuning runs that save the adapter alone and load back to the same predictions, and
adapters served over one copy of their base."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from gptkit import GPT, GPTConfig
from gptkit.data.tables import parse_columns, read_table
from gptkit.data.tasks import task_metrics
from gptkit.io import read_safetensors
from gptkit.model.lora import (
    LORA_TARGETS,
    LoRALinear,
    LoRASettings,
    adapter_from_state,
    add_lora,
    merge_lora,
    write_adapter,
)
from gptkit.model.task import TaskModel
from gptkit.serve.config import ServeLimits
from gptkit.serve.models import CLASSIFY, EMBEDDINGS, embed, load_models
from gptkit.testing.adapters import write_adapter_run
from gptkit.tokenizer import Tokenizer
from gptkit.train.config import TrainConfig
from gptkit.train.finetune.tasks import FinetuneConfig, LoRAConfig, finetune, paper_finetuning
from gptkit.train.run import ModelShape
from gptkit.train.rundir import RunDir


def test_lora_layer_is_its_formula_and_merges_to_the_same_function():
    torch.manual_seed(0)
    linear = nn.Linear(6, 5)
    layer = LoRALinear.wrap(linear, rank=2, scaling=4.0 / 2)
    x = torch.randn(3, 6)
    # At the start B = 0: the base's function exactly.
    torch.testing.assert_close(layer(x), linear(x))
    with torch.no_grad():
        layer.lora_B.normal_()
    expected = x @ linear.weight.T + linear.bias + 2.0 * (x @ layer.lora_A.T) @ layer.lora_B.T
    torch.testing.assert_close(layer(x), expected)
    torch.testing.assert_close(layer.merged()(x), expected)
    assert layer.weight is linear.weight  # the base's tensor, shared, not copied


def randomized_lora_gpt(config: GPTConfig, settings: LoRASettings) -> tuple[GPT, GPT]:
    """A base GPT and a copy with LoRA layers whose B is not zero (as after training)."""
    torch.manual_seed(0)
    base = GPT(config).eval()
    adapted = GPT(config).eval()
    adapted.load_state_dict(base.state_dict())
    add_lora(adapted, settings)
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if name.endswith("lora_B"):
                param.normal_(0.0, 0.5)
    return base, adapted


@pytest.mark.parametrize("ln_position", ["pre", "post"], ids=["gpt2", "openai-gpt"])
def test_adapter_files_give_equal_logits_in_peft_on_the_transformers_model(tmp_path, ln_position):
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    config = GPTConfig(
        vocab_size=97,
        context_length=16,
        n_layer=2,
        n_head=2,
        d_model=16,
        ln_position=ln_position,
        dropout=0.0,
    )
    settings = LoRASettings(rank=4, alpha=8.0, targets=("c_attn", "c_proj", "c_fc"))
    base, adapted = randomized_lora_gpt(config, settings)
    base.save_pretrained(tmp_path / "base")
    write_adapter(
        tmp_path / "adapter", settings, str(tmp_path / "base"), adapter_from_state(adapted.state_dict())
    )

    hf_class = transformers.GPT2LMHeadModel if ln_position == "pre" else transformers.OpenAIGPTLMHeadModel
    hf = peft.PeftModel.from_pretrained(
        hf_class.from_pretrained(tmp_path / "base"), tmp_path / "adapter"
    ).eval()
    ids = torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        ours = adapted(ids).logits
        theirs = hf(input_ids=ids).logits
        assert (ours - base(ids).logits).abs().max() > 1e-2  # the adapter does change the function
        torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(merge_lora(adapted)(ids).logits, ours, atol=1e-5, rtol=1e-5)
    # What the run saves is the adapter alone: megabytes for GPT-2 sizes, here a few kB.
    assert (tmp_path / "adapter" / "adapter_model.safetensors").stat().st_size < 64 * 1024


WORDS = "the film was quite a story of people and places".split()
GOOD, BAD = ["wonderful", "great", "superb", "lovely"], ["awful", "dreadful", "boring", "terrible"]


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, small_tokenizer) -> Path:
    """A small 'pre-trained' GPT-2-form model (random weights) with a small byte-level tokenizer."""
    directory = tmp_path_factory.mktemp("base")
    tokenizer = Tokenizer.from_pretrained(small_tokenizer)
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=len(tokenizer), context_length=32, n_layer=2, n_head=2, d_model=16)
    GPT(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def write_rows(path: Path, task: str, n: int, seed: int) -> str:
    """A toy CSV of ``task``: positive or negative words among fillers; returns its --columns."""
    rng = random.Random(seed)

    def sentence(positive: bool) -> str:
        words = rng.sample(WORDS, 4) + [rng.choice(GOOD if positive else BAD)]
        rng.shuffle(words)
        return " ".join(words)

    header, columns = {
        "classification": ("text,label", "text=text,label=label"),
        "entailment": ("premise,hypothesis,label", "premise=premise,hypothesis=hypothesis,label=label"),
        "similarity": ("a,b,label", "text_a=a,text_b=b,label=label"),
        "multiple_choice": ("story,c1,c2,label", "context=story,choices=c1|c2,label=label"),
    }[task]
    lines = [header]
    for _ in range(n):
        positive = rng.random() < 0.5
        if task == "classification":
            lines.append(f"{sentence(positive)},{'pos' if positive else 'neg'}")
        elif task == "multiple_choice":
            lines.append(f"{sentence(True)},{sentence(True)},{sentence(False)},{0}")
        else:
            lines.append(f"{sentence(positive)},{sentence(True)},{int(positive)}")
    path.write_text("\n".join(lines) + "\n")
    return columns


def training(**settings) -> TrainConfig:
    """Fine-tuning's training-loop defaults with ``settings``, without a progress bar."""
    return dataclasses.replace(paper_finetuning(), progress=False, **settings)


def lora_config(tmp_path: Path, base_dir: Path, task: str, **overrides) -> FinetuneConfig:
    columns = write_rows(tmp_path / "train.csv", task, 64, seed=0)
    write_rows(tmp_path / "dev.csv", task, 16, seed=1)
    settings = dict(
        task=task,
        train=str(tmp_path / "train.csv"),
        dev=str(tmp_path / "dev.csv"),
        columns=columns,
        model=ModelShape(init=str(base_dir)),
        out=str(tmp_path / "run"),
        lora=LoRAConfig(rank=4),
    )
    return FinetuneConfig(**{**settings, **overrides})


def test_lora_finetuning_learns_saves_the_adapter_alone_and_leaves_the_base_frozen(tmp_path, base_dir):
    train = training(lr=2e-2, batch_size=16, log_every=1, precision="fp32")
    config = lora_config(
        tmp_path, base_dir, "classification", epochs=6, merge=True, lm_coef=0.0, training=train
    )
    results = finetune(config)
    run = tmp_path / "run"
    # By hand: rank 4 on 2 blocks × (c_attn 16→48, c_proj 16→16, c_fc 16→64, c_proj 64→16),
    # the 3 special tokens' rows and the head W_y (16 → 2, with bias).
    lora = 2 * 4 * ((16 + 48) + (16 + 16) + (16 + 64) + (64 + 16))
    assert results["trainable_parameters"] == lora + 3 * 16 + (16 * 2 + 2)
    losses = [
        r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r
    ]
    assert sum(losses[-4:]) < sum(losses[:4])  # it trains
    assert not (run / "model.safetensors").exists()  # the adapter alone, in peft's layout
    adapter_config = json.loads((run / "adapter_config.json").read_text())
    assert (adapter_config["r"], adapter_config["lora_alpha"], adapter_config["peft_type"]) == (
        4,
        8.0,
        "LORA",
    )

    adapted = TaskModel.from_pretrained(run, device="cpu")  # base + adapter, merged
    merged = TaskModel.from_pretrained(run / "merged", device="cpu")  # --merge's full model
    rows = [{"text": f"the film was {word}"} for word in GOOD + BAD]
    logits = adapted.logits(adapted.encode(rows))
    torch.testing.assert_close(merged.logits(merged.encode(rows)), logits)
    # The best dev model is the one saved: loaded back, it scores what the run recorded.
    dev = read_table(tmp_path / "dev.csv", "classification", {"text": "text", "label": "label"})
    predicted = [r["label"] for r in adapted.predict(dev)]
    accuracy = sum(p == e.label for p, e in zip(predicted, dev)) / len(dev)
    assert accuracy == pytest.approx(results["best"]["dev_accuracy"])
    # Frozen: everything but the adapted projections' weights and the new rows is the base's.
    base = GPT.from_pretrained(base_dir).state_dict()
    tuned = merged.gpt.state_dict()
    for name, tensor in base.items():
        if name == "wte.weight":
            torch.testing.assert_close(tuned[name][: len(tensor)], tensor)
        elif not name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            torch.testing.assert_close(tuned[name], tensor, msg=name)
    assert not torch.allclose(tuned["h.0.attn.c_attn.weight"], base["h.0.attn.c_attn.weight"])


@pytest.mark.parametrize("task", ["entailment", "similarity", "multiple_choice"])
def test_every_task_kind_trains_an_adapter_that_loads_back_to_its_recorded_score(tmp_path, base_dir, task):
    train = training(lr=1e-2, batch_size=16, max_steps=2, precision="fp32")
    config = lora_config(tmp_path, base_dir, task, eval_batch_size=16, training=train)
    # fp32, as the loaded model computes: a bf16 evaluation may break near-ties the other way.
    results = finetune(config)
    model = TaskModel.from_pretrained(tmp_path / "run", device="cpu")
    dev = read_table(tmp_path / "dev.csv", task, parse_columns(config.columns))
    encoded = model.encode(dev, require_labels=True)
    metrics = task_metrics(model.spec, model.logits(encoded), [e.target for e in encoded])
    assert model.spec.task == task and results["steps"] == 2
    assert metrics[results["metric"]] == pytest.approx(results["best"][f"dev_{results['metric']}"])


@pytest.mark.slow
def test_a_lora_run_resumes_exactly(tmp_path, base_dir):
    train = training(lr=1e-2, batch_size=16, max_steps=4, checkpoint_every=2)
    finetune(lora_config(tmp_path, base_dir, "multiple_choice", training=train))
    # Stopped after 2 updates and resumed: the same adapter as the run straight through.
    resumed_dir = tmp_path / "resumed"
    stopped = lora_config(tmp_path, base_dir, "multiple_choice", out=str(resumed_dir), training=train)
    finetune(dataclasses.replace(stopped, training=dataclasses.replace(train, max_steps=2)))
    # A run directory written before FinetuneConfig nested its training settings recorded
    # group_by_length among them: --resume reads the checkpoint, never run_config.json's settings.
    recorded = json.loads((resumed_dir / "run_config.json").read_text())
    recorded["train"]["group_by_length"] = recorded["finetune"].pop("group_by_length")
    (resumed_dir / "run_config.json").write_text(json.dumps(recorded))
    finetune(dataclasses.replace(stopped, resume=True))
    assert "group_by_length" in json.loads((resumed_dir / "run_config.json").read_text())["finetune"]
    straight_last, resumed_last = RunDir(tmp_path / "run").checkpoint(4), RunDir(resumed_dir).checkpoint(4)
    assert not (straight_last / "model.safetensors").exists()  # checkpoints hold the adapter alone too
    for name in ("adapter_model.safetensors", "special_tokens.safetensors", "task_head.safetensors"):
        ours, again = read_safetensors(straight_last / name), read_safetensors(resumed_last / name)
        for key in ours:
            torch.testing.assert_close(again[key], ours[key], msg=f"{name} {key}")


def test_adapters_of_one_base_share_it_and_a_mixed_batch_equals_each_merged_model_alone(tmp_path, base_dir):
    tasks = {
        "sentiment": ("classification", ["neg", "pos"]),
        "nli": ("entailment", ["yes", "no", "maybe"]),
        "choice": ("multiple_choice", None),
    }
    for seed, (name, (task, labels)) in enumerate(tasks.items()):
        # Ranks 2, 3 and 4, and one adapter of attention alone: the stacks are padded with zeros.
        targets = ("c_attn",) if task == "multiple_choice" else LORA_TARGETS
        write_adapter_run(tmp_path / name, base_dir, task, labels, seed, targets=targets)
    served = load_models(
        {name: tmp_path / name for name in tasks}, ServeLimits(), dtype="float32", device="cpu"
    )
    assert len({id(model.gpt) for model in served}) == 1  # one copy of the base
    assert len({id(model.tokenizer) for model in served}) == 1  # and of its tokenizer (the same files)
    assert len({id(model.batchers[CLASSIFY].shared) for model in served}) == 1  # one batcher for all
    rows = {
        "sentiment": [{"text": "the film was great"}, {"text": "a dreadful story"}],
        "nli": [{"premise": "a story of people", "hypothesis": "the film was lovely"}],
        "choice": [{"context": "the film was", "choices": ["great", "a story"]}],
    }
    models = {model.name: model for model in served}
    alone = {name: TaskModel.from_pretrained(tmp_path / name, device="cpu") for name in tasks}
    inputs = [
        (name, i, example) for name in tasks for i, example in enumerate(alone[name].encode(rows[name]))
    ]
    inputs = inputs[1::2] + inputs[::2]  # interleaved: adapters mixed in one batch
    # The batch function the server runs on one batch of classify inputs, whatever their adapters:
    # one pass of the base, each row adding its own adapter's terms.
    mixed = (
        models["sentiment"].batchers[CLASSIFY].shared.run([(name, example) for name, _, example in inputs])
    )
    expected = {name: alone[name].predict(rows[name]) for name in tasks}
    for (name, i, _), record in zip(inputs, mixed):
        assert record["label"] == expected[name][i]["label"]
        assert record["probabilities"] == pytest.approx(expected[name][i]["probabilities"], abs=1e-5)
    # Embeddings too: the adapter's h_n at _classify_, as its merged model computes it.
    sequence = models["nli"].embedding_input(alone["nli"].tokenizer.encode("a story"))
    ours = models["nli"].batchers[EMBEDDINGS].run([sequence])
    torch.testing.assert_close(
        torch.tensor(ours), torch.tensor(embed(alone["nli"].gpt, [sequence])), atol=1e-5, rtol=1e-5
    )
