"""Fine-tuning for generation (``--task generation``): prompt → completion, the loss on the answer.

The same run as every other fine-tuning (the one training loop, resume, budgets, metrics, LoRA), with
:class:`gptkit.model.completion.CompletionModel` in place of the task head: L2 on the completion's
tokens and its end token, plus λ·L1 over the whole text with ``--lm-coef``. The dev split is scored
after every epoch by its completion loss and by the exact match of greedy completions (the metric
the best model is kept by). The run keeps beside the best weights the chat template it trained
with (:mod:`gptkit.tokenizer.chat_template`), so that every door formats prompts alike.

A public labelled dataset becomes prompt → completion: a classification text → its label's word
(SST-2: negative, positive), a story → its right ending (Story Cloze), a premise and hypothesis →
the label.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from gptkit.data.batching import PAD_TO_MULTIPLE
from gptkit.data.completions import (
    CompletionExample,
    collate_completions,
    encode_completions,
    end_of_text_id,
)
from gptkit.data.examples import Example
from gptkit.data.formats import DataError
from gptkit.data.registry import DATASETS
from gptkit.data.sampler import EpochSampler
from gptkit.generation.decode import generate
from gptkit.generation.sampling import GREEDY
from gptkit.io import write_json
from gptkit.model.completion import (
    GENERATION_NAME,
    CompletionModel,
    completion_batches,
    merged_generation_adapter,
)
from gptkit.model.lora import LoRASettings, adapter_from_state, add_lora, write_adapter
from gptkit.model.weights import save_state_dict
from gptkit.tokenizer import Tokenizer
from gptkit.tokenizer.chat_template import CHAT_TEMPLATE, write_chat_template
from gptkit.train.config import TrainConfig
from gptkit.train.distributed.processes import DistributedContext, unwrap, wrap_model
from gptkit.train.finetune.common import MERGED_DIR, BestModel, load_examples, trainable_parameters
from gptkit.train.finetune.config import FinetuneConfig, resolved_training
from gptkit.train.loop import Trainer
from gptkit.train.run import (
    base_vocab_size,
    build_model,
    resume_latest,
    resuming,
    run_config,
    sequence_length,
)
from gptkit.train.rundir import RunDir

# The words a public dataset's labels are written as when its examples become completions.
LABEL_WORDS = {"sst2": {"0": "negative", "1": "positive"}, "cola": {"0": "unacceptable", "1": "acceptable"}}
# Greedy answers at evaluation stop after this many tokens past the longest reference answer.
ANSWER_SLACK = 8


class CompletionBatches(EpochSampler):
    """Epochs of shuffled completion examples (of similar length together with ``group_by_length``),
    collated; its position is the epoch sampler's ``state_dict``."""

    def __init__(
        self,
        examples: list[CompletionExample],
        train: TrainConfig,
        rank: int,
        world_size: int,
        max_length: int,
        group_by_length: bool = True,
    ):
        lengths = [len(e.ids) for e in examples] if group_by_length else None
        super().__init__(
            len(examples),
            train.batch_size,
            train.seed,
            rank,
            world_size,
            items="training examples",
            lengths=lengths,
        )
        self.examples, self.max_length = examples, max_length

    def next_batch(self) -> dict[str, torch.Tensor]:
        batch = [self.examples[i] for i in self.next_indices()]
        return collate_completions(batch, PAD_TO_MULTIPLE, self.max_length)


def as_generation(examples: Sequence[Example], dataset: str | None, task: str) -> list[Example]:
    """Labelled examples of ``task`` as prompts and completions (the module docstring says how); a
    generation task's own examples as they are."""
    if task == "generation":
        return list(examples)
    words = LABEL_WORDS.get(dataset or "", {})
    converted = []
    for example in examples:
        fields, label = example.fields, example.label
        if task == "multiple_choice":
            context = " ".join(str(fields[k]) for k in ("context", "question") if fields.get(k))
            prompt, completion = context, str(fields["choices"][int(label)])
        elif task == "classification":
            prompt, completion = str(fields["text"]), words.get(str(label), str(label))
        elif task == "entailment":
            prompt, completion = (
                f"{fields['premise']}\n{fields['hypothesis']}",
                words.get(str(label), str(label)),
            )
        else:
            raise DataError(f"{dataset or task}: a {task} dataset has no prompt → completion form")
        converted.append(Example({"prompt": prompt, "completion": completion}, None, example.source))
    return converted


