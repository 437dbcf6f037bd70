"""`/v1/chat/completions` as OpenAI's client calls it: a model fine-tuned with --task generation and
its LoRA twin answer the taught answer, streamed and not, with the log-probabilities the model
itself gives; a model without a chat template gets a 400 that says so."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

openai = pytest.importorskip("openai")

from gptkit.generation import load_for_generation  # noqa: E402
from gptkit.tokenizer import END_OF_TEXT  # noqa: E402
from gptkit.tokenizer.chat_template import CHAT_TEMPLATE, prompt_text  # noqa: E402
from gptkit.train.finetune.config import LoRAConfig  # noqa: E402
from gptkit.train.finetune.tasks import finetune  # noqa: E402
from tests.test_generation_finetune import ANSWER, base_dir, generation_config  # noqa: E402, F401
from tests.test_serve import Server  # noqa: E402

pytestmark = pytest.mark.slow  # training runs and a server in a subprocess

QUESTION = "What colour is the sky over town 777?"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, base_dir) -> dict[str, Path]:  # noqa: F811
    full, lora = tmp_path_factory.mktemp("full"), tmp_path_factory.mktemp("lora")
    finetune(generation_config(full, base_dir))
    finetune(generation_config(lora, base_dir, lora=LoRAConfig(rank=8)))
    return {"tuned": full / "run", "adapter": lora / "run", "base": base_dir}


@pytest.fixture(scope="module")
def server(runs, tmp_path_factory):
    server = Server(runs, tmp_path_factory.mktemp("chat-logs") / "server.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("model", ["tuned", "adapter"])
def test_chat_completions_answer_what_the_run_taught_streamed_and_not(server, runs, model):
    client = server.client()
    messages = [{"role": "user", "content": QUESTION}]
    whole = client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2
    )
    choice = whole.choices[0]
    assert (choice.message.role, choice.message.content, choice.finish_reason) == (
        "assistant",
        ANSWER,
        "stop",
    )
    assert whole.object == "chat.completion" and whole.usage.completion_tokens >= 2  # the answer, its end
    # The log-probabilities are the model's own, computed here from its logits.
    gpt, tokenizer = load_for_generation(runs[model])
    prompt = tokenizer.encode(prompt_text(CHAT_TEMPLATE, QUESTION, END_OF_TEXT))
    first = choice.logprobs.content[0]
    expected = torch.log_softmax(gpt(torch.tensor([prompt])).logits[0, -1].double(), dim=-1)
    assert first.token == tokenizer.decode([tokenizer.encode(" " + ANSWER)[0]])
    assert first.logprob == pytest.approx(float(expected[tokenizer.encode(" " + ANSWER)[0]]), abs=1e-4)
    assert len(first.top_logprobs) == 2 and first.top_logprobs[0].logprob == pytest.approx(
        first.logprob, abs=1e-4
    )

    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, temperature=0, stream=True
    )
    chunks = [chunk for chunk in stream if chunk.choices]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ANSWER
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_model_without_a_chat_template_gets_a_400_that_says_so(server):
    with pytest.raises(openai.BadRequestError, match="has no chat template") as raised:
        server.client().chat.completions.create(model="base", messages=[{"role": "user", "content": "hi"}])
    assert raised.value.body["code"] == "chat_template_missing"


def test_a_message_without_a_known_role_names_the_field(server):
    with pytest.raises(openai.BadRequestError, match=r"messages\[1\]\.role") as raised:
        server.client().chat.completions.create(
            model="tuned", messages=[{"role": "user", "content": "hi"}, {"role": "robot", "content": "beep"}]
        )
    assert raised.value.body["param"] == "messages"
