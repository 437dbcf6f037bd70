"""`gptkit <command>`: a thin shell over the library. Each command parses flags and calls a function.

Every command's flags are generated from a typed dataclass: its fields become the flags, their
``help`` metadata the ``--help`` text, their defaults the defaults shown. Training commands take
``--config FILE`` (YAML or JSON) for the same fields; flags override it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from gptkit.generation.sampling import SamplingParams
from gptkit.generation.text import InferenceConfig
from gptkit.hardware import DEVICE_HELP

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


def _help(f: dataclasses.Field, default: Any) -> str:
    # argparse %-formats help strings: a literal % must be doubled.
    text = f.metadata.get("help", "").replace("%", "%%")
    if "(default" in text or default is dataclasses.MISSING:
        return text
    shown = "none" if default is None or default == () or default == [] else default
    return f"{text} (default: {shown})"


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
    parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = (), defaults: Any = None
) -> None:
    """One flag per field of ``cls`` (positional where the field's metadata says so), its default
    taken from the ``defaults`` instance when one is given. A field that is itself a config
    (``ServeConfig.limits``, ``GenerateConfig.sampling``) contributes its fields' flags, with the
    defaults of the field's default instance. A field's metadata may say more: ``cli=False``, no flag;
    ``deprecated``, old flags that still set it, hidden, with a warning; ``deprecated_switches``,
    old flags without a value that set it to one (``--greedy``: ``--temperature 0``)."""
    hints = typing.get_type_hints(cls)
    group = parser.add_argument_group(cls.__name__, (cls.__doc__ or "").split("\n\n")[0])
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.metadata.get("cli", True):
            continue
        default = _default(f) if defaults is None else getattr(defaults, f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            add_dataclass_arguments(parser, hints[f.name], defaults=default)
            continue
        kind, choices, container = _base_type(hints[f.name])
        is_list = container is not None
        required = default is dataclasses.MISSING
        options: dict[str, Any] = {"help": _help(f, default), "default": None}
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        else:
            options.update(type=kind, choices=choices)
            if not choices:
                options["metavar"] = f.metadata.get("metavar", f.name.upper())
            if is_list:
                options["nargs"] = "+" if required else "*"
                if f.metadata.get("repeat"):  # --stop A --stop B
                    options.update(action="append", nargs=None)
        if f.metadata.get("positional"):
            options.pop("default")
            if not required:
                options["nargs"] = "?" if not is_list else "*"
            group.add_argument(f.name, **options)
            continue
        group.add_argument(_flag(f.name), required=required, **options)
        for old in f.metadata.get("deprecated", ()):
            hidden = {**options, "help": argparse.SUPPRESS, "action": _DeprecatedFlag}
            group.add_argument(_flag(old), dest=f.name, new_flag=_flag(f.name), **hidden)
        for old, value in f.metadata.get("deprecated_switches", {}).items():
            new_flag = f"{_flag(f.name)} {value:g}"
            group.add_argument(
                _flag(old), dest=f.name, action=_DeprecatedFlag, nargs=0, const=value, default=None,
                new_flag=new_flag, help=f"Deprecated spelling of {new_flag}.",
            )  # fmt: skip


def dataclass_from_args(
    cls, args: argparse.Namespace, file_values: dict[str, Any] | None = None, defaults: Any = None
):
    """Defaults (the ``defaults`` instance's values, when given), then values from the config file,
    then explicit flags. A field that is itself a config is built the same way, from its default
    instance: ``GenerateConfig().sampling`` starts at 50 tokens, not SamplingParams' 16."""
    fields = dataclasses.fields(cls)
    values = {} if defaults is None else {f.name: getattr(defaults, f.name) for f in fields}
    values.update(file_values or {})
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(file_values or {}) - {f.name for f in fields})
    if unknown:
        raise SystemExit(f"config file: unknown field(s) for {cls.__name__}: {', '.join(unknown)}")
    for f in fields:
        if not f.metadata.get("cli", True):
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            start = values.get(f.name, _default(f))
            values[f.name] = dataclass_from_args(
                hints[f.name], args, defaults=None if start is dataclasses.MISSING else start
            )
            continue
        value = getattr(args, f.name, None)
        if value is not None:
            values[f.name] = tuple(value) if _base_type(hints[f.name])[2] is tuple else value
    return cls(**values)


def read_config_file(path: str | None) -> dict[str, Any]:
    """A YAML or JSON file of fields; sections named after the config classes may group them."""
    if not path:
        return {}
    text = Path(path).read_text(encoding="utf-8")
    if path.endswith((".yaml", ".yml")):
        import yaml

        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as e:
            raise ValueError(f"{path}: not valid YAML ({e})") from e
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of field names to values")
    return data


def _split_file_values(data: dict[str, Any], *classes) -> list[dict[str, Any]]:
    """Route flat or sectioned ({"train": {...}}) config-file values to each dataclass."""
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(value)
        else:
            flat[key] = value
    out, claimed = [], set()
    for cls in classes:
        names = {f.name for f in dataclasses.fields(cls)}
        out.append({k: v for k, v in flat.items() if k in names})
        claimed |= names
    unknown = sorted(set(flat) - claimed)
    if unknown:
        raise ValueError(f"config file: unknown field(s): {', '.join(unknown)}")
    return out


def _arg(help: str, default: Any = dataclasses.MISSING, **metadata) -> Any:
    """A field with its help text: ``_arg("Tokens to generate.", 50)``; no default means required."""
    return field(default=default, metadata={"help": help, **metadata})


# The commands' configs ----------------------------------------------------------------------------


@dataclass
class ConvertConfig:
    """Convert weights: a HF directory, a gptkit directory or OpenAI's GPT-1 release → a HF/gptkit directory."""

    source: str = _arg("Directory (or hub name) to read.", positional=True)
    destination: str = _arg("Directory to write (config.json + model.safetensors).", positional=True)
    n_head: int = _arg("Heads, for OpenAI's release, which does not record them.", 12)


@dataclass
class TokenizerTrainConfig:
    """Train a BPE vocabulary on your corpus, in GPT-1's or GPT-2's file format."""

    corpus: list[str] = _arg("Text files to learn the merges from.")
    vocab_size: int = _arg("Tokens in the vocabulary, special tokens included.")
    out: str = _arg("Directory to write the tokenizer to.")
    style: Literal["bytelevel", "gpt1"] = _arg(
        "bytelevel (GPT-2's byte-level BPE) or gpt1 (ftfy + spaCy + </w> word ends).", "bytelevel"
    )
    min_frequency: int = _arg("Merge only pairs seen at least this often.", 2)


@dataclass
class TokenizeConfig:
    """Print the token ids of a file (or stdin), or decode ids back to text."""

    tokenizer: str = _arg("Tokenizer directory.")
    file: str | None = _arg("Text file (default: stdin).", None, positional=True)
    decode: bool = _arg("Read whitespace-separated ids and print the text.", False)
    raw: bool = _arg("With --decode: GPT-1's raw token text, not joined as written.", False)


@dataclass
class PrepareConfig:
    """Tokenize a corpus into token shards (train.bin, val.bin, meta.json) for pre-training."""

    files: list[str] = _arg(
        "Corpus files or folders: plain text (one document per file), JSON lines (.jsonl), parquet, "
        ".arrow, a `datasets` save_to_disk folder (one document per row); text and JSON lines may be "
        ".gz or .zst.",
        positional=True,
    )
    tokenizer: str = _arg("Tokenizer directory.")
    out: str = _arg("Directory to write the shards to.")
    val_fraction: float = _arg(
        "Share held out for validation: of every plain-text file's bytes; every ⌈1/fraction⌉-th row of a "
        "row file.",
        0.05,
    )
    text_field: str = _arg(
        "The field (JSON lines) or column (parquet, arrow) that holds a row's text.", "text"
    )
    jsonl_field: str | None = _arg(
        "Deprecated: --text-field, and every file of no row format read as JSON lines.", None
    )
    workers: int | None = _arg(
        "Processes that tokenize, this one included (default: the CPU cores for GPT-1-style tokenizers, "
        "1 for byte-level).",
        None,
    )
    errors: Literal["strict", "replace", "ignore"] = _arg(
        "Bytes that are not UTF-8 in text and JSON lines: replace reads each as U+FFFD and warns with "
        "their count; strict stops at the first, naming file, line and column; ignore drops them "
        "silently. Files with NUL bytes are refused in every mode, and with replace also files whose "
        "start is more than 1% such bytes (binary files).",
        "replace",
    )


@dataclass
class GenerateConfig(InferenceConfig):
    """Generate text from a prompt, printing it as it is decoded."""

    model: str = _arg("Model directory (HF, gptkit or converted GPT-1 release) or hub name.")
    prompt: str = _arg("Text to continue (empty: start from the start/end-of-text token).", "")
    tokenizer: str | None = _arg("Tokenizer directory (default: the model directory).", None)
    interactive: bool = _arg("Read prompts from stdin, one a line, until EOF.", False)
    # `gptkit generate` continues for 50 tokens (SamplingParams' own default, the server's, is 16).
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(max_tokens=50))
    num_samples: int = _arg("Samples per prompt.", 1)
    raw: bool = _arg("Print GPT-1's raw token text (`did n't`) instead of text as written.", False)


