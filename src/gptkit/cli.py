"""`gptkit <command>`: a thin shell over the library. Each command parses flags and calls a function.

Every command's flags are generated from the typed dataclass that its library function takes, which
lives beside that function (GenerateConfig in gptkit.generation.text, ServeConfig in
gptkit.serve.config, ...): its fields become the flags, their ``help`` metadata the ``--help`` text,
their defaults the defaults shown. Here are only the flag generator, the parser and the command
table; each ``cmd_*`` calls one library function and prints. Training commands take ``--config
FILE`` (YAML or JSON) for the same fields; flags override it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import types
import typing
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

# Dataclass flags ----------------------------------------------------------------------------------


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _base_type(annotation):
    """(python type, choices, container) of a field annotation such as ``int | None``,
    ``Literal[...]`` or ``tuple[str, ...]``; container is list, tuple or None (one value)."""
    origin = get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
        origin = get_origin(annotation)
    if origin in (list, tuple):  # list[str], tuple[str, ...]: several values of one type
        kind, choices, _ = _base_type(get_args(annotation)[0])
        return kind, choices, origin
    if origin is Literal:
        choices = list(get_args(annotation))
        return type(choices[0]), choices, None
    return annotation, None, None


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _help(text: str, default: Any) -> str:
    # argparse %-formats help strings: a literal % must be doubled.
    text = text.replace("%", "%%")
    if "(default" in text or "(required)" in text or default is dataclasses.MISSING:
        return text
    shown = "none" if default is None or default == () or default == [] else default
    return f"{text} (default: {shown})"


def _nested_view(
    f: dataclasses.Field, only: set[str] | None, helps: dict[str, str]
) -> tuple[set[str] | None, dict[str, str]]:
    """Which flags the nested config of field ``f`` shows, and their help texts: a command that
    names the field (or shows every flag) leaves the choice to the field's own ``flags`` metadata
    (None: all); the containing command's ``field_help`` wins over the field's."""
    if only is None or f.name in only:
        own = f.metadata.get("flags")
        only = None if own is None else set(own)
    return only, {**f.metadata.get("field_help", {}), **helps}


class _DeprecatedFlag(argparse.Action):
    """An old spelling of a flag, kept for scripts: it says so on stderr, then sets the new one
    (a switch without a value, ``--greedy``, sets its ``const``)."""

    def __init__(self, option_strings, dest, new_flag: str, **options):
        super().__init__(option_strings, dest, **options)
        self.new_flag = new_flag

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{option_string} is deprecated: use {self.new_flag}", file=sys.stderr)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def add_dataclass_arguments(
    parser: argparse.ArgumentParser,
    cls,
    defaults: Any = None,
    *,
    only: set[str] | None = None,
    helps: dict[str, str] | None = None,
    prefix: str = "",
    config_file: bool = False,
    description: str | None = None,
) -> None:
    """One flag per field of ``cls`` (positional where the field's metadata says so), its default
    taken from the ``defaults`` instance when one is given. A field that is itself a config
    (``FinetuneConfig.training``, ``ServeConfig.limits``) contributes its fields' flags under their
    own names (after the nested class's ``flag_prefix``: LoRAConfig.rank is ``--lora-rank``), with the
    defaults of the field's default instance: the command's defaults, which may differ from the nested
    class's own. The nesting field's metadata may narrow and reword them: ``flags``, the flag names
    (without dashes) the command shows, a nested field's name showing all of it; ``field_help``, a
    help text per flag name, in the command's words; ``help``, the group's description.

    A field's metadata may say more: ``cli=False``, no flag; ``deprecated``, old flags that still set
    it, hidden, with a warning; ``deprecated_switches``, old flags without a value that set it to one
    (``--greedy``: ``--temperature 0``); ``replaced_by``, the field is itself an old flag, shown, that
    warns when used. With ``config_file`` (the command takes ``--config FILE``) a required field's
    flag may be left out, since the file may give it: :func:`dataclass_from_args` checks it."""
    hints = typing.get_type_hints(cls)
    prefix += getattr(cls, "flag_prefix", "")
    helps = helps or {}
    group = None
    for f in dataclasses.fields(cls):
        if not f.metadata.get("cli", True):
            continue
        default = _default(f) if defaults is None else getattr(defaults, f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            nested_only, nested_helps = _nested_view(f, only, helps)
            add_dataclass_arguments(
                parser, hints[f.name], defaults=default, only=nested_only, helps=nested_helps,
                prefix=prefix, config_file=config_file, description=f.metadata.get("help"),
            )  # fmt: skip
            continue
        dest = prefix + f.name
        if only is not None and dest not in only:
            continue
        if group is None:  # made at the first flag: a config whose flags are all hidden shows no group
            text = description or (cls.__doc__ or "").split("\n\n")[0]
            group = parser.add_argument_group(cls.__name__, text)
        kind, choices, container = _base_type(hints[f.name])
        is_list = container is not None
        required = default is dataclasses.MISSING
        text = helps.get(dest, f.metadata.get("help", ""))
        options: dict[str, Any] = {"help": _help(text, default), "default": None}
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        else:
            options.update(type=kind, choices=choices)
            if not choices:
                options["metavar"] = f.metadata.get("metavar", dest.upper())
            if is_list:
                options["nargs"] = "+" if required else "*"
                if f.metadata.get("repeat"):  # --stop A --stop B
                    options.update(action="append", nargs=None)
        if "replaced_by" in f.metadata:  # the field is an old flag itself: it says so when used
            options.update(action=_DeprecatedFlag, new_flag=_flag(f.metadata["replaced_by"]))
        if f.metadata.get("positional"):
            options.pop("default")
            if not required:
                options["nargs"] = "?" if not is_list else "*"
            group.add_argument(dest, **options)
            continue
        group.add_argument(_flag(dest), dest=dest, required=required and not config_file, **options)
        for old in f.metadata.get("deprecated", ()):
            hidden = {**options, "help": argparse.SUPPRESS, "action": _DeprecatedFlag}
            group.add_argument(_flag(old), dest=dest, new_flag=_flag(dest), **hidden)
        for old, value in f.metadata.get("deprecated_switches", {}).items():
            new_flag = f"{_flag(dest)} {value:g}"
            group.add_argument(
                _flag(old), dest=dest, action=_DeprecatedFlag, nargs=0, const=value, default=None,
                new_flag=new_flag, help=f"Deprecated spelling of {new_flag}.",
            )  # fmt: skip


def flag_names(cls, only: set[str] | None = None, prefix: str = "") -> list[str]:
    """The flag names (without dashes) that :func:`add_dataclass_arguments` makes for ``cls``: the
    names a config file may set."""
    hints = typing.get_type_hints(cls)
    prefix += getattr(cls, "flag_prefix", "")
    names: list[str] = []
    for f in dataclasses.fields(cls):
        if not f.metadata.get("cli", True):
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            names += flag_names(hints[f.name], _nested_view(f, only, {})[0], prefix)
        elif only is None or prefix + f.name in only:
            names.append(prefix + f.name)
    return names


def dataclass_from_args(
    cls,
    args: argparse.Namespace,
    file_values: dict[str, Any] | None = None,
    defaults: Any = None,
    *,
    only: set[str] | None = None,
    prefix: str = "",
    source: str = "config file",
):
    """Defaults (the ``defaults`` instance's values, when given), then values from the config file
    (by flag name: :func:`flag_names`; ``source`` names the file in errors), then explicit flags. A
    field that is itself a config is built the same way, from its default instance: the containing
    config's default for that field, which may differ from the nested class's own defaults."""
    fields = dataclasses.fields(cls)
    values = {} if defaults is None else {f.name: getattr(defaults, f.name) for f in fields}
    file_values = file_values or {}
    hints = typing.get_type_hints(cls)
    prefix += getattr(cls, "flag_prefix", "")
    from_file: set[str] = set()  # fields whose value the file gave
    for f in fields:
        if not f.metadata.get("cli", True):
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            start = values.get(f.name, _default(f))
            values[f.name] = dataclass_from_args(
                hints[f.name], args, file_values, defaults=None if start is dataclasses.MISSING else start,
                only=_nested_view(f, only, {})[0], prefix=prefix, source=source,
            )  # fmt: skip
            continue
        dest = prefix + f.name
        if only is not None and dest not in only:
            continue
        value = getattr(args, dest, None)
        if value is None and dest in file_values:
            value = _file_value(hints[f.name], file_values[dest], f"{source}: {dest}")
            from_file.add(f.name)
            if value is None:  # null in the file: none, even where the default is something
                values[f.name] = None
                continue
        if value is not None:
            values[f.name] = tuple(value) if _base_type(hints[f.name])[2] is tuple else value
        elif f.name not in values and _default(f) is dataclasses.MISSING:
            # Only a command with --config FILE gets here: its parser lets the flag be left out.
            flag = _flag(dest)
            raise ValueError(
                f"{cls.__name__}.{f.name} ({flag}): is required: give {flag}, or {dest} in --config FILE"
            )
    try:
        return cls(**values)
    except ValueError as e:
        # A value the file gave failed the config's own checks (``Class.field (--flag): ...``).
        if any(str(e).startswith(f"{cls.__name__}.{name} ") for name in from_file):
            raise ValueError(f"{source}: {e}") from e
        raise


def _file_value(annotation: Any, value: Any, where: str) -> Any:
    """A config file's value for a field annotated ``annotation``, as the flag would have parsed it:
    of the field's type (an integer is a number too), one of its choices, a list of them for a
    list field; otherwise a ValueError that says ``where`` (the file and the field)."""
    kind, choices, container = _base_type(annotation)
    if value is None:
        if type(None) in get_args(annotation):
            return None
        raise ValueError(f"{where}: must have a value, not null")
    if container is not None:
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list, got {_shown(value)}")
        return [_one_file_value(kind, choices, item, where) for item in value]
    return _one_file_value(kind, choices, value, where)


def _one_file_value(kind: type, choices: list | None, value: Any, where: str) -> Any:
    expected = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(kind)
    # What the flag would read from the same characters: YAML reads 1e-3 as a string (its floats
    # need a dot), and 90 where a duration belongs as a number.
    if kind in (int, float) and isinstance(value, str):
        try:
            value = kind(value)
        except ValueError:
            pass
    elif kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if expected is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
        raise ValueError(f"{where}: expected {expected}, got {_shown(value)}")
    if choices and value not in choices:
        raise ValueError(f"{where}: must be one of {', '.join(map(str, choices))}, got {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    """A value as an error shows it: on one line, and short."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def read_config_file(path: str | None) -> dict[str, Any]:
    """A YAML or JSON file of fields; sections named after the config classes may group them."""
    if not path:
        return {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start})") from e
    try:
        if path.endswith((".yaml", ".yml")):
            data = _read_yaml(path, text)
        else:
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from e
    except RecursionError as e:
        raise ValueError(f"{path}: nested too deeply to be a config file") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of field names to values")
    return data


def _read_yaml(path: str, text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ValueError(f"{path}: not valid YAML ({where}{' '.join(str(problem).split())})") from e


def _prefixes(cls) -> dict[str, str]:
    """The flag prefix of each nested config field of ``cls`` that has one ({"lora": "lora_"})."""
    hints = typing.get_type_hints(cls)
    prefixes: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            if getattr(hints[f.name], "flag_prefix", ""):
                prefixes[f.name] = hints[f.name].flag_prefix
            prefixes.update(_prefixes(hints[f.name]))
    return prefixes


def _flatten(data: dict[str, Any], prefixes: dict[str, str], prefix: str = "") -> dict[str, Any]:
    """A config file's values by flag name: sections ({"train": {...}}) and nested configs
    ({"model": {...}}, {"lora": {"rank": 4}} as ``dataclasses.asdict`` writes them) opened, at any
    depth, a nested config's keys given its flag prefix (``lora_rank``) unless they carry it."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise ValueError(f"field names are strings, not {_shown(key)}")
        if isinstance(value, dict):
            flat.update(_flatten(value, prefixes, prefix + prefixes.get(key, "")))
        else:
            flat[key if key.startswith(prefix) else prefix + key] = value
    return flat


def _split_file_values(data: dict[str, Any], *classes, source: str = "config file") -> list[dict[str, Any]]:
    """Route flat or sectioned ({"train": {...}}) config-file values to each dataclass, by the flag
    names it makes; ``source`` names the file in errors."""
    try:
        flat = _flatten(data, {k: v for cls in classes for k, v in _prefixes(cls).items()})
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from e
    out, claimed = [], set()
    for cls in classes:
        names = set(flag_names(cls))
        out.append({k: v for k, v in flat.items() if k in names})
        claimed |= names
    unknown = sorted(set(flat) - claimed)
    if unknown:
        raise ValueError(f"{source}: unknown field(s): {', '.join(map(_shown, unknown))}")
    return out


# The commands -------------------------------------------------------------------------------------


def cmd_convert(config) -> None:
    from gptkit.model.convert import convert_weights
    from gptkit.model.weights import hf_model_type

    model = convert_weights(config)
    kind = hf_model_type(model.config)
    print(f"wrote {config.destination} ({kind} format, {model.num_parameters():,} parameters)")


def cmd_download(config) -> None:
    from gptkit.hub import download

    print(download(config))


def cmd_tokenizer_train(config) -> None:
    from gptkit.tokenizer.train import train_tokenizer

    tokenizer = train_tokenizer(config)
    print(f"wrote {config.out}: {len(tokenizer)} tokens ({config.style})")


def cmd_tokenize(config) -> None:
    from gptkit.tokenizer.base import tokenize_file

    print(tokenize_file(config))


def cmd_prepare(config) -> None:
    from gptkit.data.prepare import prepare_shards

    counts = prepare_shards(config)["counts"]
    print(f"wrote {config.out}: {counts['train']:,} training and {counts['val']:,} validation tokens")


def cmd_pretrain(config) -> None:
    from gptkit.train.pretrain import pretrain

    metrics = pretrain(config)
    print(json.dumps({"out": config.out, **metrics}))


def cmd_finetune(config) -> None:
    from gptkit.train.finetune import finetune

    print(json.dumps(finetune(config)))


def cmd_estimate(config) -> None:
    from gptkit.train.estimate import (
        FinetuneEstimateConfig,
        estimate_finetune,
        estimate_pretrain,
        format_estimate,
    )

    finetuning = isinstance(config, FinetuneEstimateConfig)
    result = estimate_finetune(config) if finetuning else estimate_pretrain(config)
    print(json.dumps(result.to_dict()) if config.estimate.json else format_estimate(result))


def cmd_evaluate(config) -> None:
    from gptkit.evaluate.finetuned import evaluate_labelled

    print(json.dumps(evaluate_labelled(config)))


def cmd_predict(config) -> None:
    from gptkit.evaluate.finetuned import predict_to_file

    records = predict_to_file(config)
    print(f"wrote {len(records)} predictions to {config.out}")


def cmd_generate(config) -> None:
    from gptkit.generation.text import generation_session

    for piece in generation_session(config):
        sys.stdout.write(piece)
        sys.stdout.flush()


def cmd_serve(config) -> None:
    from gptkit.serve import run_server

    run_server(config)


def cmd_perplexity(config) -> None:
    from gptkit.evaluate.lm import perplexity_of_file

    print(json.dumps(perplexity_of_file(config)))


def cmd_zeroshot(config) -> None:
    from gptkit.evaluate.zeroshot import run_zeroshot

    for record in run_zeroshot(config):
        print(json.dumps(record), flush=True)


def cmd_tradeoff(config) -> None:
    from gptkit.evaluate.tradeoff import format_table, run_tradeoff

    print(format_table(run_tradeoff(config)))
    print(f"wrote {config.out}/tradeoff.json, tradeoff.txt, tradeoff.png")


def cmd_data_fetch(config) -> None:
    from gptkit.data.fetch import fetch_datasets

    written = fetch_datasets(config)
    print(f"{len(written)} file(s) written to {config.out}")


def cmd_export(config) -> None:
    from gptkit.export import export_model

    path = export_model(config)
    print(f"wrote {path} ({config.resolved_format()}, {config.quantize}, {path.stat().st_size:,} bytes)")


def cmd_suite(config) -> None:
    from gptkit.paper.suite import run_suite

    run_suite(config)
    print(f"\nresults: {Path(config.out) / 'results.md'} and results.json")


def cmd_figure2_layers(config) -> None:
    from gptkit.paper.figures import transfer_curve

    transfer_curve(config)
    print(f"wrote {config.out}/layers.json, layers.md, layers.png")


def cmd_figure2_zeroshot(config) -> None:
    from gptkit.paper.figures import zeroshot_curve

    zeroshot_curve(config)
    print(f"wrote {config.out}/zeroshot.json, zeroshot.md, zeroshot.png")


def cmd_demo(config) -> None:
    from gptkit.demo import run_demo

    run_demo(config)


def cmd_harness(config) -> None:
    from gptkit.evaluate.harness import results_table, run_harness

    results = run_harness(config)
    print(results_table(results), file=sys.stderr)
    print(json.dumps({"model": config.model, "results": results.get("results", {})}), flush=True)


# The parser ---------------------------------------------------------------------------------------


@dataclass
class Command:
    name: str  # "tokenizer train" for a sub-command
    configs: tuple[type, ...]
    run: Callable[..., None]
    config_file: bool = False  # --config FILE for the training commands
    summary: str = ""  # the help line; by default the first line of the first config's docstring
    # --recipe NAME: named values (by flag name) under the config file's and the flags.
    recipes: dict[str, Any] | None = None

    def help(self) -> str:
        return self.summary or (self.configs[0].__doc__ or "").strip().split("\n")[0]


def _commands() -> list[Command]:
    # Imported here rather than at the top: the training modules are the heaviest of the package.
    from gptkit.data.fetch import FetchConfig
    from gptkit.data.prepare import PrepareConfig
    from gptkit.demo import DemoConfig
    from gptkit.evaluate.finetuned import LabelledDataConfig, PredictConfig
    from gptkit.evaluate.harness import HarnessConfig
    from gptkit.evaluate.lm import PerplexityConfig
    from gptkit.evaluate.tradeoff import TradeoffConfig
    from gptkit.evaluate.zeroshot import ZeroshotConfig
    from gptkit.export import ExportConfig
    from gptkit.generation.text import GenerateConfig
    from gptkit.hub import DownloadConfig
    from gptkit.model.convert import ConvertConfig
    from gptkit.paper.figures import TransferConfig, ZeroshotCurveConfig
    from gptkit.paper.suite import SuiteConfig
    from gptkit.serve.config import ServeConfig
    from gptkit.tokenizer.base import TokenizeConfig
    from gptkit.tokenizer.train import TokenizerTrainConfig
    from gptkit.train.checkpoint_export import CheckpointExportConfig, cmd_checkpoint_export
    from gptkit.train.estimate import FinetuneEstimateConfig, PretrainEstimateConfig
    from gptkit.train.finetune import FinetuneConfig
    from gptkit.train.pretrain import PretrainConfig
    from gptkit.train.recipes import RECIPES

    return [
        Command("download", (DownloadConfig,), cmd_download),
        Command("convert", (ConvertConfig,), cmd_convert),
        Command("export", (ExportConfig,), cmd_export),
        Command("tokenizer train", (TokenizerTrainConfig,), cmd_tokenizer_train),
        Command("tokenize", (TokenizeConfig,), cmd_tokenize),
        Command("prepare", (PrepareConfig,), cmd_prepare),
        Command(
            "pretrain",
            (PretrainConfig,),
            cmd_pretrain,
            config_file=True,
            summary="Pre-train a GPT (L1) on prepared token shards.",
            recipes=RECIPES,
        ),
        Command(
            "finetune",
            (FinetuneConfig,),
            cmd_finetune,
            config_file=True,
            summary="Fine-tune on a labelled task (L3 = L2 + λ·L1), with the paper's defaults.",
        ),
        Command("checkpoint export", (CheckpointExportConfig,), cmd_checkpoint_export),
        Command("estimate pretrain", (PretrainEstimateConfig,), cmd_estimate, config_file=True),
        Command("estimate finetune", (FinetuneEstimateConfig,), cmd_estimate, config_file=True),
        Command("evaluate", (LabelledDataConfig,), cmd_evaluate),
        Command("predict", (PredictConfig,), cmd_predict),
        Command("generate", (GenerateConfig,), cmd_generate),
        Command("serve", (ServeConfig,), cmd_serve),
        Command("perplexity", (PerplexityConfig,), cmd_perplexity),
        Command("zeroshot", (ZeroshotConfig,), cmd_zeroshot),
        Command("harness", (HarnessConfig,), cmd_harness),
        Command("analyze tradeoff", (TradeoffConfig,), cmd_tradeoff),
        Command(
            "suite",
            (SuiteConfig,),
            cmd_suite,
            config_file=True,
            summary="Fine-tune on the paper's twelve tasks; results beside Tables 2-5.",
        ),
        Command("figure2 layers", (TransferConfig,), cmd_figure2_layers, config_file=True),
        Command("figure2 zeroshot", (ZeroshotCurveConfig,), cmd_figure2_zeroshot),
        Command("data fetch", (FetchConfig,), cmd_data_fetch),
        Command("demo", (DemoConfig,), cmd_demo),
    ]


_GROUPS = {
    "tokenizer": "Tokenizer tools.",
    "data": "Sample datasets.",
    "analyze": "Analyses of a model.",
    "checkpoint": "Training checkpoints.",
    "estimate": "Memory per device of a training run, simulated on fake tensors (no data, no GPU).",
    "figure2": "The paper's Figure 2: transferred layers (left), zero-shot during pre-training (right).",
}


def build_parser() -> argparse.ArgumentParser:
    from gptkit import __version__

    parser = argparse.ArgumentParser(prog="gptkit", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"gptkit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}
    for command in _commands():
        summary = command.help()
        group, _, action = command.name.partition(" ")
        if action:
            if group not in groups:
                p = commands.add_parser(group, help=_GROUPS[group], description=_GROUPS[group])
                groups[group] = p.add_subparsers(dest=f"{group}_command", required=True, metavar="ACTION")
            p = groups[group].add_parser(action, help=summary, description=summary)
        else:
            p = commands.add_parser(group, help=summary, description=summary)
        if command.config_file:
            p.add_argument("--config", help="YAML or JSON file of the fields below; flags override it.")
        if command.recipes:
            p.add_argument(
                "--recipe",
                choices=list(command.recipes),
                help="Start from a named recipe's shape and optimisation (minutes: the demo's, chosen for "
                "a CPU's minutes; baseline: GPT-2 small's settings scaled down); --config and the flags "
                "override it (default: none).",
            )
        for cls in command.configs:
            add_dataclass_arguments(p, cls, config_file=command.config_file)
        p.set_defaults(command_spec=command)
    return parser


def _build_configs(command: Command, args: argparse.Namespace) -> list[Any]:
    if command.config_file:
        data = read_config_file(args.config)
        if command.recipes and args.recipe:
            data = {**command.recipes[args.recipe].values(), **data}  # the file's values win
        source = args.config or f"recipe {getattr(args, 'recipe', None)}"
        file_values = _split_file_values(data, *command.configs, source=source)
    else:
        source, file_values = "config file", [{} for _ in command.configs]
    return [
        dataclass_from_args(cls, args, values, source=source)
        for cls, values in zip(command.configs, file_values)
    ]


@contextlib.contextmanager
def one_line_warnings(prefix: str):
    """Print warnings as ``PREFIX: warning: MESSAGE``, one line each: the message says what happened
    and what to do, while the file, line and source line Python adds (``warnings.warn(...)``) tell
    a user nothing."""

    def one_line(message, category, filename, lineno, line=None) -> str:
        kind = "warning" if category is UserWarning else category.__name__
        return f"{prefix}: {kind}: {message}\n"

    previous, warnings.formatwarning = warnings.formatwarning, one_line
    try:
        yield
    finally:
        warnings.formatwarning = previous


def main(argv: list[str] | None = None) -> int:
    """Run one command; errors a user can act on (ValueError, OSError, ImportError) are printed as
    one line and return 2, Ctrl-C and SIGTERM return 128 + the signal."""
    args = build_parser().parse_args(argv)
    command: Command = args.command_spec
    try:
        with one_line_warnings(f"gptkit {command.name}"):
            command.run(*_build_configs(command, args))
    except (ValueError, OSError, ImportError) as e:
        print(f"gptkit {command.name}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"gptkit {command.name}: {str(e) or 'interrupted'}", file=sys.stderr)
        return getattr(e, "exit_code", 130)  # 128 + the signal: 130 for Ctrl-C, 143 for SIGTERM
    return 0
