"""A fine-tuned model: a GPT with a linear head W_y on h_n at the extract token (GPT-1 §3.2).

    P(y | x^1..x^m) = softmax(h_l^m · W_y)                        (eq. 3)
    L3(C) = L2(C) + λ·L1(C)                                        (eq. 5)

``TaskModel`` is what `gptkit finetune` writes and what a user loads to predict: a model directory
(``config.json`` + ``model.safetensors`` of the GPT, which transformers reads too), the head
(``task_head.safetensors``), the task (``task.json``: the input layout, labels, maximum length,
special-token ids) and the tokenizer, so that ``TaskModel.from_pretrained(dir).predict(rows)`` goes
from raw text to labels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptkit import hub
from gptkit.data.batching import PAD_TO_MULTIPLE, PADDING_SLACK, length_batches
from gptkit.data.examples import OPTIONAL_FIELDS, TEXT_FIELDS, Example
from gptkit.data.tasks import EncodedExample, TaskSpec, collate, encode_examples
from gptkit.hardware import resolve_device
from gptkit.io import read_json_object, read_safetensors, save_safetensors, write_json
from gptkit.model.lora import (
    LoRASettings,
    adapter_from_state,
    add_lora,
    is_adapter_dir,
    merge_lora,
    read_adapter,
    write_adapter,
)
from gptkit.model.network import GPT
from gptkit.model.weights import read_state_dict, save_state_dict
from gptkit.tokenizer import Tokenizer

HEAD_NAME = "task_head.safetensors"
# A LoRA model's trained rows of the token embedding (the special tokens'), beside its adapter.
SPECIAL_ROWS_NAME = "special_tokens.safetensors"
TASK_NAME = "task.json"


@dataclass
class TaskOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor  # (N, labels), (N, choices) or (N,) for regression
    clf_loss: torch.Tensor | None = None
    lm_loss: torch.Tensor | None = None


class TaskModel(nn.Module):
    """A GPT with a linear head on h_n at the extract token, trained on L2 + λ·L1.

    Args:
        gpt: the transformer (pre-trained or not), with rows for the task's special tokens.
        spec: the task (see :class:`gptkit.data.tasks.TaskSpec`).
        clf_dropout: dropout on h_n before the head (0.1 in the paper).
        lm_coef: λ, the weight of the auxiliary language-model loss (0.5 in the paper; 0 disables it).
        tokenizer: needed by :meth:`predict` on raw text.
    """

    def __init__(
        self,
        gpt: GPT,
        spec: TaskSpec,
        clf_dropout: float = 0.1,
        lm_coef: float = 0.5,
        tokenizer: Tokenizer | None = None,
    ):
        super().__init__()
        self.gpt, self.spec, self.lm_coef, self.tokenizer = gpt, spec, lm_coef, tokenizer
        self.clf_dropout = nn.Dropout(clf_dropout)
        self.head = nn.Linear(gpt.config.d_model, spec.n_outputs)  # W_y
        nn.init.normal_(self.head.weight, 0.0, gpt.config.init_std)
        nn.init.zeros_(self.head.bias)

    def forward(
        self,
        input_ids: torch.Tensor,  # (N, C, T): C sequences per example
        clf_positions: torch.Tensor,  # (N, C): where each sequence's <e> is
        lm_labels: torch.Tensor | None = None,
        targets: torch.Tensor | None = None,
    ) -> TaskOutput:
        N, C, T = input_ids.shape
        want_lm = self.lm_coef > 0 and lm_labels is not None
        out = self.gpt(
            input_ids.view(N * C, T),
            labels=lm_labels.view(N * C, T) if want_lm else None,
            compute_logits=False,
        )
        hidden = out.hidden_states.view(N, C, T, -1)
        h_e = hidden[torch.arange(N)[:, None], torch.arange(C)[None, :], clf_positions]  # (N, C, d)
        logits = self.read_out(h_e)
        clf_loss = None
        if targets is not None:
            if self.spec.regression:
                clf_loss = F.mse_loss(logits.float(), targets.float())
            else:
                clf_loss = F.cross_entropy(logits.float(), targets)
        loss = clf_loss
        if clf_loss is not None and want_lm:
            loss = clf_loss + self.lm_coef * out.loss  # L3 = L2 + λ·L1
        return TaskOutput(loss=loss, logits=logits, clf_loss=clf_loss, lm_loss=out.loss if want_lm else None)

    def read_out(self, h_e: torch.Tensor) -> torch.Tensor:
        """The task's logits from h_e, the final hidden state at each sequence's ``<e>`` (N, C, d)."""
        task = self.spec.task
        if task == "multiple_choice":
            logits = self.head(self.clf_dropout(h_e)).squeeze(-1)  # one score per answer → softmax over C
        elif task == "similarity":
            logits = self.head(self.clf_dropout(h_e.sum(dim=1)))  # both orders, added element-wise
        else:
            logits = self.head(self.clf_dropout(h_e[:, 0]))
        return logits.squeeze(-1) if self.spec.regression else logits

    # Inference ------------------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    def encode(self, rows: Sequence[Example | Mapping], require_labels: bool = False) -> list[EncodedExample]:
        """Lay out rows with the task's input transformation. A row is an ``Example`` or a mapping of
        the task's fields (``{"premise": ..., "hypothesis": ...}``, ``{"context": ..., "choices": [...]}``)
        with an optional ``label``."""
        if self.tokenizer is None:
            raise ValueError("this TaskModel has no tokenizer: pass one to TaskModel(...) to encode text")
        examples = [
            row if isinstance(row, Example) else _example(row, i, self.spec.task)
            for i, row in enumerate(rows)
        ]
        encoded, _ = encode_examples(
            examples, self.spec, self.tokenizer.encode, require_labels=require_labels
        )
        return encoded

    @torch.no_grad()
    def logits(self, examples: Sequence[EncodedExample], batch_size: int = 64) -> torch.Tensor:
        """Task logits for every encoded example, in order. Examples run shortest first, in batches of
        at most ``batch_size`` whose padding stays small (:func:`gptkit.data.batching.length_batches`
        with its ``PADDING_SLACK``). Padding follows each sequence (attention is causal): it changes no
        logit beyond float rounding."""
        was_training = self.training
        self.eval()
        logits: list[torch.Tensor | None] = [None] * len(examples)
        try:
            lengths = [max(map(len, example.sequences)) for example in examples]
            for indices in length_batches(lengths, batch_size, slack=PADDING_SLACK):
                batch = collate([examples[i] for i in indices], False, PAD_TO_MULTIPLE, self.spec.max_length)
                batch.pop("targets", None)
                batch.pop("lm_labels")
                batch = {k: v.to(self.device) for k, v in batch.items()}
                for i, row in zip(indices, self(**batch).logits.float().cpu()):
                    logits[i] = row
        finally:
            self.train(was_training)
        return torch.stack(logits) if logits else torch.zeros(0)

    def predict(self, rows: Sequence[Example | Mapping], batch_size: int = 64) -> list[dict]:
        """One record per row, in order: ``label`` (the label name, the choice index, or the score)
        and, for classes and choices, ``probabilities``."""
        return self.records(self.logits(self.encode(rows), batch_size))

    def records(self, logits: torch.Tensor) -> list[dict]:
        """:meth:`predict`'s records from task logits (one row per example, as :meth:`logits` gives)."""
        spec = self.spec
        records = []
        for row in logits:
            if spec.regression:
                records.append({"label": float(row)})
                continue
            probs = row.softmax(-1).tolist()
            if spec.task == "multiple_choice":
                names = [str(i) for i in range(len(probs))]
                label: str | int = int(row.argmax())
            else:
                names = list(spec.labels or [])
                label = names[int(row.argmax())]
            records.append({"label": label, "probabilities": dict(zip(names, probs))})
        return records

    # Files ------------------------------------------------------------------------------------------

    def task_info(self) -> dict:
        return {"spec": self.spec.to_dict(), "clf_dropout": self.clf_dropout.p, "lm_coef": self.lm_coef}

    def save_pretrained(self, directory: str | Path) -> None:
        """Write the GPT (HF format), the head, ``task.json`` and the tokenizer into ``directory``."""
        state = {k: v.detach().cpu() for k, v in self.state_dict().items()}
        save_task_model(Path(directory), self.gpt.config, state, self.task_info())
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(directory)

    @classmethod
    def from_pretrained(
        cls, directory: str | Path, device: str | None = "auto", base: str | Path | None = None
    ) -> TaskModel:
        """A fine-tuned model directory written by `gptkit finetune` or :meth:`save_pretrained`.

        A LoRA run's directory (an adapter) is applied to its base model, the one it was trained
        from, or ``base``, and merged into it: the model computes as fast as a fully fine-tuned one.
        """
        with hub.reading(directory) as directory:
            info = read_task_info(directory)
            spec = TaskSpec(**info["spec"])
            adapter = is_adapter_dir(directory)
            gpt = lora_gpt(directory, info, base) if adapter else GPT.from_pretrained(directory)
            model = cls(
                gpt,
                spec,
                info.get("clf_dropout", 0.1),
                info.get("lm_coef", 0.5),
                Tokenizer.from_pretrained(directory),
            )
            model.load_state_dict(read_task_state(directory, model.state_dict() if adapter else None))
        if adapter:
            merge_lora(model.gpt)
        return model.to(resolve_device(device)).eval()