@dataclass
class HarnessConfig:
    """lm-evaluation-harness's tasks on a gptkit model (pip install 'gptkit[eval]'); lm-eval's results."""

    model: str = _arg("Model directory: a run directory, or any that GPT.from_pretrained reads.")
    tasks: list[str] = _arg(
        "lm-eval task names (hellaswag, lambada_openai, arc_easy, ...; `lm_eval ls tasks` lists them), "
        "or tasks of your own from --include-path."
    )
    include_path: str | None = _arg("A folder of task YAMLs of your own, found beside lm-eval's.", None)
    include_defaults: bool = _arg(
        "Index lm-eval's own tasks too (about 15,000; seconds): --no-include-defaults for --include-path's only.",
        True,
    )
    limit: float | None = _arg("Score the first N examples of each task (below 1: that fraction).", None)
    num_fewshot: int | None = _arg("Examples shown before each question (default: the task's).", None)
    batch_size: int = _arg("Sequences per forward pass.", 32)
    dtype: Literal["float32", "bfloat16"] = _arg(
        "Weights and scores: float32 (exact) or bfloat16.", "float32"
    )
    device: str = _arg(DEVICE_HELP, "auto")
    output_path: str | None = _arg(
        "Write lm-eval's results file here, as lm_eval --output_path does (DIR/<model>/results_<date>.json).",
        None,
    )
    log_samples: bool = _arg("Also write every example's prompt and scores (with --output-path).", False)


