"""`gptkit <command>`: a thin shell over the library. Each command parses flags and calls a function.

Flags of the training commands are generated from the typed config dataclasses (their field help
becomes ``--help``); ``--config FILE`` (YAML or JSON) sets the same fields, and flags override it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

# Dataclass flags ----------------------------------------------------------------------------------


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _base_type(annotation):
    """(python type, choices, optional) of a field annotation such as ``int | None`` or ``Literal[...]``."""
    optional = False
    origin = get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        optional = len(args) < len(get_args(annotation))
        annotation = args[0]
        origin = get_origin(annotation)
    if origin is Literal:
        choices = list(get_args(annotation))
        return type(choices[0]), choices, optional
    return annotation, None, optional


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = ()) -> None:
    hints = typing.get_type_hints(cls)
    group = parser.add_argument_group(cls.__name__)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        kind, choices, _ = _base_type(hints[f.name])
        help_text = f.metadata.get("help", "")
        default = f.default if f.default is not dataclasses.MISSING else None
        if kind is bool:
            group.add_argument(
                _flag(f.name),
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f"{help_text} (default: {default})",
            )
        else:
            group.add_argument(
                _flag(f.name),
                type=kind,
                choices=choices,
                default=None,
                metavar=None if choices else f.name.upper(),
                help=f"{help_text} (default: {default})",
            )


def dataclass_from_args(cls, args: argparse.Namespace, file_values: dict[str, Any] | None = None):
    """Defaults, then values from the config file, then explicit flags."""
    values = dict(file_values or {})
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise SystemExit(f"config file: unknown field(s) for {cls.__name__}: {', '.join(unknown)}")
    for name in names:
        value = getattr(args, name, None)
        if value is not None:
            values[name] = value
    return cls(**values)


def read_config_file(path: str | None) -> dict[str, Any]:
    """A YAML or JSON file of fields; sections named after the config classes may group them."""
    if not path:
        return {}
    text = Path(path).read_text(encoding="utf-8")
    if path.endswith((".yaml", ".yml")):
        import yaml

        data = yaml.safe_load(text) or {}
    else:
        data = json.loads(text)
    if not isinstance(data, dict):
        raise SystemExit(f"{path}: expected a mapping of field names to values")
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
        raise SystemExit(f"config file: unknown field(s): {', '.join(unknown)}")
    return out


# Commands -----------------------------------------------------------------------------------------


def cmd_convert(args) -> None:
    from gptkit.model import GPT

    model = GPT.from_pretrained(args.source, n_head=args.n_head)
    model.save_pretrained(args.destination)
    from gptkit.checkpoint import hf_model_type

    print(
        f"wrote {args.destination} ({hf_model_type(model.config)} format, {model.num_parameters():,} parameters)"
    )


def cmd_tokenizer_train(args) -> None:
    from gptkit.tokenizer import train_bpe

    tok = train_bpe(
        args.corpus, args.vocab_size, args.out, style=args.style, min_frequency=args.min_frequency
    )
    print(f"wrote {args.out}: {len(tok)} tokens ({args.style})")


def cmd_tokenize(args) -> None:
    from gptkit.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(args.tokenizer)
    text = Path(args.file).read_text(encoding="utf-8") if args.file else sys.stdin.read()
    if args.decode:
        ids = [int(x) for x in text.split()]
        print(tok.decode(ids))
    else:
        print(" ".join(map(str, tok.encode(text))))


def cmd_prepare(args) -> None:
    from gptkit.data.shards import prepare

    meta = prepare(
        args.tokenizer, args.files, args.out, val_fraction=args.val_fraction, jsonl_field=args.jsonl_field
    )
    print(
        f"wrote {args.out}: {meta['counts']['train']:,} training and {meta['counts']['val']:,} validation tokens"
    )


def cmd_pretrain(args) -> None:
    from gptkit.train.loop import TrainConfig
    from gptkit.train.pretrain import PretrainConfig, pretrain

    pre_values, train_values = _split_file_values(read_config_file(args.config), PretrainConfig, TrainConfig)
    config = dataclass_from_args(PretrainConfig, args, pre_values)
    train = dataclass_from_args(TrainConfig, args, train_values)
    if not config.data:
        raise SystemExit("gptkit pretrain: --data is required (a directory written by `gptkit prepare`)")
    metrics = pretrain(config, train)
    print(json.dumps({"out": config.out, **metrics}))


def cmd_finetune(args) -> None:
    from gptkit.train.finetune import FINETUNE_DEFAULTS, FinetuneConfig, finetune
    from gptkit.train.loop import TrainConfig

    ft_values, train_values = _split_file_values(read_config_file(args.config), FinetuneConfig, TrainConfig)
    config = dataclass_from_args(FinetuneConfig, args, ft_values)
    train = dataclass_from_args(TrainConfig, args, {**FINETUNE_DEFAULTS, **train_values})
    print(json.dumps(finetune(config, train)))


def _labelled_examples(args):
    from gptkit.data.readers import parse_columns, read_dataset, read_table
    from gptkit.train.finetune import TASK_NAME

    if args.dataset:
        return read_dataset(args.dataset, args.split, args.data_dir)
    if not args.data:
        raise ValueError("give --data FILE or --dataset NAME")
    from gptkit.checkpoint import read_json

    task = read_json(Path(args.model) / TASK_NAME)["spec"]["task"]
    return read_table(args.data, task, parse_columns(args.columns))


def cmd_evaluate(args) -> None:
    from gptkit.train.finetune import evaluate_model

    print(json.dumps(evaluate_model(args.model, _labelled_examples(args), args.batch_size)))


def cmd_predict(args) -> None:
    from gptkit.checkpoint import atomic_write
    from gptkit.train.finetune import predict

    records = predict(args.model, _labelled_examples(args), args.batch_size)
    text = "".join(json.dumps(r) + "\n" for r in records)
    atomic_write(args.out, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    print(f"wrote {len(records)} predictions to {args.out}")


def cmd_generate(args) -> None:
    from gptkit.textgen import load_for_generation, stream_text

    model, tokenizer = load_for_generation(args.model, args.tokenizer, dtype=args.dtype)
    settings = dict(
        max_new_tokens=args.max_new_tokens,
        do_sample=not args.greedy,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
        stop=args.stop,
        seed=args.seed,
    )

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


def cmd_perplexity(args) -> None:
    from gptkit.evaluate.lm import perplexity
    from gptkit.textgen import load_for_generation

    model, tokenizer = load_for_generation(args.model, args.tokenizer)
    ids = tokenizer.encode(Path(args.file).read_text(encoding="utf-8"))
    print(json.dumps({"file": args.file, **perplexity(model, ids, stride=args.stride)}))


_ZEROSHOT_DATASETS = {"sentiment": "sst2", "multiple_choice": "story_cloze", "acceptability": "cola"}


def _zeroshot_once(model_dir: Path, tokenizer, args) -> dict:
    from gptkit.data.readers import read_dataset
    from gptkit.evaluate import lm
    from gptkit.model import GPT

    model = GPT.from_pretrained(model_dir)
    dataset = args.dataset or _ZEROSHOT_DATASETS[args.task]
    examples = read_dataset(dataset, args.split, args.data_dir)[: args.limit]
    encode = tokenizer.encode
    if args.task == "sentiment":
        return lm.zeroshot_sentiment(
            model, encode, [e.fields["text"] for e in examples], [e.label for e in examples]
        )
    if args.task == "multiple_choice":
        return lm.zeroshot_multiple_choice(
            model,
            encode,
            [e.fields["context"] for e in examples],
            [e.fields["choices"] for e in examples],
            [e.label for e in examples],
        )
    fit = read_dataset(dataset, "train", args.data_dir)[: args.limit]
    start = (
        [next(iter(tokenizer.special_tokens.values()))]
        if "<|endoftext|>" in tokenizer.special_tokens
        else encode(".")
    )
    return lm.zeroshot_acceptability(
        model,
        encode,
        start,
        [e.fields["text"] for e in fit],
        [e.label for e in fit],
        [e.fields["text"] for e in examples],
        [e.label for e in examples],
    )


def cmd_zeroshot(args) -> None:
    from gptkit.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_pretrained(args.tokenizer or args.model)
    directories = [Path(args.model)]
    if args.checkpoints:
        directories = sorted(p for p in (Path(args.model) / "checkpoints").glob("step-*") if p.is_dir())
        if not directories:
            raise FileNotFoundError(f"{args.model}/checkpoints: no step-* checkpoints")
    for directory in directories:
        result = _zeroshot_once(directory, tokenizer, args)
        step = int(directory.name.split("-")[1]) if directory.name.startswith("step-") else None
        print(json.dumps({"task": args.task, "model": str(directory), "step": step, **result}), flush=True)


def cmd_tradeoff(args) -> None:
    from gptkit.evaluate.tradeoff import format_table, passages_from_text, save_report, sweep
    from gptkit.textgen import load_for_generation

    model, tokenizer = load_for_generation(args.model, args.tokenizer)
    ids = tokenizer.encode(Path(args.prompts).read_text(encoding="utf-8"))
    passages = passages_from_text(ids, args.prompt_tokens, args.new_tokens, args.passages)
    temperatures = [float(t) for t in args.temperatures.split(",")]
    top_ps = [None] + [float(p) for p in args.top_p.split(",")] if args.top_p else [None]
    report = sweep(model, passages, temperatures, top_ps, args.samples, args.seed)
    save_report(report, args.out)
    print(format_table(report))
    print(f"wrote {args.out}/tradeoff.json, tradeoff.txt, tradeoff.png")


def cmd_data_fetch(args) -> None:
    from gptkit.data.fetch import DEMO, SOURCES, fetch

    names = list(SOURCES) if args.all else list(DEMO) if args.demo else args.names
    if not names:
        raise ValueError(f"name datasets to fetch ({', '.join(SOURCES)}), or --demo, or --all")
    written = fetch(names, args.out, mirror=args.mirror)
    print(f"{len(written)} file(s) written to {args.out}")


def cmd_demo(args) -> None:
    from gptkit.demo import run_demo

    run_demo(Path(args.data), Path(args.out), quick=args.quick)


def build_parser() -> argparse.ArgumentParser:
    from gptkit import __version__

    parser = argparse.ArgumentParser(prog="gptkit", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"gptkit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser(
        "convert", help="Convert weights: HF dir, gptkit dir or OpenAI GPT-1 release → HF/gptkit dir."
    )
    p.add_argument("source", help="Directory (or hub name) to read.")
    p.add_argument("destination", help="Directory to write (config.json + model.safetensors).")
    p.add_argument(
        "--n-head", type=int, default=12, help="Heads, for OpenAI's release which does not record them."
    )
    p.set_defaults(func=cmd_convert)

    p = commands.add_parser("tokenizer", help="Tokenizer tools.")
    sub = p.add_subparsers(dest="tokenizer_command", required=True, metavar="ACTION")
    t = sub.add_parser("train", help="Train a BPE vocabulary on your corpus.")
    t.add_argument("--corpus", nargs="+", required=True, help="Text files.")
    t.add_argument("--vocab-size", type=int, required=True)
    t.add_argument("--style", choices=["gpt1", "bytelevel"], default="bytelevel")
    t.add_argument("--min-frequency", type=int, default=2)
    t.add_argument("--out", required=True)
    t.set_defaults(func=cmd_tokenizer_train)

    p = commands.add_parser("tokenize", help="Print the token ids of a file (or stdin), or decode ids.")
    p.add_argument("--tokenizer", required=True, help="Tokenizer directory.")
    p.add_argument("file", nargs="?", help="Text file (default: stdin).")
    p.add_argument("--decode", action="store_true", help="Read whitespace-separated ids and print text.")
    p.set_defaults(func=cmd_tokenize)

    p = commands.add_parser("prepare", help="Tokenize a corpus into token shards for pre-training.")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--val-fraction", type=float, default=0.05)
    p.add_argument(
        "--jsonl-field", default=None, help="Read JSONL files, one document per line, from this field."
    )
    p.add_argument("files", nargs="+")
    p.set_defaults(func=cmd_prepare)

    from gptkit.train.loop import TrainConfig
    from gptkit.train.pretrain import PretrainConfig

    p = commands.add_parser("pretrain", help="Pre-train a GPT (L1) on prepared shards.")
    p.add_argument("--config", help="YAML or JSON file of the fields below.")
    add_dataclass_arguments(p, PretrainConfig)
    add_dataclass_arguments(p, TrainConfig)
    p.set_defaults(func=cmd_pretrain)

    from gptkit.train.finetune import FinetuneConfig

    p = commands.add_parser("finetune", help="Fine-tune on a labelled task (L3 = L2 + λ·L1).")
    p.add_argument("--config", help="YAML or JSON file of the fields below.")
    add_dataclass_arguments(p, FinetuneConfig)
    add_dataclass_arguments(p, TrainConfig)
    p.set_defaults(func=cmd_finetune)

    for name, func, text in (
        ("evaluate", cmd_evaluate, "Print a fine-tuned model's metrics on labelled data as JSON."),
        ("predict", cmd_predict, "Write one JSON prediction per input row."),
    ):
        p = commands.add_parser(name, help=text)
        p.add_argument("--model", required=True, help="Directory written by `gptkit finetune`.")
        p.add_argument("--data", help="CSV/TSV/JSONL file.")
        p.add_argument("--columns", help="field=column,... as for finetune.")
        p.add_argument("--dataset", help="Or a public dataset by name.")
        p.add_argument("--split", default="dev")
        p.add_argument("--data-dir", default="data")
        p.add_argument("--batch-size", type=int, default=64)
        if name == "predict":
            p.add_argument("--out", required=True, help="Output JSONL file.")
        p.set_defaults(func=func)

    p = commands.add_parser("generate", help="Generate text from a prompt, printing as it goes.")
    p.add_argument("--model", required=True)
    p.add_argument("--tokenizer", default=None, help="Tokenizer directory (default: the model directory).")
    p.add_argument("--prompt", default="")
    p.add_argument(
        "--interactive", action="store_true", help="Read prompts from stdin, one a line, until EOF."
    )
    p.add_argument("--max-new-tokens", type=int, default=50)
    p.add_argument("--greedy", action="store_true", help="Always take the most likely token.")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--stop", action="append", default=None, help="Stop at this string (repeatable).")
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.set_defaults(func=cmd_generate)

    p = commands.add_parser("data", help="Sample datasets.")
    sub = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    t = sub.add_parser("fetch", help="Fetch sample datasets from their public sources (or a local mirror).")
    t.add_argument("names", nargs="*", help="Datasets: gpt1_bpe, gpt2_bpe, gutenberg, sst2, rte, ...")
    t.add_argument("--demo", action="store_true", help="What `make demo` needs.")
    t.add_argument("--all", action="store_true", help="Every dataset.")
    t.add_argument("--out", default="data", help="Where to write them (default: data/).")
    t.add_argument("--mirror", default=None, help="Copy from this local directory instead of downloading.")
    t.set_defaults(func=cmd_data_fetch)

    p = commands.add_parser("perplexity", help="Perplexity of a text file (strided sliding window).")
    p.add_argument("--model", required=True)
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--stride", type=int, default=None, help="Window step (default: half the context).")
    p.add_argument("file")
    p.set_defaults(func=cmd_perplexity)

    p = commands.add_parser("zeroshot", help="GPT-1's zero-shot heuristics (§5) on a public dataset.")
    p.add_argument("--model", required=True, help="A model directory, or a run directory with --checkpoints.")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--task", choices=sorted(_ZEROSHOT_DATASETS), required=True)
    p.add_argument("--dataset", default=None, help="Default: sst2, story_cloze or cola by task.")
    p.add_argument("--split", default="dev")
    p.add_argument("--data-dir", default="data")
    p.add_argument("--limit", type=int, default=None, help="Use the first N examples.")
    p.add_argument(
        "--checkpoints", action="store_true", help="Evaluate every checkpoint of a pre-training run."
    )
    p.set_defaults(func=cmd_zeroshot)

    p = commands.add_parser("analyze", help="Analyses of a trained model.")
    sub = p.add_subparsers(dest="analysis", required=True, metavar="ANALYSIS")
    t = sub.add_parser("tradeoff", help="Sweep temperature/top-p: diversity against fidelity.")
    t.add_argument("--model", required=True)
    t.add_argument("--tokenizer", default=None)
    t.add_argument("--prompts", required=True, help="Held-out text; passages are cut from it.")
    t.add_argument("--out", default="tradeoff")
    t.add_argument("--temperatures", default="0.2,0.5,0.7,0.9,1.0,1.2,1.5")
    t.add_argument("--top-p", default=None, help="Comma-separated top-p values to sweep as well.")
    t.add_argument("--passages", type=int, default=24)
    t.add_argument("--prompt-tokens", type=int, default=32)
    t.add_argument("--new-tokens", type=int, default=32)
    t.add_argument("--samples", type=int, default=2, help="Samples per passage and setting.")
    t.add_argument("--seed", type=int, default=0)
    t.set_defaults(func=cmd_tradeoff)

    p = commands.add_parser(
        "demo", help="The whole job on the sample data: prepare, pre-train, fine-tune, generate."
    )
    p.add_argument("--data", required=True, help="The shared data directory.")
    p.add_argument("--out", default="runs/demo")
    p.add_argument(
        "--quick", action="store_true", help="A much shorter run (seconds), to check the plumbing."
    )
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, OSError, ImportError) as e:
        print(f"gptkit {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"gptkit {args.command}: {e or 'interrupted'}", file=sys.stderr)
        return 130
    return 0
