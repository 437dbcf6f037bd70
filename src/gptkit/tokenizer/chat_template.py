"""Prompt templates declared with a model: how a conversation becomes the text the model reads.

A model fine-tuned with ``--task generation`` keeps the template it trained with beside its weights,
as ``chat_template.jinja``, the file transformers reads a chat template from, so that
``apply_chat_template`` in transformers, ``gptkit generate``, the Python API and the server's
``/v1/chat/completions`` all format a conversation the same way. A plain prompt is a conversation of
one user turn.

The template is Jinja, rendered as transformers renders it (a sandbox that trims blocks, with
``messages``, ``add_generation_prompt``, ``eos_token`` and ``raise_exception``). gptkit's own,
:data:`CHAT_TEMPLATE`, writes each turn on a line of its own::

    User: What is 2 + 2?
    Assistant: 4<|endoftext|>

and ends a prompt with ``Assistant:``, where the model's answer begins (a space, then the text, then
the end-of-text token, which is where generation stops).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path

from gptkit.io import atomic_write, read_json_object

CHAT_TEMPLATE_FILE = "chat_template.jinja"
ROLES = ("system", "user", "assistant")
ANSWER_PROMPT = "Assistant:"  # where a generation prompt ends and the answer begins

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{{ message['content'] + '\\n' }}"
    "{%- elif message['role'] == 'user' -%}{{ 'User: ' + message['content'] + '\\n' }}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{ 'Assistant: ' + message['content'] + eos_token + '\\n' }}"
    "{%- else -%}{{ raise_exception('a role is system, user or assistant, not ' + message['role']) }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ 'Assistant:' }}{%- endif -%}"
)


class TemplateError(ValueError):
    """A conversation the template refuses, or a model without a template."""


@functools.lru_cache(maxsize=16)
def _compiled(source: str):
    from jinja2.exceptions import TemplateError as JinjaTemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise JinjaTemplateError(message)

    # transformers' settings for chat templates: the same text from the same template.
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = raise_exception
    return environment.from_string(source)


def check_messages(messages: Sequence[Mapping]) -> list[dict[str, str]]:
    """``messages`` as plain dicts of role and content; a ValueError names the first bad field."""
    if not messages:
        raise TemplateError("messages: at least one message is needed")
    checked = []
    for i, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise TemplateError(f"messages[{i}].role: one of {', '.join(ROLES)}, got {role!r}")
        if not isinstance(content, str):
            raise TemplateError(f"messages[{i}].content: text is needed, got {type(content).__name__}")
        checked.append({"role": role, "content": content})
    return checked


def render_chat(
    template: str, messages: Sequence[Mapping], eos_token: str, add_generation_prompt: bool = True
) -> str:
    """The text of a conversation under ``template``, ending where the assistant's answer begins
    (with ``add_generation_prompt``)."""
    from jinja2.exceptions import TemplateError as JinjaTemplateError

    try:
        return _compiled(template).render(
            messages=check_messages(messages),
            add_generation_prompt=add_generation_prompt,
            eos_token=eos_token,
            bos_token=eos_token,
        )
    except JinjaTemplateError as e:
        raise TemplateError(f"the chat template refused the messages: {e}") from e


def prompt_text(template: str, prompt: str, eos_token: str) -> str:
    """A plain prompt as the model was trained to read it: one user turn, then the answer's start."""
    return render_chat(template, [{"role": "user", "content": prompt}], eos_token)


def completion_text(completion: str) -> str:
    """An answer as it follows the generation prompt: after a space, unless it starts with one (the
    template writes ``Assistant: `` + content, so the tokens agree either way)."""
    return completion if completion[:1].isspace() else " " + completion


def read_chat_template(directory: str | Path) -> str | None:
    """The chat template saved with a model: ``chat_template.jinja``, else transformers' older place,
    ``tokenizer_config.json``'s ``chat_template`` (a string); None where there is none."""
    directory = Path(directory)
    path = directory / CHAT_TEMPLATE_FILE
    if path.is_file():
        return path.read_text(encoding="utf-8")
    config = directory / "tokenizer_config.json"
    if config.is_file():
        value = read_json_object(config).get("chat_template")
        if isinstance(value, str):
            return value
    return None


def write_chat_template(directory: str | Path, template: str) -> None:
    """Keep ``template`` beside a model, where transformers and gptkit read it."""
    atomic_write(
        Path(directory) / CHAT_TEMPLATE_FILE, lambda tmp: Path(tmp).write_text(template, encoding="utf-8")
    )