@dataclass
class DemoConfig:
    """The whole job on the sample data: tokenizer, pre-training, fine-tuning, generation."""

    data: str = _arg("The shared data directory.")
    out: str = _arg("Run directory (replaced if the demo made it).", "runs/demo")
    quick: bool = _arg("A much shorter run (seconds), to check the plumbing.", False)
    time_budget: str = _arg("Wall-clock budget for pre-training.", "5m")
    precision: Literal["auto", "fp32", "bf16"] = _arg("Training precision (auto: by the hardware).", "auto")
    device: str = _arg(DEVICE_HELP, "auto")
    recipe: Literal["minutes", "baseline"] = _arg(
        "Pre-training recipe: minutes (chosen for a CPU's minutes), or baseline (the demo's before issue 18).",
        "minutes",
    )


# The commands -------------------------------------------------------------------------------------


def cmd_convert(args: ConvertConfig) -> None:
    from gptkit.model import GPT
    from gptkit.model.weights import hf_model_type

    model = GPT.from_pretrained(args.source, n_head=args.n_head)
    model.save_pretrained(args.destination)
    kind = hf_model_type(model.config)
    print(f"wrote {args.destination} ({kind} format, {model.num_parameters():,} parameters)")


def cmd_tokenizer_train(args: TokenizerTrainConfig) -> None:
    from gptkit.tokenizer import train_bpe

    tok = train_bpe(
        args.corpus, args.vocab_size, args.out, style=args.style, min_frequency=args.min_frequency
    )
    print(f"wrote {args.out}: {len(tok)} tokens ({args.style})")


