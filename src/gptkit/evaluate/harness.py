"""lm-evaluation-harness on gptkit models: ``gptkit harness`` (:class:`HarnessConfig`, :func:`run_harness`).

The ``gptkit`` model type itself, the class that answers lm-eval's questions on gptkit's code, is
:mod:`gptkit.evaluate.harness_model`; it imports lm-eval, so it is imported here only when a run
starts: this module (the command's config among the others) imports without lm-eval.
``python -m gptkit.evaluate.harness`` is lm-eval's own command line (every flag of ``lm_eval``)
with the type registered.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from gptkit.evaluate.lm import DEFAULT_BATCH_SIZE
from gptkit.hardware import DEVICE_HELP, Precision

SEED = 1234  # lm-eval's own default seed, for the few-shot examples and sampled generations


@dataclass
class HarnessConfig:
    """lm-evaluation-harness's tasks on a gptkit model (pip install -e '.[eval]'); lm-eval's results."""

    model: str = field(
        metadata={
            "help": "Model: a run folder, any folder GPT.from_pretrained reads, or a Hub name (gpt2, openai-gpt, org/name@rev)."
        }
    )
    tasks: list[str] = field(
        metadata={
            "help": "lm-eval task names (hellaswag, lambada_openai, arc_easy, ...; `lm_eval ls tasks` lists "
            "them), or tasks of your own from --include-path."
        }
    )
    include_path: str | None = field(
        default=None, metadata={"help": "A folder of task YAMLs of your own, found beside lm-eval's."}
    )
    include_defaults: bool = field(
        default=True,
        metadata={
            "help": "Index lm-eval's own tasks too (about 15,000; seconds): --no-include-defaults for "
            "--include-path's only."
        },
    )
    limit: float | None = field(
        default=None, metadata={"help": "Score the first N examples of each task (below 1: that fraction)."}
    )
    num_fewshot: int | None = field(
        default=None, metadata={"help": "Examples shown before each question (default: the task's)."}
    )
    batch_size: int = field(default=DEFAULT_BATCH_SIZE, metadata={"help": "Sequences per forward pass."})
    dtype: Precision = field(
        default="float32",
        metadata={
            "help": "Weights and scores: float32 (exact), bfloat16, float16, or auto (bfloat16 where the "
            "hardware multiplies it natively, float16 on a CUDA GPU without bf16); fp32, bf16 and fp16 are "
            "the same formats' other names."
        },
    )
    device: str = field(default="auto", metadata={"help": DEVICE_HELP})
    output_path: str | None = field(
        default=None,
        metadata={
            "help": "Write lm-eval's results file here, as lm_eval --output_path does "
            "(DIR/<model>/results_<date>.json)."
        },
    )
    log_samples: bool = field(
        default=False,
        metadata={"help": "Also write every example's prompt and scores (with --output-path)."},
    )


def run_harness(config: HarnessConfig) -> dict:
    """lm-eval's ``simple_evaluate`` on the gptkit model in directory ``config.model``, as ``lm_eval
    --model gptkit`` runs it: its results (a dict, as lm-eval returns them), also written where
    ``lm_eval --output_path`` writes them (``OUTPUT_PATH/<model path>/results_<date>.json``; with
    ``log_samples``, each task's samples beside them). ``include_path``: a folder of task YAMLs of
    your own, found beside lm-eval's (``include_defaults=False``: instead of them, which skips
    indexing lm-eval's thousands)."""
    # Registers "gptkit" with lm-eval (without lm-eval: an error that names the extra to install).
    import gptkit.evaluate.harness_model  # noqa: F401, I001
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    task_manager = TaskManager(include_path=config.include_path, include_defaults=config.include_defaults)
    tracker = EvaluationTracker(output_path=config.output_path)
    results = simple_evaluate(
        model="gptkit",
        model_args={"pretrained": config.model, "dtype": config.dtype},
        tasks=list(config.tasks),
        num_fewshot=config.num_fewshot,
        batch_size=config.batch_size,
        device=config.device,
        limit=config.limit,
        log_samples=config.log_samples,
        evaluation_tracker=tracker,
        task_manager=task_manager,
        random_seed=SEED,
        numpy_random_seed=SEED,
        torch_random_seed=SEED,
        fewshot_random_seed=SEED,
    )
    if results is None:  # a process other than the first of a distributed run
        return {}
    if config.output_path is not None:
        samples = results.get("samples")
        aggregated = {key: value for key, value in results.items() if key != "samples"}
        tracker.save_results_aggregated(results=aggregated, samples=samples)
        for task_name in samples or {}:
            tracker.save_results_samples(task_name=task_name, samples=samples[task_name])
    return results


def write_local_task(directory: str | Path, name: str, rows: list[dict], settings: dict) -> Path:
    """An lm-eval task over local rows, for ``include_path=directory``: ``NAME.jsonl`` (the rows) and
    ``NAME.yaml`` (``dataset_path: json`` over that file, then ``settings``: output_type, doc_to_text,
    metric_list, ...). Nothing is downloaded; returns the YAML's path."""
    directory = Path(directory)
    data = directory / f"{name}.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    task = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data)}, "cache_dir": str(directory / "cache")},
        "test_split": "test",
        **settings,
    }
    path = directory / f"{name}.yaml"
    path.write_text(json.dumps(task), encoding="utf-8")  # JSON is YAML
    return path


def results_table(results: dict) -> str:
    """lm-eval's own table of the results (and of task groups, where there are any)."""
    from lm_eval.utils import make_table

    tables = [make_table(results)]
    if "groups" in results:
        tables.append(make_table(results, "groups"))
    return "\n".join(tables)


def lm_eval_command_line() -> None:
    """lm-eval's own command line (``lm_eval``'s every flag), with the gptkit model type registered."""
    import gptkit.evaluate.harness_model  # noqa: F401, I001 (registers the type before lm-eval reads it)
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":  # python -m gptkit.evaluate.harness run --model gptkit ...
    lm_eval_command_line()
