"""Resident memory of a server's models: LoRA adapters of one base, 1, 4 and 16 of them, over one copy
of the base, against the same tasks as full models.

The base is GPT-2 small's shape (12 layers, d 768, GPT-2's vocabulary; random weights), the adapters
rank 8 on c_attn, c_proj and c_fc (random matrices: their size, not their values, is measured), each
with its classification head, fp32 on CPU. Each count is loaded by `gptkit serve`'s loader
(``load_models``) in a fresh process, then answers one classify pass with a sentence for every
model (a first mixed batch: the adapters' matrices are stacked per layer then); the figure is its
resident set after that, less that of the same process before (torch and the server's imports),
and again after glibc's ``malloc_trim`` (Linux) returns the heap it keeps for reuse.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import DATA, comparison, emit

COUNTS = (1, 4, 16)
SHAPE = dict(n_layer=12, d_model=768, n_head=12, context=1024)


def resident_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def worker(directories: list[str]) -> None:
    import torch

    from gptkit.serve.config import ServeLimits
    from gptkit.serve.models import CLASSIFY, AdapterBatcher, load_models

    torch.set_num_threads(1)
    before = resident_mb()
    models = load_models({Path(d).name: d for d in directories}, ServeLimits(), dtype="float32", device="cpu")
    loaded = resident_mb() - before
    # One classify pass with a sentence for every model, as a server's first mixed batch: adapters
    # are stacked per layer at the first pass after they are added, and their files' tensors freed.
    first = models[0].batchers[CLASSIFY]
    if isinstance(first, AdapterBatcher):
        items = [(m.name, m.task.encode([{"text": "a gentle , funny film"}])[0]) for m in models]
        first.shared.run(items)
    else:
        first.run(models[0].task.encode([{"text": "a gentle , funny film"}]))
    served = resident_mb() - before
    # What the tensors alive hold: glibc keeps freed heap (the adapters' files once read, their
    # scaled copies' sources) for the process's next allocations; malloc_trim hands it back.
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    print(
        json.dumps(
            {
                "models": len(models),
                "resident_mb": round(served),
                "resident_mb_before_first_pass": round(loaded),
                "resident_mb_after_malloc_trim": round(resident_mb() - before),
            }
        )
    )


def measure(directories: list[Path]) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", *map(str, directories)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    import torch

    from gptkit import GPT, GPTConfig
    from gptkit.model.task import TaskModel
    from gptkit.testing.adapters import write_adapter_run
    from gptkit.tokenizer import Tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tokenizer = Tokenizer.from_pretrained(DATA / "gpt2_bpe")
        torch.manual_seed(0)
        s = SHAPE
        config = GPTConfig(
            vocab_size=len(tokenizer),
            context_length=s["context"],
            n_layer=s["n_layer"],
            n_head=s["n_head"],
            d_model=s["d_model"],
            ln_position="pre",
        )
        GPT(config).save_pretrained(root / "base")
        tokenizer.save_pretrained(root / "base")
        adapters = [root / f"task{i}" for i in range(max(COUNTS))]
        for seed, directory in enumerate(adapters):
            write_adapter_run(directory, root / "base", "classification", ["neg", "pos"], seed, rank=8)
        adapter_mb = sum(f.stat().st_size for f in adapters[0].glob("*.safetensors")) / 1e6
        full = root / "full0"
        TaskModel.from_pretrained(adapters[0], device="cpu").save_pretrained(full)  # merged: a full model
        results = {f"adapters_{n}": measure(adapters[:n]) for n in COUNTS}
        results["full_model_1"] = measure([full])
    alone = results["full_model_1"]["resident_mb"]
    comparisons = [
        comparison(
            f"server RSS, {n} LoRA adapters (rank 8) over one GPT-2-small-shape base",
            "MB",
            results[f"adapters_{n}"]["resident_mb"],
            "one full model (the first adapter merged)",
            alone,
            higher_is_better=False,
        )
        for n in COUNTS
    ]
    emit(
        "serve_adapters_memory",
        comparisons,
        shape=SHAPE,
        adapter_files_mb=round(adapter_mb, 2),
        results=results,
    )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2:])
    else:
        main()