def _example(row: Mapping, index: int, task: str) -> Example:
    """A row's task fields (other keys, such as an id, are left out) and its label, if any."""
    names = (*TEXT_FIELDS[task], *OPTIONAL_FIELDS.get(task, ()))
    fields = {k: v for k, v in row.items() if k in names}
    return Example(fields=fields, label=row.get("label"), source=f"row {index}")


def read_task_info(directory: Path) -> dict:
    """``task.json`` of a fine-tuned model directory, its ``spec`` checked."""
    if not (directory / TASK_NAME).exists():
        raise FileNotFoundError(f"{directory}: no {TASK_NAME}; is this a fine-tuned model directory?")
    info = read_json_object(directory / TASK_NAME)
    try:
        TaskSpec(**info["spec"])
    except (KeyError, TypeError) as e:
        raise ValueError(f"{directory / TASK_NAME}: bad or missing 'spec' ({e})") from e
    return info


def save_task_model(directory: Path, gpt_config, state: dict[str, torch.Tensor], task_info: dict) -> None:
    """Write a TaskModel's state dict: the GPT's part as a model directory, the head beside it.

    A LoRA model (``task_info["lora"]`` set) writes its adapter instead of the GPT: the LoRA
    matrices in peft's layout and the special tokens' rows, megabytes where the GPT is hundreds.
    """
    directory.mkdir(parents=True, exist_ok=True)
    gpt_state = {k.removeprefix("gpt."): v for k, v in state.items() if k.startswith("gpt.")}
    lora = task_info.get("lora")
    if lora:
        write_adapter(directory, lora_settings(task_info), lora["base"], adapter_from_state(gpt_state))
        save_safetensors({"rows": gpt_state["wte.rows"].contiguous()}, directory / SPECIAL_ROWS_NAME)
    else:
        save_state_dict(gpt_config, gpt_state, directory)
    save_safetensors({"weight": state["head.weight"], "bias": state["head.bias"]}, directory / HEAD_NAME)
    write_json(directory / TASK_NAME, task_info)