@torch.no_grad()
def greedy_answers(gpt, tokenizer: Tokenizer, examples: Sequence[CompletionExample]) -> list[str]:
    """Each example's greedy completion of its (templated) prompt, up to its end token; one prompt
    at a time, so no padding to reason about."""
    end = end_of_text_id(tokenizer)
    longest = max(len(e.answer_ids) for e in examples) + ANSWER_SLACK
    device = gpt.wte.weight.device
    answers = []
    for example in examples:
        prompt = torch.tensor([example.prompt_ids], device=device)
        ids = generate(gpt, prompt, longest, GREEDY, eos_token_id=end)[0, prompt.size(1) :].tolist()
        answers.append(tokenizer.decode_text(ids[: ids.index(end)] if end in ids else ids))
    return answers


def exact_match(answers: Sequence[str], examples: Sequence[CompletionExample]) -> float:
    """The share of answers equal to their reference completion, spaces at either end aside."""
    hits = sum(a.strip() == e.completion.strip() for a, e in zip(answers, examples, strict=True))
    return hits / max(len(examples), 1)


def save_generation_model(
    directory: Path, gpt_config, state: dict[str, torch.Tensor], info: dict, template: str
) -> None:
    """The GPT as a language-model folder (or a LoRA run's adapter, in peft's layout), with the chat
    template it trained with and ``generation.json`` (the task, and a LoRA adapter's base)."""
    gpt_state = {k.removeprefix("gpt."): v for k, v in state.items() if k.startswith("gpt.")}
    directory.mkdir(parents=True, exist_ok=True)
    lora = info.get("lora")
    if lora:
        settings = LoRASettings(int(lora["rank"]), float(lora["alpha"]), tuple(lora["targets"]))
        write_adapter(directory, settings, lora["base"], adapter_from_state(gpt_state))
    else:
        save_state_dict(gpt_config, gpt_state, directory)
    write_chat_template(directory, template)
    write_json(directory / GENERATION_NAME, info)


@dataclass
class _GenerationRun:
    """What a generation fine-tuning trains: the model, the encoded splits and the loop's settings."""

    tokenizer: Tokenizer
    model: CompletionModel
    splits: dict[str, list[CompletionExample]]
    skipped: dict[str, int]
    batches: CompletionBatches
    train: TrainConfig
    info: dict  # generation.json: the task, λ, the length, a LoRA adapter's settings and base

    @property
    def examples(self) -> dict[str, int]:
        return {split: len(found) for split, found in self.splits.items()}


def _prepare(config: FinetuneConfig, tokenizer_dir: str, ctx: DistributedContext) -> _GenerationRun:
    """The tokenizer, the GPT (with LoRA layers on a LoRA run), the splits as prompts and
    completions, encoded, and the batches."""
    tokenizer = Tokenizer.from_pretrained(tokenizer_dir)
    train = config.training
    torch.manual_seed(train.seed)
    gpt = build_model(config.model, base_vocab_size(tokenizer))
    settings = config.lora.settings()
    if settings is not None:
        add_lora(gpt, settings)  # every weight frozen but the LoRA matrices: no new token rows
    max_length = sequence_length(config.model, gpt.config, config.max_length)
    source_task = DATASETS[config.dataset].task if config.dataset in DATASETS else "generation"
    splits, skipped = {}, {}
    for split, limit in (("train", config.max_train_examples), ("dev", config.max_eval_examples)):
        read = load_examples(dataclasses.replace(config, task=source_task), split)
        examples = as_generation(read, config.dataset, source_task)[:limit]
        splits[split], skipped[split] = encode_completions(
            examples, tokenizer, CHAT_TEMPLATE, max_length, config.skip_bad_rows
        )
    if ctx.is_main and any(skipped.values()):
        print(f"skipped bad rows: {skipped['train']} in train, {skipped['dev']} in dev")
    model = CompletionModel(gpt.train(), config.lm_coef).to(ctx.device)
    torch.manual_seed(train.seed + ctx.rank)
    batches = CompletionBatches(
        splits["train"], train, ctx.rank, ctx.world_size, max_length, group_by_length=config.group_by_length
    )
    train = resolved_training(train, config.epochs, batches.steps_per_epoch)
    info = {"task": "generation", "lm_coef": config.lm_coef, "max_length": max_length}
    if settings is not None:
        # A local base is recorded absolute, so that the adapter loads from any directory.
        init = config.model.init
        base = str(Path(init).resolve()) if init and Path(init).is_dir() else init
        targets = list(settings.targets)
        info["lora"] = {"rank": settings.rank, "alpha": settings.alpha, "targets": targets, "base": base}
    return _GenerationRun(tokenizer, model, splits, skipped, batches, train, info)