def cmd_tokenize(args: TokenizeConfig) -> None:
    from gptkit.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(args.tokenizer)
    text = Path(args.file).read_text(encoding="utf-8") if args.file else sys.stdin.read()
    if args.decode:
        ids = [int(x) for x in text.split()]
        print(tok.decode(ids) if args.raw else tok.decode_text(ids))
    else:
        print(" ".join(map(str, tok.encode(text))))


def cmd_prepare(args: PrepareConfig) -> None:
    from gptkit.data.shards import prepare

    field_option = {"text_field": args.text_field}
    if args.jsonl_field is not None:
        print("gptkit prepare: --jsonl-field is deprecated: use --text-field", file=sys.stderr)
        field_option = {"jsonl_field": args.jsonl_field}  # the old meaning: every file is JSON lines
    with warnings.catch_warnings():  # said once above, in the shell's words
        warnings.filterwarnings("ignore", category=DeprecationWarning, message="prepare\\(jsonl_field")
        meta = prepare(
            args.tokenizer,
            args.files,
            args.out,
            val_fraction=args.val_fraction,
            workers=args.workers,
            errors=args.errors,
            **field_option,
        )
    counts = meta["counts"]
    print(f"wrote {args.out}: {counts['train']:,} training and {counts['val']:,} validation tokens")


def cmd_pretrain(config, train) -> None:
    from gptkit.train.pretrain import pretrain

    metrics = pretrain(config, train)
    print(json.dumps({"out": config.out, **metrics}))


def cmd_finetune(config, train) -> None:
    from gptkit.train.finetune import finetune

    print(json.dumps(finetune(config, train)))


def cmd_evaluate(config) -> None:
    from gptkit.evaluate.finetuned import evaluate_labelled

    print(json.dumps(evaluate_labelled(config)))


def cmd_predict(config) -> None:
    from gptkit.evaluate.finetuned import predict_to_file

    records = predict_to_file(config)
    print(f"wrote {len(records)} predictions to {config.out}")


def cmd_generate(args: GenerateConfig) -> None:
    from gptkit.generation import load_for_generation, stream_text

    params = args.sampling  # checked as the flags were read, before the model loads
    model, tokenizer = load_for_generation(
        args.model, args.tokenizer, dtype=args.dtype, device=args.device, verbose=True, quantize=args.quantize
    )
    # One seeded generator for the whole session: several samples of a prompt differ, and the same
    # seed repeats the session (without a seed: torch's global generator).
    generator = params.generator(next(model.parameters()).device)
    settings = dict(params=params, raw=args.raw, generator=generator)

    def run(prompt: str) -> None:
        for _ in range(args.num_samples):
            sys.stdout.write(prompt)
            for piece in stream_text(model, tokenizer, prompt, **settings):
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")

    if args.interactive:
        for line in sys.stdin:
            run(line.rstrip("\n"))
    else:
        run(args.prompt)


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
    print(f"wrote {path} ({config.resolved_format()}, {config.dtype}, {path.stat().st_size:,} bytes)")


def cmd_suite(config, train) -> None:
    from gptkit.paper.suite import run_suite

    run_suite(config, train)
    print(f"\nresults: {Path(config.out) / 'results.md'} and results.json")


def cmd_figure2_layers(config, train) -> None:
    from gptkit.paper.figures import transfer_curve

    transfer_curve(config, train)
    print(f"wrote {config.out}/layers.json, layers.md, layers.png")


def cmd_figure2_zeroshot(config) -> None:
    from gptkit.paper.figures import zeroshot_curve

    zeroshot_curve(config)
    print(f"wrote {config.out}/zeroshot.json, zeroshot.md, zeroshot.png")


def cmd_demo(args: DemoConfig) -> None:
    from gptkit.demo import run_demo

    run_demo(
        Path(args.data),
        Path(args.out),
        quick=args.quick,
        time_budget=args.time_budget,
        precision=args.precision,
        device=args.device,
        recipe=args.recipe,
    )


