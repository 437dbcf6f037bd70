"""Fine-tuning for generation: the loss by hand, a batch with nothing to learn, the template that
transformers reads, a run that teaches an answer, and the chat API answering with it."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from pathlib import Path

import pytest
import torch

from gptkit import GPT, GPTConfig
from gptkit.config import IGNORE_INDEX
from gptkit.data.completions import collate_completions, encode_completion
from gptkit.data.examples import Example
from gptkit.data.formats import DataError
from gptkit.model.completion import CompletionModel
from gptkit.tokenizer import END_OF_TEXT, Tokenizer
from gptkit.tokenizer.chat_template import CHAT_TEMPLATE, prompt_text, read_chat_template, render_chat
from gptkit.train.config import TrainConfig
from gptkit.train.finetune.config import LoRAConfig
from gptkit.train.finetune.tasks import FinetuneConfig, finetune, paper_finetuning
from gptkit.train.loop import Trainer
from gptkit.train.run import ModelShape

ANSWER = "blue"


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, small_tokenizer) -> Path:
    """A small GPT-2-form model (random weights, no dropout) with a small byte-level tokenizer. Its
    wide init stands in for pre-trained embeddings: with N(0, 0.02) rows the tied output layer, which
    LoRA leaves frozen, cannot make any answer likely, so an adapter could not learn one."""
    directory = tmp_path_factory.mktemp("base")
    tokenizer = Tokenizer.from_pretrained(small_tokenizer)
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=len(tokenizer),
        context_length=64,
        n_layer=2,
        n_head=2,
        d_model=32,
        dropout=0.0,
        init_std=0.3,
    )
    GPT(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def rows(first: int, count: int) -> list[dict[str, str]]:
    return [
        {"question": f"What colour is the sky over town {i}?", "answer": ANSWER}
        for i in range(first, first + count)
    ]


def write_jsonl(path: Path, items: list[dict]) -> str:
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return str(path)


def example(prompt: str, completion: str) -> Example:
    return Example({"prompt": prompt, "completion": completion}, None, "test, line 1")


def test_an_example_is_the_templated_prompt_then_the_completion_and_its_end_token(base_dir):
    tokenizer = Tokenizer.from_pretrained(base_dir)
    encoded = encode_completion(example("Is it day?", "yes it is"), tokenizer, CHAT_TEMPLATE, 64)
    assert prompt_text(CHAT_TEMPLATE, "Is it day?", END_OF_TEXT) == "User: Is it day?\nAssistant:"
    assert encoded.prompt_ids == tokenizer.encode("User: Is it day?\nAssistant:")
    assert encoded.ids[encoded.answer_start :] == [
        *tokenizer.encode(" yes it is"),
        tokenizer.special_tokens[END_OF_TEXT],
    ]
    # Too long: the prompt loses its start, the answer stays whole; an answer that cannot fit is refused.
    cut = encode_completion(example("word " * 40, "yes"), tokenizer, CHAT_TEMPLATE, 16)
    assert len(cut.ids) == 16
    assert cut.ids[cut.answer_start :] == [*tokenizer.encode(" yes"), tokenizer.special_tokens[END_OF_TEXT]]
    assert (
        cut.prompt_ids
        == tokenizer.encode(prompt_text(CHAT_TEMPLATE, "word " * 40, END_OF_TEXT))[-len(cut.prompt_ids) :]
    )
    with pytest.raises(DataError, match="test, line 1: the completion is"):
        encode_completion(example("hi", "word " * 40), tokenizer, CHAT_TEMPLATE, 16)


@pytest.mark.parametrize("lm_coef", [0.0, 0.5])
def test_the_loss_counts_the_completion_and_its_end_token_as_computed_by_hand(base_dir, lm_coef):
    tokenizer = Tokenizer.from_pretrained(base_dir)
    gpt = GPT.from_pretrained(base_dir)
    encoded = [
        encode_completion(example(p, c), tokenizer, CHAT_TEMPLATE, 64)
        for p, c in [
            ("Is it day?", "yes"),
            ("Name a colour, please.", "deep blue sea"),
            ("Hi", "hello there"),
        ]
    ]
    batch = collate_completions(encoded, pad_to_multiple=8)
    with torch.no_grad():
        out = CompletionModel(gpt, lm_coef)(**batch)
    # By hand: log P(token j | tokens before it) from the model's logits, summed position by position.
    with torch.no_grad():
        log_p = torch.log_softmax(gpt(batch["input_ids"]).logits.double(), dim=-1)
    answer, every = [], []
    for row, e in enumerate(encoded):
        for j in range(1, len(e.ids)):
            term = -float(log_p[row, j - 1, e.ids[j]])
            every.append(term)
            if j >= e.answer_start:  # the completion's tokens and the end token
                answer.append(term)
    assert len(answer) == sum(len(e.ids) - e.answer_start for e in encoded)
    completion_loss, lm_loss = sum(answer) / len(answer), sum(every) / len(every)
    assert float(out.completion_loss) == pytest.approx(completion_loss, rel=1e-5)
    assert float(out.loss) == pytest.approx(completion_loss + lm_coef * lm_loss, rel=1e-5)
    assert int(out.target_tokens) == len(answer)


class OneBatch:
    """A batch source that gives the same batch every time."""

    def __init__(self, batch):
        self.batch = batch

    def next_batch(self):
        return self.batch

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def test_a_batch_without_a_completion_token_leaves_the_weights_unchanged(base_dir, tmp_path):
    tokenizer = Tokenizer.from_pretrained(base_dir)
    encoded = [encode_completion(example("Is it day?", "yes"), tokenizer, CHAT_TEMPLATE, 64)] * 2
    batch = collate_completions(encoded)
    batch["completion_labels"].fill_(IGNORE_INDEX)
    model = CompletionModel(GPT.from_pretrained(base_dir), lm_coef=0.0)
    with torch.no_grad():
        out = model(**batch)
    assert math.isfinite(float(out.loss)) and float(out.loss) == 0.0
    before = {k: v.clone() for k, v in model.state_dict().items()}
    config = TrainConfig(max_steps=2, batch_size=2, lr=1e-2, warmup_steps=0, progress=False, precision="fp32")
    trainer = Trainer(model, config, OneBatch(batch), tmp_path, save_model=lambda d, s: None)
    with pytest.warns(UserWarning, match="no target token in the batch; update skipped"):
        trainer.fit()
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # weight decay and Adam did nothing


def generation_config(tmp_path: Path, base_dir: Path, **overrides) -> FinetuneConfig:
    train = dataclasses.replace(
        paper_finetuning(), lr=1e-2, batch_size=8, log_every=1, precision="fp32", progress=False, seed=3
    )
    settings = dict(
        task="generation",
        train=write_jsonl(tmp_path / "train.jsonl", rows(100, 32)),
        dev=write_jsonl(tmp_path / "dev.jsonl", rows(200, 8)),
        columns="prompt=question,completion=answer",
        model=ModelShape(init=str(base_dir)),
        out=str(tmp_path / "run"),
        epochs=12,
        training=train,
    )
    return FinetuneConfig(**{**settings, **overrides})


def test_the_runs_first_loss_is_the_hand_computed_loss_of_its_batch(tmp_path, base_dir):
    """One batch of every example: the loss logged for update 1 (computed before the update) is
    L2 + λ·L1 of that batch under the initial weights."""
    config = generation_config(tmp_path, base_dir, epochs=1)
    config = dataclasses.replace(
        config, training=dataclasses.replace(config.training, batch_size=32, max_steps=1)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        finetune(config)
    logged = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    tokenizer = Tokenizer.from_pretrained(base_dir)
    encoded = [
        encode_completion(example(r["question"], r["answer"]), tokenizer, CHAT_TEMPLATE, 64)
        for r in rows(100, 32)
    ]
    with torch.no_grad():
        out = CompletionModel(GPT.from_pretrained(base_dir), 0.5)(**collate_completions(encoded))
    assert logged["loss"] == pytest.approx(float(out.loss), rel=1e-4)


def test_a_generation_run_teaches_the_answer_and_keeps_a_template_transformers_reads(tmp_path, base_dir):
    transformers = pytest.importorskip("transformers")
    results = finetune(generation_config(tmp_path, base_dir))
    assert results["task"] == "generation" and results["best"]["dev_exact_match"] == 1.0
    run = tmp_path / "run"
    assert read_chat_template(run) == CHAT_TEMPLATE
    messages = [
        {"role": "user", "content": "What colour is grass?"},
        {"role": "assistant", "content": "green"},
    ]
    messages.append({"role": "user", "content": "And the sky?"})
    hf = transformers.AutoTokenizer.from_pretrained(run)
    assert hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == render_chat(
        CHAT_TEMPLATE, messages, END_OF_TEXT
    )
    # gptkit generate formats the prompt with the template and answers what the run taught.
    from gptkit.generation.sampling import SamplingParams
    from gptkit.generation.text import GenerateConfig, generation_session

    config = GenerateConfig(
        model=str(run),
        prompt="What colour is the sky over town 999?",
        sampling=SamplingParams(max_tokens=8, temperature=0),
    )
    printed = "".join(generation_session(config))
    assert printed == f"User: What colour is the sky over town 999?\nAssistant: {ANSWER}\n"


def test_a_lora_generation_run_writes_its_adapter_and_the_untuned_model_does_not_answer(tmp_path, base_dir):
    from gptkit.generation import GREEDY, generate_text, load_for_generation

    results = finetune(generation_config(tmp_path, base_dir, lora=LoRAConfig(rank=8)))
    run = tmp_path / "run"
    assert (run / "adapter_model.safetensors").is_file() and not (run / "model.safetensors").exists()
    assert results["best"]["dev_exact_match"] == 1.0
    prompt = prompt_text(CHAT_TEMPLATE, "What colour is the sky over town 555?", END_OF_TEXT)
    tuned, tokenizer = load_for_generation(run)
    untuned, _ = load_for_generation(base_dir)
    assert generate_text(tuned, tokenizer, prompt, max_new_tokens=8, params=GREEDY).strip() == ANSWER
    assert generate_text(untuned, tokenizer, prompt, max_new_tokens=8, params=GREEDY).strip() != ANSWER


def test_a_generation_file_without_its_columns_names_the_row(tmp_path, base_dir):
    config = generation_config(tmp_path, base_dir, columns="prompt=q,completion=answer")
    with pytest.raises(DataError, match=r"train.jsonl, line 1: missing column 'q' for field 'prompt'"):
        finetune(config)
