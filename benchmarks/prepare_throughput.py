"""`gptkit prepare` with 2 worker processes against 1, on the Gutenberg books, and its peak memory.

Throughput: MB of text per second, the two settings alternating in this process after a warm-up
(which also starts multiprocessing's fork server), the shards checked to be byte-identical.
GPT-1's tokenizer (spaCy, slow) is where workers matter; GPT-2's is measured too.

Memory: peak resident memory of a `prepare` run (a fresh process, its workers and its fork
server, summed, sampled every 20 ms) on the books and on the books repeated 8 times, and on the
books' paragraphs as a parquet file (one document per row, 8.7 MB of text) and a file 10 times
larger: streaming keeps it from growing with the corpus.

`--only throughput|memory|parquet` runs one part (parquet: the two parquet runs, a minute or two
on 2 busy cores).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import DATA, comparison, emit, skipped, spread_comparison

from gptkit.data.prepare import prepare

BOOKS = sorted((DATA / "gutenberg").glob("*.txt"))


def shards_of(out: Path) -> tuple[bytes, ...]:
    return tuple((out / name).read_bytes() for name in ("train.bin", "val.bin", "meta.json"))


def throughput(
    tokenizer: Path, workers_runs: dict[str, int], repeats: int, work: Path
) -> dict[str, list[float]]:
    """MB/s of each setting in every round, alternating; raises if their shards differ."""
    mb = sum(f.stat().st_size for f in BOOKS) / 1e6
    prepare(tokenizer, BOOKS, work / "warmup", show_progress=False, workers=max(workers_runs.values()))
    speeds: dict[str, list[float]] = {name: [] for name in workers_runs}
    shards: dict[str, tuple[bytes, ...]] = {}
    for _ in range(repeats):
        for name, workers in workers_runs.items():
            start = time.perf_counter()
            prepare(tokenizer, BOOKS, work / name, show_progress=False, workers=workers)
            speeds[name].append(mb / (time.perf_counter() - start))
            shards[name] = shards_of(work / name)
    if len(set(shards.values())) != 1:
        raise AssertionError(f"shards differ between {', '.join(workers_runs)}")
    return speeds


def tree_rss_bytes(root: int) -> int:
    """Resident memory of ``root`` and all its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            children.setdefault(int(fields[1]), []).append(int(entry.name))
            rss[int(entry.name)] = int(fields[21]) * page
        except (OSError, ValueError, IndexError):
            continue
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def peak_rss_mb(tokenizer: Path, corpus: Path, out: Path, workers: int) -> float:
    """Peak summed RSS of a fresh process running `prepare` on ``corpus``, with its workers."""
    code = (
        "import sys; from gptkit.data.prepare import prepare; "
        "prepare(sys.argv[1], [sys.argv[2]], sys.argv[3], show_progress=False, workers=int(sys.argv[4]))"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(tokenizer), str(corpus), str(out), str(workers)]
    )
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree_rss_bytes(process.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    code = process.wait()
    done.set()
    sampler.join()
    if code != 0:
        raise RuntimeError(f"prepare exited with {code}")
    return peak / 1e6


PARQUET_BASE_COPIES = 3  # the smaller file: the books' paragraphs 3 times (8.7 MB of text)
# The larger: 10 times that (87 MB; its text alone, held at once, would add ~25% to the peak).
PARQUET_COPIES = 10
PARQUET_ROW_GROUP_ROWS = 2000  # about 0.3 MB of text a row group


def write_parquet_corpus(path: Path, paragraphs: list[str], copies: int) -> int:
    """The paragraphs ``copies`` times over as one parquet file, a copy at a time (this process
    never holds more than one): its size in bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": list(range(len(paragraphs))), "text": paragraphs})
    with pq.ParquetWriter(path, table.schema) as writer:
        for _ in range(copies):
            writer.write_table(table, row_group_size=PARQUET_ROW_GROUP_ROWS)
    return path.stat().st_size


def parquet_memory(work: Path) -> dict:
    """Peak RSS of `prepare` (GPT-2 tokenizer, 1 worker) on a parquet file 10× larger than another."""
    what = (
        f"peak RSS, prepare on parquet (GPT-2, 1 worker, row groups of {PARQUET_ROW_GROUP_ROWS} rows), "
        f"the books' paragraphs x{PARQUET_BASE_COPIES * PARQUET_COPIES} vs x{PARQUET_BASE_COPIES}"
    )
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return skipped(what, "MB", "the same, the smaller file", "needs pyarrow: pip install -e '.[corpora]'")
    text = "".join(f.read_text(encoding="utf-8") for f in BOOKS).replace("\r\n", "\n")
    paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
    small_bytes = write_parquet_corpus(work / "small.parquet", paragraphs, PARQUET_BASE_COPIES)
    large_bytes = write_parquet_corpus(
        work / "large.parquet", paragraphs, PARQUET_BASE_COPIES * PARQUET_COPIES
    )
    tokenizer = DATA / "gpt2_bpe"
    small = peak_rss_mb(tokenizer, work / "small.parquet", work / "rss-small", workers=1)
    large = peak_rss_mb(tokenizer, work / "large.parquet", work / "rss-large", workers=1)
    text_mb = PARQUET_BASE_COPIES * len(text.encode()) / 1e6
    return comparison(
        f"{what} ({PARQUET_COPIES * text_mb:.1f} MB of text, {large_bytes / 1e6:.1f} MB file, vs "
        f"{text_mb:.1f} MB, {small_bytes / 1e6:.1f} MB)",
        "MB",
        large,
        "the same, the smaller file",
        small,
        higher_is_better=False,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--only", choices=("throughput", "memory", "parquet"), help="Run one part (default: all)."
    )
    args = parser.parse_args()
    comparisons = []
    settings = {"2 workers": 2, "1 worker": 1}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    parts = {args.only} if args.only else {"throughput", "memory", "parquet"}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tokenizers = (("GPT-1", DATA / "gpt1_bpe"), ("GPT-2", DATA / "gpt2_bpe"))
        for name, tokenizer in tokenizers if "throughput" in parts else ():
            what = f"prepare MB/s, {name} tokenizer, Gutenberg books ({len(BOOKS)} files), 2 workers vs 1"
            try:
                speed = throughput(tokenizer, settings, args.repeats, work)
            except ImportError as e:  # GPT-1's tokenizer needs the gpt1 extra (spaCy, ftfy)
                comparisons.append(skipped(what, "MB/s", "prepare, 1 worker", str(e)))
                continue
            comparisons.append(
                spread_comparison(what, "MB/s", speed["2 workers"], "prepare, 1 worker", speed["1 worker"])
            )
        if not sys.platform.startswith("linux"):
            comparisons.append(skipped("peak RSS", "MB", "-", "reads /proc: Linux only"))
        if "parquet" in parts and sys.platform.startswith("linux"):
            comparisons.append(parquet_memory(work))
        if "memory" in parts and sys.platform.startswith("linux"):
            repeated = work / "books_x8.txt"
            text = b"".join(f.read_bytes() for f in BOOKS)
            repeated.write_bytes(text * 8)
            single = work / "books.txt"
            single.write_bytes(text)
            tokenizer = DATA / "gpt1_bpe"
            small = peak_rss_mb(tokenizer, single, work / "rss1", workers=2)
            large = peak_rss_mb(tokenizer, repeated, work / "rss8", workers=2)
            comparisons.append(
                comparison(
                    f"peak RSS (process tree), prepare with 2 workers, GPT-1, books x8 "
                    f"({len(text) * 8 / 1e6:.1f} MB) vs books ({len(text) / 1e6:.1f} MB)",
                    "MB",
                    large,
                    "the same on the books once",
                    small,
                    higher_is_better=False,
                )
            )
    emit("prepare_throughput", comparisons, usable_cores=cores)


if __name__ == "__main__":
    main()