def read_task_state(
    directory: str | Path, base_state: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """A TaskModel's state dict from a directory written by :func:`save_task_model`; for a LoRA
    model, ``base_state`` (the model's own state dict) gives the frozen weights the files lack."""
    directory = Path(directory)
    if is_adapter_dir(directory):
        if base_state is None:
            raise ValueError(f"{directory}: a LoRA adapter; its base model's state is needed to read it")
        _, _, lora_state = read_adapter(directory)
        state = dict(base_state)
        state.update({f"gpt.{k}": v for k, v in lora_state.items()})
        state["gpt.wte.rows"] = read_safetensors(directory / SPECIAL_ROWS_NAME)["rows"]
    else:
        state = {f"gpt.{k}": v for k, v in read_state_dict(directory).items()}
    state.update({f"head.{k}": v for k, v in read_safetensors(directory / HEAD_NAME).items()})
    return state


def adapter_base_dir(directory: Path, info: dict, base: str | Path | None = None) -> Path:
    """The base model of an adapter directory: ``base``, else the one ``task.json`` names (as given,
    or relative to ``directory``)."""
    base = base or (info.get("lora") or {}).get("base")
    if not base:
        raise ValueError(
            f"{directory / TASK_NAME}: a LoRA adapter without its base model's path ('lora.base')"
        )
    base_dir = Path(base)
    if not base_dir.is_dir() and (directory / base_dir).is_dir():
        return directory / base_dir
    try:
        return hub.resolve(base)  # a folder as given, or a Hub name such as gpt2
    except FileNotFoundError as e:
        raise FileNotFoundError(
            f"{directory}: the adapter's base model {str(base)!r} is not a folder (from {TASK_NAME}'s "
            "lora.base); pass the base model's folder or Hub name"
        ) from e


def lora_task_info(settings: LoRASettings, base: str | None, first_trainable_row: int) -> dict:
    """What ``task.json`` records of a LoRA model (its ``"lora"`` entry), to rebuild it from its base."""
    lora = {"rank": settings.rank, "alpha": settings.alpha, "targets": list(settings.targets)}
    return {"lora": {**lora, "base": base, "first_trainable_row": first_trainable_row}}


def lora_settings(info: dict) -> LoRASettings:
    lora = info["lora"]
    return LoRASettings(int(lora["rank"]), float(lora["alpha"]), tuple(lora["targets"]))


def with_special_rows(gpt: GPT, directory: Path, info: dict) -> tuple[GPT, torch.Tensor]:
    """``gpt`` grown to the adapter's rows (the special tokens'), and those rows."""
    rows = read_safetensors(directory / SPECIAL_ROWS_NAME)["rows"]
    gpt.add_special_tokens(
        int(info["lora"]["first_trainable_row"]) + rows.size(0) - gpt.config.total_vocab_size
    )
    return gpt, rows


def lora_gpt(directory: Path, info: dict, base: str | Path | None = None) -> GPT:
    """The LoRA GPT an adapter directory was trained as: its base model with the special tokens' rows
    and LoRA layers added; the adapter's own tensors are loaded by the caller."""
    gpt, _ = with_special_rows(GPT.from_pretrained(adapter_base_dir(directory, info, base)), directory, info)
    add_lora(gpt, lora_settings(info), int(info["lora"]["first_trainable_row"]))
    return gpt