def finetune_generation(
    config: FinetuneConfig, tokenizer_dir: str, out_dir: Path, ctx: DistributedContext
) -> dict:
    """:func:`gptkit.train.finetune.tasks.finetune` for ``--task generation`` (or a public dataset read as
    prompts and completions), while the run directory is held."""
    run = _prepare(config, tokenizer_dir, ctx)
    model, tokenizer, dev = run.model, run.tokenizer, run.splits["dev"]
    dev_batches = completion_batches(
        dev, config.eval_batch_size, lambda b: collate_completions(b, PAD_TO_MULTIPLE)
    )

    def evaluate(module: nn.Module) -> dict[str, float]:
        completion = unwrap(module)
        loss = completion.completion_loss_of(dev_batches)
        was_training = completion.training
        answers = greedy_answers(completion.gpt.eval(), tokenizer, dev)
        completion.train(was_training)
        return {"dev_completion_loss": loss, "dev_exact_match": exact_match(answers, dev)}

    def save_model(directory: Path, state: dict[str, torch.Tensor]) -> None:
        save_generation_model(directory, model.gpt.config, state, run.info, CHAT_TEMPLATE)

    best = BestModel(out_dir, "exact_match", save_model, ctx, resuming(config.resume, out_dir))
    task = {"task": "generation", "max_length": run.info["max_length"]}
    described = run_config(
        "finetune",
        config,
        run.train,
        model.gpt.config,
        task=task,
        examples=run.examples,
        skipped_rows=run.skipped,
    )
    trainer = Trainer(
        wrap_model(model, ctx, run.train), run.train, run.batches, out_dir, save_model,
        ctx=ctx, evaluate=evaluate, after_evaluate=best, run_config=described,
    )  # fmt: skip
    if ctx.is_main:
        tokenizer.save_pretrained(out_dir)
    if resuming(config.resume, out_dir):
        resume_latest(trainer, lambda checkpoint: _read_state(checkpoint, model))
    trainer.fit()
    if ctx.is_main and "lora" in run.info and config.merge and best.best.get("step") is not None:
        _write_merged(out_dir, tokenizer)
    results = {
        "task": "generation",
        "metric": "exact_match",
        "best_step": best.best.get("step"),
        "best": best.best.get("metrics", {}),
        "steps": trainer.step,
        "examples": run.examples,
        "lm_coef": config.lm_coef,
        "init": config.model.init,
    }
    results["trainable_parameters"], results["parameters"] = trainable_parameters(model)
    if ctx.is_main:
        write_json(RunDir(out_dir).results, results)
    return results


def _write_merged(out_dir: Path, tokenizer: Tokenizer) -> None:
    """The best adapter applied to its base, in ``out_dir/merged``: a full model like any other."""
    merged = out_dir / MERGED_DIR
    merged_generation_adapter(out_dir).save_pretrained(merged)
    tokenizer.save_pretrained(merged)
    write_chat_template(merged, CHAT_TEMPLATE)


def _read_state(checkpoint: Path, model: CompletionModel) -> dict[str, torch.Tensor]:
    """A checkpoint's model state: a LoRA run's adapter over the model's own frozen weights."""
    from gptkit.model.lora import is_adapter_dir, read_adapter
    from gptkit.model.weights import read_state_dict

    if is_adapter_dir(checkpoint):
        _, _, lora_state = read_adapter(checkpoint)
        state = dict(model.state_dict())
        state.update({f"gpt.{k}": v for k, v in lora_state.items()})
        return state
    return {f"gpt.{k}": v for k, v in read_state_dict(checkpoint).items()}