# The parser ---------------------------------------------------------------------------------------


@dataclass
class Command:
    name: str  # "tokenizer train" for a sub-command
    configs: tuple[type, ...]
    run: Callable[..., None]
    config_file: bool = False  # --config FILE for the training commands
    summary: str = ""  # the help line; by default the first line of the first config's docstring

    def help(self) -> str:
        return self.summary or (self.configs[0].__doc__ or "").strip().split("\n")[0]


def cmd_harness(args: HarnessConfig) -> None:
    from gptkit.evaluate.harness import results_table, run_harness

    results = run_harness(**dataclasses.asdict(args))  # the same names
    print(results_table(results), file=sys.stderr)
    print(json.dumps({"model": args.model, "results": results.get("results", {})}), flush=True)


def _commands() -> list[Command]:
    # Imported here rather than at the top: the training modules are the heaviest of the package.
    from gptkit.data.fetch import FetchConfig
    from gptkit.evaluate.finetuned import LabelledDataConfig, PredictConfig
    from gptkit.evaluate.lm import PerplexityConfig
    from gptkit.evaluate.tradeoff import TradeoffConfig
    from gptkit.evaluate.zeroshot import ZeroshotConfig
    from gptkit.export import ExportConfig
    from gptkit.paper.figures import TransferConfig, ZeroshotCurveConfig
    from gptkit.paper.suite import SuiteConfig
    from gptkit.serve.config import ServeConfig
    from gptkit.train.config import TrainConfig
    from gptkit.train.finetune import FinetuneConfig, FinetuneTrainConfig
    from gptkit.train.pretrain import PretrainConfig

    return [
        Command("convert", (ConvertConfig,), cmd_convert),
        Command("export", (ExportConfig,), cmd_export),
        Command("tokenizer train", (TokenizerTrainConfig,), cmd_tokenizer_train),
        Command("tokenize", (TokenizeConfig,), cmd_tokenize),
        Command("prepare", (PrepareConfig,), cmd_prepare),
        Command(
            "pretrain",
            (PretrainConfig, TrainConfig),
            cmd_pretrain,
            config_file=True,
            summary="Pre-train a GPT (L1) on prepared token shards.",
        ),
        Command(
            "finetune",
            (FinetuneConfig, FinetuneTrainConfig),
            cmd_finetune,
            config_file=True,
            summary="Fine-tune on a labelled task (L3 = L2 + λ·L1), with the paper's defaults.",
        ),
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
            (SuiteConfig, FinetuneTrainConfig),
            cmd_suite,
            config_file=True,
            summary="Fine-tune on the paper's twelve tasks; results beside Tables 2-5.",
        ),
        Command(
            "figure2 layers", (TransferConfig, FinetuneTrainConfig), cmd_figure2_layers, config_file=True
        ),
        Command("figure2 zeroshot", (ZeroshotCurveConfig,), cmd_figure2_zeroshot),
        Command("data fetch", (FetchConfig,), cmd_data_fetch),
        Command("demo", (DemoConfig,), cmd_demo),
    ]


_GROUPS = {
    "tokenizer": "Tokenizer tools.",
    "data": "Sample datasets.",
    "analyze": "Analyses of a model.",
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
        for cls in command.configs:
            add_dataclass_arguments(p, cls)
        p.set_defaults(command_spec=command)
    return parser


def _build_configs(command: Command, args: argparse.Namespace) -> list[Any]:
    if command.config_file:
        file_values = _split_file_values(read_config_file(args.config), *command.configs)
    else:
        file_values = [{} for _ in command.configs]
    return [dataclass_from_args(cls, args, values) for cls, values in zip(command.configs, file_values)]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command: Command = args.command_spec
    try:
        command.run(*_build_configs(command, args))
    except (ValueError, OSError, ImportError) as e:
        print(f"gptkit {command.name}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"gptkit {command.name}: {str(e) or 'interrupted'}", file=sys.stderr)
        return getattr(e, "exit_code", 130)  # 128 + the signal: 130 for Ctrl-C, 143 for SIGTERM
    return 0
