"""`gptkit <command>`: a thin shell over the library. Each command parses flags and calls a function.

Every command's flags are generated from the typed dataclass that its library function takes, which
lives beside that function (GenerateConfig in gptkit.generation.text, ServeConfig in
gptkit.serve.config, ...): its fields become the flags, their ``help`` metadata the ``--help`` text,
their defaults the defaults shown (:mod:`gptkit.cli_flags`). Here are only the command table and
the parser; each ``cmd_*`` calls one library function and prints. Training commands take ``--config
FILE`` (YAML or JSON) for the same fields; flags override it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptkit.cli_flags import add_dataclass_arguments, dataclass_from_args, read_config_file, split_file_values

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
    from gptkit.train.finetune.tasks import finetune

    print(json.dumps(finetune(config)))


def cmd_estimate(config) -> None:
    from gptkit.train.memory.estimate import (
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
    from gptkit.serve.server import restart_with_sleeping_threads

    restart_with_sleeping_threads()  # where OMP_WAIT_POLICY is not set: once, before any model loads
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
    # Its configs as "module:Class", imported when the parser is built: the training modules are the
    # heaviest of the package, and `import gptkit.cli` needs none of them.
    config_paths: tuple[str, ...]
    run: Callable[..., None] | str  # a cmd_* function, or "module:function"
    config_file: bool = False  # --config FILE for the training commands
    summary: str = ""  # the help line; by default the first line of the first config's docstring
    # --recipe NAME: named values (by flag name) under the config file's and the flags ("module:NAME").
    recipes_path: str | None = None

    # Resolved on every use, not kept: the classes are those of the modules imported now (a module
    # imported again, as a test does without an optional extra, holds new classes).
    @property
    def configs(self) -> tuple[type, ...]:
        return tuple(_imported(path) for path in self.config_paths)

    @property
    def recipes(self) -> dict[str, Any] | None:
        return None if self.recipes_path is None else _imported(self.recipes_path)

    def __call__(self, *configs) -> None:
        run = _imported(self.run) if isinstance(self.run, str) else self.run
        run(*configs)

    def help(self) -> str:
        return self.summary or (self.configs[0].__doc__ or "").strip().split("\n")[0]


def _imported(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


COMMANDS = [
    Command("download", ("gptkit.hub:DownloadConfig",), cmd_download),
    Command("convert", ("gptkit.model.convert:ConvertConfig",), cmd_convert),
    Command("export", ("gptkit.export:ExportConfig",), cmd_export),
    Command("tokenizer train", ("gptkit.tokenizer.train:TokenizerTrainConfig",), cmd_tokenizer_train),
    Command("tokenize", ("gptkit.tokenizer.base:TokenizeConfig",), cmd_tokenize),
    Command("prepare", ("gptkit.data.prepare:PrepareConfig",), cmd_prepare),
    Command(
        "pretrain",
        ("gptkit.train.pretrain:PretrainConfig",),
        cmd_pretrain,
        config_file=True,
        summary="Pre-train a GPT (L1) on prepared token shards.",
        recipes_path="gptkit.train.recipes:RECIPES",
    ),
    Command(
        "finetune",
        ("gptkit.train.finetune.tasks:FinetuneConfig",),
        cmd_finetune,
        config_file=True,
        summary="Fine-tune on a labelled task (L3 = L2 + λ·L1), with the paper's defaults.",
    ),
    Command(
        "checkpoint export",
        ("gptkit.train.checkpoints.export:CheckpointExportConfig",),
        "gptkit.train.checkpoints.export:cmd_checkpoint_export",
    ),
    Command(
        "estimate pretrain",
        ("gptkit.train.memory.estimate:PretrainEstimateConfig",),
        cmd_estimate,
        config_file=True,
    ),
    Command(
        "estimate finetune",
        ("gptkit.train.memory.estimate:FinetuneEstimateConfig",),
        cmd_estimate,
        config_file=True,
    ),
    Command("evaluate", ("gptkit.evaluate.finetuned:LabelledDataConfig",), cmd_evaluate),
    Command("predict", ("gptkit.evaluate.finetuned:PredictConfig",), cmd_predict),
    Command("generate", ("gptkit.generation.text:GenerateConfig",), cmd_generate),
    Command("serve", ("gptkit.serve.config:ServeConfig",), cmd_serve),
    Command("perplexity", ("gptkit.evaluate.lm:PerplexityConfig",), cmd_perplexity),
    Command("zeroshot", ("gptkit.evaluate.zeroshot:ZeroshotConfig",), cmd_zeroshot),
    Command("harness", ("gptkit.evaluate.harness:HarnessConfig",), cmd_harness),
    Command("analyze tradeoff", ("gptkit.evaluate.tradeoff:TradeoffConfig",), cmd_tradeoff),
    Command(
        "suite",
        ("gptkit.paper.suite:SuiteConfig",),
        cmd_suite,
        config_file=True,
        summary="Fine-tune on the paper's twelve tasks; results beside Tables 2-5.",
    ),
    Command("figure2 layers", ("gptkit.paper.figures:TransferConfig",), cmd_figure2_layers, config_file=True),
    Command("figure2 zeroshot", ("gptkit.paper.figures:ZeroshotCurveConfig",), cmd_figure2_zeroshot),
    Command("data fetch", ("gptkit.data.fetch:FetchConfig",), cmd_data_fetch),
    Command("demo", ("gptkit.demo:DemoConfig",), cmd_demo),
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
    for command in COMMANDS:
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
        file_values = split_file_values(data, *command.configs, source=source)
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
            command(*_build_configs(command, args))
    except (ValueError, OSError, ImportError) as e:
        print(f"gptkit {command.name}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"gptkit {command.name}: {str(e) or 'interrupted'}", file=sys.stderr)
        return getattr(e, "exit_code", 130)  # 128 + the signal: 130 for Ctrl-C, 143 for SIGTERM
    return 0
