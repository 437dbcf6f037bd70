"""Render docs/results.md's benchmark tables from results/*.json, the JSON `make bench` keeps.

A figure in those tables is what a benchmark printed, and each table is followed by how it was
measured (METHODS, filled from the same record): they sit between two markers in docs/results.md and
are rewritten whole, never edited by hand. `--check` only compares, and exits 1
when the file is not what results/ renders (tests/test_docs.py runs it). A demo's or a paper run's
figures are kept as a step of its own (`make keep-demo`, `make keep-paper`: `--keep`): the run's own
summary, less its samples, becomes results/demo.json or results/paper.json.

    python scripts/render_results.py            # rewrite the tables
    python scripts/render_results.py --check    # are they up to date?
    python scripts/render_results.py --keep demo runs/demo/summary.json
    python scripts/render_results.py --keep paper runs/paper/suite/results.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
DOC = REPO / "docs" / "results.md"
BEGIN = "<!-- begin: rendered from results/*.json by scripts/render_results.py; edit those, not this -->"
END = "<!-- end: rendered -->"

# One table per area, in the order a user meets them; a benchmark not named here comes last.
AREAS = {
    "tokenizer_throughput": "Tokenizers",
    "prepare_throughput": "Data preparation",
    "train_throughput": "Training",
    "time_to_quality": "Time to quality: pre-training for a budget of CPU minutes",
    "generate_throughput": "Decoding",
    "generate_throughput_native": "Native decoding against the PyTorch layouts, under contention, and torch.compile",
    "generate_throughput_avx2": "Decoding, AVX2 emulated on the AVX-512 CPU",
    "generate_throughput_avx2_cpu": "Decoding on a CPU without AVX-512",
    "decode_products": "A decoding step's products, kernel by kernel",
    "decode_products_avx2_cpu": "A decoding step's products, kernel by kernel, on a CPU without AVX-512",
    "serve_peers": "Serving against the servers people run",
    "serve_throughput": "Serving: the gain from batching",
    "serve_classify": "Serving task models under load",
    "serve_adapters_memory": "Many adapters, one base: resident memory",
    "generation_finetune": "Fine-tuning to answer: prompt → completion",
    "evaluate_throughput": "Evaluation",
    "harness_throughput": "lm-evaluation-harness",
    "lora_finetune": "LoRA against full fine-tuning",
    "activation_checkpointing": "Activation checkpointing",
    "memory_estimate": "What fits: `gptkit estimate` against the measured peak",
    "demo": "The demo (`make demo`)",
    "paper": "The paper on a CPU slice (`make paper`)",
}
# Records a page of their own renders: the reliability campaign's (the fuzzing, the soak) go into
# docs/operations.md (benchmarks/fuzz_campaign.py --render, benchmarks/serve_soak.py --render).
RENDERED_ELSEWHERE = {"fuzz", "serve_soak"}

# How each benchmark measures, printed under its table: at most two short paragraphs, filled from its
# record (str.format_map), so a figure quoted here is one the benchmark printed. A "####" line is a
# heading of its own (other documents link to it).
METHODS = {
    "tokenizer_throughput": """
        {text[megabytes]} MB of text (the five Gutenberg books and the SST-2 training sentences), fresh
        encoders each repetition (cold caches), alternating, medians of 5 rounds with the least and
        most. gptkit's GPT-2 encoder wraps tiktoken's Rust core, built from the shipped files, so
        parity is what to expect; GPT-1's ids are
        checked identical to the straightforward pipeline's (ftfy, spaCy, BPE, a text at a time).""",
    "prepare_throughput": """
        `gptkit prepare --workers 2` (this process and one helper) against 1 worker on the Gutenberg
        books, alternating, medians of 5 rounds with the least and most, the shards checked
        byte-identical: a second worker pays only where a core is free. Memory: the peak
        resident set of a `prepare` run in a fresh process (workers summed, sampled every 20 ms) on a
        corpus against one 8 or 10 times smaller.""",
    "train_throughput": """
        6 layers, d 384, 6 heads, context 256, vocabulary 40,478, batch 8, dropout 0; a step is forward,
        backward and AdamW. Each measurement in a fresh process (its peak RSS is its own), the sides
        alternating, medians of {rounds} rounds with the least and most in brackets; "on par" where
        those overlap. Both sides run with the same threads and the same allocator: glibc kept from
        returning freed memory (as gptkit's Trainer sets it); gptkit uses its fused output-layer loss (no logits returned), transformers
        returns its logits as its users get them. The torch.compile rows compile each side's model
        (Inductor, default mode) and time the steps after {compile_warmup} warm-up steps. MFU is against a
        2048³ matmul measured in the same run under the same load ({matmul_peak_gflops_fp32} GFLOP/s
        fp32, {matmul_peak_gflops_bf16} bf16 here), not against the CPU's specification.""",
    "time_to_quality": """
        Held-out bits per byte (the last 2% of every book, in bits over its UTF-8 bytes: comparable
        across vocabularies) after runs planned for 1, 2 and 5 minutes as `make demo` plans its
        pre-training (a time budget), each its own run, the recipes alternating, in {precision}.
        `baseline` is GPT-2's settings scaled down, untuned; `minutes` the demo's (`gptkit pretrain
        --recipe`). The time to the baseline's 5-minute
        figure is interpolated between budgets, a bound where the new recipe is past it at the shortest.
        One run per cell: under about 0.02 bits per byte is noise. What each lever bought:
        [experiments.md](experiments.md#what-each-lever-bought).""",
    "generate_throughput": """
        Greedy, random weights, batch 1: new tokens/s after a {prompt_tokens}-token prompt,
        {new_tokens} new tokens, each peer alternating with gptkit, medians of {repeats}; ids checked
        equal to the peer's in fp32. gptkit runs fp32 and bf16 weights in `nn.Linear`'s layout and in
        the decoding layout `gptkit generate` uses on a CPU (the native step: every block of a step in
        one call of `gptkit.native`), and int8 weights. The native step is also measured against
        gptkit's own PyTorch layouts (oneDNN-packed, FBGEMM: what runs where the kernels cannot be
        built), greedy ids compared (`same_ids` in the JSON), with the milliseconds a token spends
        outside its matrix products (the token's time minus the products' time alone, both measured
        in the run). The bandwidth fraction is the weights' bytes a step reads × tokens/s ÷ a large
        copy's bandwidth in the same run ({memory_bandwidth_gb_s} GB/s here); a step only reads, so
        it can pass 1. `OpenAIGPTLMHeadModel` has no cache.

        #### Other runtimes: ONNX Runtime int8, llama.cpp, prefill and memory

        ONNX Runtime runs `gptkit export --past`'s graph in fp32 and in its own int8 (`quantize_dynamic`);
        llama.cpp (the `llama` extra, built for this CPU) runs `gptkit export --quantize
        f32|bf16|q8_0`; 2 threads each. Time to first token: the prefill of a {prefill_tokens}-token
        prompt. Peak memory: each runtime's in a fresh process (load, the prompt, 8 new tokens) above
        its imports. On this shared host the ratios to llama.cpp move more between runs than between
        its rows ([earlier runs](experiments.md#decoding-layouts-kernels-and-other-runtimes-2026-11-29-to-2026-12-03)).""",
    "generate_throughput_avx2": """
        The benchmark above on the same AVX-512 CPU with PyTorch's kernels held to AVX2 (`--avx2`:
        `ATEN_CPU_CAPABILITY=avx2`, `ONEDNN_MAX_CPU_ISA=AVX2`, FBGEMM and MKL likewise): an emulation,
        faster than a real CPU without AVX-512 (the next table). ONNX Runtime and llama.cpp keep their
        AVX-512 kernels, so the ratios to them are lower bounds. For such a CPU, quote the next table.""",
    "generate_throughput_avx2_cpu": """
        The same benchmark on another machine: an AMD EPYC with AVX2 and no AVX-512 (so no native
        bf16), 2 cores, {memory_bandwidth_gb_s} GB/s copy bandwidth; every runtime runs its AVX2 kernels.
        This record was taken with gptkit's PyTorch layouts, before the native step, which has not yet
        run on a CPU without AVX-512: there gptkit is behind ONNX Runtime in fp32 and behind llama.cpp,
        PyTorch's one-row products alone taking longer than llama.cpp's whole fp32 or bf16 token
        ([measured](experiments.md#on-a-cpu-without-avx-512-what-the-gap-is-made-of)). The native
        step's AVX2 kernels are tested for their numbers on the AVX-512 machines (built with
        `-mavx2 -mfma`), not yet timed on such a CPU.""",
    "generate_throughput_native": """
        GPT-2 small, random weights, batch 1, greedy after a {prompt_tokens}-token prompt: gptkit's
        native step against its PyTorch layouts (oneDNN-packed fp32 and bf16, FBGEMM int8: what runs
        where the native kernels are not used), the two alternating, medians of {repeats} rounds with
        each side's least and most in brackets; "on par" where those overlap. The bandwidth fraction
        divides the bytes a step reads × tokens/s by a streaming read's bandwidth in the same run
        ({memory_bandwidth_gb_s} GB/s). torch.compile's trial times the decoding steps alone after
        the prompt (Inductor, freezing, a static KV cache; compiled in {torch_compile[compile_s]} s),
        the three alternating. The contention rows run with a CPU-bound process busy on every core
        ({new_tokens} new tokens for the d_model-64 model, a quarter of that for GPT-2 small), at the
        thread counts `torch.set_num_threads` gives both sides. Load average
        {load_average_before[1]:.1f} before the run; the host is shared
        ([experiments.md](experiments.md#native-decoding-that-never-loses-2026-12-04)).""",
    "decode_products": """
        GPT-2 small's 49 matrices times one row (a decoding step's products), each kernel called
        matrix by matrix from Python, the kernels alternating, medians of {repeats}, {threads}
        threads: gptkit's native products against the kernels a user could pick at the same
        precision. The fraction of the {bandwidth_kind} bandwidth ({memory_bandwidth_gb_s} GB/s in
        the same run) each kernel reaches: {bandwidth_fraction_text}.""",
    "serve_peers": """
        Tokens/s: generated tokens a second in each round's steady state (from the moment every client
        has its first token to the moment the first client has its last), the median of
        {setup[rounds]} rounds and their least–most; a ratio is gptkit's median over the peer's. GPT-2
        small's shape with random weights, streamed greedy `/v1/completions` of
        {setup[new_tokens]} new tokens, each client sending its requests one after another
        ({requests_text}). The servers of a precision start together and alternate round by round, the others
        stopped (SIGSTOP); each at its own default threads. gptkit: `gptkit serve --max-batch CLIENTS`
        (fp32, bf16, `--quantize int8`); transformers: `transformers serve --continuous-batching
        --dtype float32|bfloat16` at its `--cb-*` defaults (with them its KV cache is sized from the
        host's free memory, hence its RSS; it has no int8); llama-server: `--parallel CLIENTS
        --cont-batching` on the GGUF files `gptkit export` writes (f32, bf16, q8_0), built from the
        llama.cpp of the pinned llama-cpp-python. First token: over every request of every round. The
        load generator (raw asyncio streams, one process) used at most {client_cpu_fraction_max:.0%} of
        a core; load average {load_average_at_start[0]:.2f} at the start. Every figure of every round,
        gptkit's per-phase engine timers included, is in `results/serve_peers.json`.""",
    "generation_finetune": """
        A byte-level BPE of 8,000 tokens on the demo's books, `--recipe minutes` pre-training for
        {setup[pretrain_seconds]} s, then `gptkit finetune --task generation --dataset sst2` (each
        sentence → `negative` or `positive`): {setup[train_examples]} sentences, {setup[epochs]}
        epochs, lr {setup[lr]}, λ = {setup[lm_coef]}, the best epoch chosen by exact match on the dev
        split's first {setup[select_examples]} (there {selection[dev_exact_match]:.3f}). Held out: the
        next dev sentences, asked of the tuned model and of the pre-trained model untuned through the
        same chat template, greedy; the format is one of the two words. ± the standard error over
        the sentences.""",
    "serve_throughput": """
        `{setup[server]}`; {setup[clients]} asyncio clients each stream {setup[requests_per_client]}
        requests of {setup[new_tokens]} new tokens, against the same requests one at a time through
        `GPT2LMHeadModel.generate` and `gptkit.generate` (KV cache both); GPT-2 small's shape, random
        weights, alternating, medians of {setup[repeats]}; greedy text checked identical to
        transformers'. First token under that load: {time_to_first_token_under_load[median_s]:.2f} s
        median, {time_to_first_token_under_load[p95_s]:.2f} s p95. Memory: the server's resident set
        after 500 requests against after 50; it settles in the first hundreds
        ([followed to 1,500](experiments.md#after-the-architectures-reorganisation-the-same-speed-2026-12-03)).""",
    "serve_classify": """
        A GPT-2-small-shaped classifier (random weights, W_y on h_n at `_classify_`), 16 client threads
        sending one-sentence `/v1/classify` requests (SST-2 dev), against transformers'
        text-classification pipeline with the same weights in this process, given the sentences in
        batches of 16 (its `batch_size`) and, as the gain from batching, one at a time: both fp32, then
        the server's default (`auto`: bf16 where the CPU multiplies it natively, else fp32) against
        the pipeline in fp32 and, where bf16 is native, in bf16. "Its step alone": the server's
        `classify` on the same batches in one process. The adapter rows: 4 rank-8 LoRA adapters of one
        base, mixed requests against one adapter's; the step on batches of 16 mixed over the 4, in one
        pass against one per adapter. Alternating, medians of 5 rounds with the least and most in
        brackets (each round is in the JSON).""",
    "serve_adapters_memory": """
        Each count of rank-8 adapters (c_attn, c_proj, c_fc and a classification head,
        {adapter_files_mb} MB of files each) over one GPT-2-small-shaped base is loaded by `gptkit
        serve`'s loader in a fresh process, fp32, and answers one classify pass with a sentence per
        model; the figure is its resident set then, less the process's before loading. The peer is the
        base as one full task model. After glibc's `malloc_trim` hands back the heap freed while
        loading, 16 adapters hold {results[adapters_16][resident_mb_after_malloc_trim]} MB.""",
    "evaluate_throughput": """
        Tokens scored per second on the same text and random weights, fp32, the sides alternating,
        medians of 5 rounds with the least and most in brackets ("on par" where those overlap);
        results checked equal. Perplexity: {perplexity_tokens:,} tokens of WikiText-2 test in strided
        windows, gptkit's batched 8 at a time, against transformers given the same batches of 8 (its
        fp32 logits of every position: 1.6 GB a batch at context 1024) and one window at a time,
        which is the faster of its two ways here. Zero-shot: {zeroshot_examples} Story Cloze dev
        stories, 32 (context, answer) pairs a forward pass, longest first, against transformers on
        the same batches right-padded with an attention mask, and one pair at a time. Fine-tuned:
        {task_examples} stories in GPT-1's multiple-choice layout, the output layer only at `<e>`,
        against `OpenAIGPTModel` with the same head on the same batches (the same network) and
        `OpenAIGPTDoubleHeadsModel` (every position's logits, as a user calling it gets).""",
    "harness_throughput": """
        lm-eval's `simple_evaluate` on one model directory (GPT-2 small's shape, random weights, fp32,
        batch 32) through gptkit's model type and lm-eval's `hf` backend: {requests} requests, Story
        Cloze as multiple choice and WikiText-2 as rolling log-likelihood, alternating, medians. Both
        score the same (Story Cloze accuracy {scores[gptkit][story_cloze_acc]} and
        {scores[hf][story_cloze_acc]}).""",
    "activation_checkpointing": """
        GPT-2 small's shape (random weights), one fp32 update of batch {batch} × {length} tokens on
        this CPU for each mode, each in a fresh process, the modes alternating, medians of {rounds}
        rounds with the least and most in brackets. Peak memory is the
        C allocator's highest bytes in use during the update, above what the process held before the
        model was built (peak RSS, which also counts freed memory the allocator keeps, is in the
        JSON); the time is CPU time of all threads per update. `selective` keeps the outputs of the
        linear layers and of fused attention and recomputes LayerNorm, GELU, dropout and the residual
        adds; `full` keeps each block's input and runs the block again in the backward pass.""",
    "memory_estimate": """
        `gptkit estimate` (two updates of the real Trainer on fake tensors, nothing allocated) against
        the same update on real tensors, measured as for activation checkpointing: GPT-2 small and
        medium shapes, batch 8 × 256, fp32, AdamW, without and with `full` checkpointing; estimated /
        measured peak, and their ratio. In every row the estimate's parameters, gradients and
        optimizer state equal the hand arithmetic (4 bytes a parameter each, twice that for AdamW's
        moments; LoRA's frozen weights have neither). What fits on GPUs, from the same estimate:
        [pretraining.md](pretraining.md#4-what-fits-activation-checkpointing-and-gptkit-estimate).""",
    "lora_finetune": """
        A GPT-2-medium-shaped task model ({shape[n_layer]} layers, d {shape[d_model]}, a
        classification head), batch {shape[batch]} × {shape[tokens]} tokens, fp32, L3 = L2 + 0.5·L1,
        AdamW. gptkit's LoRA: rank {rank} on c_attn, c_proj and c_fc, the special rows and the head
        trained, {results[lora][trainable]:,} of {results[lora][parameters]:,} parameters
        ({trainable_fraction:.2%}); peft's: the same rank and targets. A fresh process per variant,
        alternating, medians of {rounds} rounds with the least and most; CPU time per update, which other load inflates
        less than the wall clock. Its cost in accuracy on a small base:
        [experiments.md](experiments.md#lora-against-full-fine-tuning-2026-12-02).""",
}


def number(value: float | None) -> str:
    if value is None:
        return "—"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def spread(values: list[float]) -> str:
    return f"{number(values[0])}–{number(values[1])}"


def hardware(record: dict) -> str:
    cpu = record.get("hardware", {}).get("cpu", {})
    isa = "AVX512-BF16" if cpu.get("avx512_bf16") else str(cpu.get("aten_capability", "?"))
    if cpu.get("amx"):
        isa += ", AMX"
    if cpu.get("onednn_max_cpu_isa"):
        isa += f", oneDNN capped at {cpu['onednn_max_cpu_isa']}"
    return isa


def heading(record: dict) -> list[str]:
    return [f"### {title(record)}", ""]


def cores(record: dict) -> int:
    """The cores the benchmark ran on (its threads), 2 where an old record does not say."""
    return int(record.get("hardware", {}).get("cpu", {}).get("threads") or 2)


def loaded(record: dict) -> bool:
    """Whether other work kept the machine busier than its cores while the record was taken: both
    sides of a comparison then slowed, not always alike. Judged by the load average (over 1 minute)
    before the benchmark began where the record has it (at the end the benchmark's own threads
    count too), else by the 5-minute figure at the end. The README quotes no figure of such a record
    (tests/test_docs.py)."""
    start, end = record.get("load_average_at_start"), record.get("load_average")
    if start:
        return start[0] > cores(record)
    return bool(end) and end[1] > cores(record)


def provenance(record: dict) -> str:
    """When and on what the record was taken: a line of its own, opening the paragraph under the table."""
    load, date, commit = record.get("load_average"), record.get("date"), record.get("commit")
    start = record.get("load_average_at_start")
    line = f"Measured {f'{date} ' if date else ''}on {record['machine']}; {hardware(record)}"
    if start:
        line += f"; load average {start[0]:.1f} before it began"
    if load:
        line += f"{',' if start else '; load average'} {load[1]:.1f} over its last 5 minutes"
    if commit:
        line += f"; commit {commit[:10]}{'+changes' * commit.endswith('+changes')}"
        # An older record's commit, found afterwards: the commit that added it (the code it measured
        # is no later).
        line += " (the commit that added this record)." if record.get("commit_from_history") else "."
    else:
        line += "."
    if loaded(record):
        line += f" **Loaded**: busier than its {cores(record)} cores while measured; rerun before quoting it."
    return line


def title(record: dict) -> str:
    name = record["benchmark"]
    if name == "demo" and record.get("init"):
        return f"The demo from published weights (`make demo INIT={record['init']}`)"
    if name in ("demo", "paper"):
        return AREAS[name]
    # generate_throughput.py keeps generate_throughput_avx2 with --avx2, generate_throughput_avx2_cpu
    # on a CPU without AVX-512.
    script = name.partition("_avx2")[0].removesuffix("_native")
    flag = " --avx2" if name.endswith("_avx2") else " --only native" if name.endswith("_native") else ""
    return f"{AREAS.get(name, name)} (`benchmarks/{script}.py{flag}`)"


def table(record: dict) -> list[str]:
    if record["benchmark"] == "demo":
        return demo_table(record)
    if record["benchmark"] == "paper":
        return paper_table(record)
    if record["benchmark"] == "memory_estimate":
        return estimate_table(record)
    if record["benchmark"] == "serve_peers":
        return serve_peers_table(record)
    if record["benchmark"] == "generation_finetune":
        return generation_table(record)
    lines = [*heading(record), "| what | gptkit | peer | ratio |", "|---|---:|---|---:|"]
    return [*lines, *comparison_rows(record["comparisons"]), "", *method(record)]


def comparison_rows(comparisons: list[dict]) -> list[str]:
    """The table's rows, in the record's order. Rows that share gptkit's figure (the same `what` up to
    " vs ", the same value) become one row against their several peers; rows that are one comparison
    in several metrics (the same `what` after its first phrase, the metric, and the same peer) become
    one row with a figure a metric. A group stands where its first row did; a row skipped, without a
    ratio or with a bound stays as it is."""
    by_figure: dict[object, list[dict]] = {}
    for index, row in enumerate(comparisons):
        alone = row.get("skipped") or row.get("ratio") is None or row.get("bound")
        key = (row["what"].partition(" vs ")[0], row["unit"], row["ours"], str(row.get("ours_spread")))
        by_figure.setdefault(index if alone else key, []).append(row)
    by_comparison: dict[object, list[list[dict]]] = {}
    for key, rows in by_figure.items():
        rest = rows[0]["what"].partition(", ")[2]
        single = len(rows) == 1 and not isinstance(key, int) and rest
        by_comparison.setdefault((rest, rows[0]["peer"]) if single else key, []).append(rows)
    return [
        peers_row(groups[0]) if len(groups) == 1 else metrics_row([rows[0] for rows in groups])
        for groups in by_comparison.values()
    ]


def figure(value: float, unit: str, least_most: list[float] | None = None) -> str:
    """A figure with its unit, and the least and most of its rounds where it is a median of them."""
    return f"{number(value)} {unit}" + (f" ({spread(least_most)})" if least_most else "")


def ratio_cell(row: dict) -> str:
    return f"**{row['ratio']:.2f}×**" + (" (on par: the spreads overlap)" if row.get("on_par") else "")


def peers_row(rows: list[dict]) -> str:
    """gptkit's figure once, then each peer's figure and the ratio to it, in order."""
    row, unit = rows[0], rows[0]["unit"]
    if row.get("skipped"):
        return f"| {row['what']} | — | {row['peer']} | skipped: {row['skipped']} |"
    if row.get("ratio") is None:  # measured, but with no figure to compare (a note says why)
        return f"| {row['what']} | — | {figure(row['peer_value'], unit)} ({row['peer']}) | {row.get('note', 'no ratio')} |"
    ours, ratios = figure(row["ours"], unit, row.get("ours_spread")), [ratio_cell(each) for each in rows]
    peers = [
        # Medians of rounds: each side's least and most beside it.
        f"{figure(each['peer_value'], unit)} ({spread(each['peer_spread'])}; {each['peer']})"
        if each.get("ours_spread")
        else f"{figure(each['peer_value'], unit)} ({each['peer']})"
        for each in rows
    ]
    if row.get("bound"):  # reached at the shortest budget: the time is at most, the ratio at least
        ours, ratios = f"≤ {ours}", [f"≥ {ratio}" for ratio in ratios]
    against = [each["what"].partition(" vs ")[2] for each in rows]
    what = (
        row["what"]
        if len(set(against)) == 1
        else f"{row['what'].partition(' vs ')[0]} vs {'; '.join(against)}"
    )
    return f"| {what} | {ours} | {'; '.join(peers)} | {'; '.join(ratios)} |"


def metrics_row(rows: list[dict]) -> str:
    """Several figures of one comparison (say tokens/s and the bandwidth fraction that follows from
    them), each cell listing them in the order of the metrics."""
    metrics = "; ".join(row["what"].partition(", ")[0] for row in rows)
    ours = "; ".join(figure(row["ours"], row["unit"], row.get("ours_spread")) for row in rows)
    peer = "; ".join(
        figure(row["peer_value"], row["unit"], row.get("peer_spread") if row.get("ours_spread") else None)
        for row in rows
    )
    ratios = "; ".join(ratio_cell(row) for row in rows)
    return f"| {metrics}, {rows[0]['what'].partition(', ')[2]} | {ours} | {peer} ({rows[0]['peer']}) | {ratios} |"


def method(record: dict) -> list[str]:
    """When and where the benchmark measured, then how, from METHODS, filled from its record and
    wrapped at 100 columns."""
    # A run on a CPU without AVX-512 measures as the benchmark does, unless it has words of its own.
    name = record["benchmark"]
    template = METHODS.get(name, METHODS.get(name.removesuffix("_avx2_cpu")))
    if template is None:
        return [provenance(record), ""]
    if "bandwidth_fraction" in record:  # decode_products: one phrase per kernel
        fractions = record["bandwidth_fraction"].items()
        record = {
            "bandwidth_kind": "copy",  # records before 2026-12-04 divided by a copy's bandwidth
            **record,
            "bandwidth_fraction_text": "; ".join(f"{kernel} {value:.2f}" for kernel, value in fractions),
        }
    if name == "serve_peers":  # each load's requests a client, in words
        setup = record["setup"]
        per_load = [
            f"{setup['requests_per_client'][c]} a client at {c} client{'s' * (c != '1')} after "
            f"{setup['warmup_requests_per_client'][c]} to warm up"
            for c in setup["requests_per_client"]
        ]
        record = {**record, "requests_text": "; ".join(per_load)}
    lines = [provenance(record)]
    for paragraph in textwrap.dedent(template).strip().format_map(record).split("\n\n"):
        if paragraph.startswith("#"):
            lines += [paragraph, ""]
            continue
        lines += [*wrapped(paragraph), ""]
    return lines


def wrapped(text: str) -> list[str]:
    return textwrap.wrap(" ".join(text.split()), 100, break_long_words=False, break_on_hyphens=False)


# serve_peers.py's servers, in its order, with the column names of its table.
SERVING_PEERS = {"transformers": "transformers serve --continuous-batching", "llama": "llama-server"}


def serve_peers_table(record: dict) -> list[str]:
    """A row per precision and load: gptkit's tok/s (median and spread of the rounds), each peer's
    with the ratio gptkit/peer ("on par" where the spreads overlap), then time to first token (p95)
    and peak RSS, each in the order gptkit, transformers, llama-server; a server that did not run
    says why."""
    lines = [
        *heading(record),
        "| precision | clients | gptkit, tok/s | "
        + " | ".join(SERVING_PEERS.values())
        + " | first token p95 (s): gptkit; transformers; llama-server | peak RSS (MiB), the same order |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for precision, loads in record["servers"].items():
        for clients, servers in loads.items():
            ours = servers.get("gptkit", {})
            cells = [_served(ours)]
            for name in SERVING_PEERS:
                peer = servers.get(name)
                cells.append("—" if peer is None else _served(peer, against=ours))
            named = ["gptkit", *SERVING_PEERS]
            ttfts = [(servers.get(n) or {}).get("ttft_s") or {} for n in named]
            rss = [(servers.get(n) or {}).get("peak_rss_mib") for n in named]
            cells.append("; ".join(number(t.get("p95")) for t in ttfts))
            cells.append("; ".join(number(r) for r in rss))
            lines.append(f"| {precision} | {clients} | " + " | ".join(cells) + " |")
    return [*lines, "", *method(record)]


def _served(server: dict, against: dict | None = None) -> str:
    """A server's generated tok/s with its rounds' spread, against gptkit's where ``against`` is it."""
    if server.get("skipped") or "tok_s" not in server:
        return f"skipped: {server.get('skipped', 'no steady-state window')}"
    rate = server["tok_s"]
    cell = f"{number(rate['median'])} ({spread([rate['min'], rate['max']])})"
    if against is None or "tok_s" not in against:
        return cell
    ours = against["tok_s"]
    ratio = ours["median"] / rate["median"]
    overlap = not (ours["min"] > rate["max"] or rate["min"] > ours["max"])
    return cell + f", **{ratio:.2f}×**" + (" (on par: the spreads overlap)" if overlap else "")


def generation_table(record: dict) -> list[str]:
    """The tuned model against the same model untuned on held-out prompts: the share of answers in the
    completion's format and of right answers, ± their standard errors; then a few answers of each."""
    figures, n = record["figures"], record["held_out"]

    def cell(pair: list[float]) -> str:
        return f"{pair[0]:.3f} ± {pair[1]:.3f}"

    lines = [
        *heading(record),
        f"| {n} held-out prompts | tuned | untuned |",
        "|---|---:|---:|",
        f"| answers in the format | {cell(figures['tuned']['in_format'])} | {cell(figures['untuned']['in_format'])} |",
        f"| right answers (majority class {record['majority_class']:.3f}) | {cell(figures['tuned']['right'])} | "
        f"{cell(figures['untuned']['right'])} |",
        "",
        "| prompt | reference | tuned | untuned |",
        "|---|---|---|---|",
    ]
    for sample in record["samples"]:
        cells = [
            sample[k].replace("|", "\\|").replace("\n", " ") or "(nothing)"
            for k in ("prompt", "reference", "tuned", "untuned")
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, "", *method(record)]


def estimate_table(record: dict) -> list[str]:
    """One row per shape and stage: the estimate against the measurement, without and with full
    activation checkpointing (a ratio near 1 is a good estimate, not a better gptkit)."""
    lines = [
        *heading(record),
        "| shape | stage | no checkpointing: estimated / measured | full checkpointing: estimated / measured |",
        "|---|---|---:|---:|",
    ]
    cells: dict[tuple[str, str], dict[str, str]] = {}
    for row in record["rows"]:
        estimated, measured = row["estimated_peak_mb"], row["measured_peak_mb"]
        cell = f"{estimated:,} / {measured:,} MB ({estimated / measured:.2f})"
        cells.setdefault((row["shape"], row["stage"]), {})[row["activation_checkpointing"]] = cell
    # Stages of a shape with the same figures share a row (pre-training and full fine-tuning, say).
    stages: dict[tuple[str, str, str], list[str]] = {}
    for (shape, stage), by_mode in cells.items():
        stages.setdefault((shape, by_mode.get("none", "—"), by_mode.get("full", "—")), []).append(stage)
    for (shape, none, full), names in stages.items():
        lines.append(f"| {shape} | {', '.join(names)} | {none} | {full} |")
    return [*lines, "", *method(record)]


def demo_table(record: dict) -> list[str]:
    if record.get("init"):
        start = f"From {record['init']}"
    else:
        start = f"The {record['recipe']} recipe, {record['pretrain_updates']:,} pre-training updates"
    budget = record.get("time_budget_s")
    paragraph = (
        f"{start}; {record['seconds'] / 60:.1f} minutes"
        + (f" of a {budget / 60:.0f}-minute budget, set-up included" if budget else "")
        + ". Pre-trained − from scratch on the same examples, in the same order, seed by seed, ± the "
        "standard error over seeds and examples; the difference is told apart from training noise where "
        "it clears the threshold (in standard errors) that its seeds set."
    )
    if any(task.get("seeds", 1) == 1 for task in record["tasks"].values()):
        paragraph += (
            " One seed a side gives no error: a single draw cannot tell a difference from training noise."
        )
    lines = [
        *heading(record),
        provenance(record),
        *wrapped(paragraph),
        "",
        "| task | metric | examples | seeds | updates a side | pre-trained | from scratch | majority "
        "class | per seed | difference | threshold | clears |",
        "|---|---|---:|---:|---|---:|---:|---:|---|---:|---:|---|",
    ]
    collapsed = False
    for name, task in record["tasks"].items():
        runs = task.get("per_seed", [])
        per_seed = []
        for run in runs:
            mark = "§" if run.get("one_answer") else ""
            collapsed |= bool(mark)
            per_seed.append(f"{run['pretrained'] - run['from_scratch']:+.3f}{mark}")
        several = task.get("seeds", 1) > 1
        difference = f"{task['difference']:+.3f}" + (f" ± {task['stderr']:.3f}" if several else "")
        threshold = f"{task['threshold']:.1f}" if several else "—"
        clears = ("yes" if task["clears_threshold"] else "no") if several else "one draw"
        lines.append(
            f"| {name} | {task['metric']} | {task['examples']:,} | {task.get('seeds', 1)} | "
            f"{_updates_cell(task)} | {task['pretrained']:.3f} | "
            f"{task['from_scratch']:.3f} | {task['majority_class']:.3f} | {', '.join(per_seed) or '—'} | "
            f"{difference} | {threshold} | {clears} |"
        )
    if collapsed:
        lines += ["", "§ a side answered one class on every example: it learned nothing of the task."]
    return [*lines, ""]


def _updates_cell(task: dict) -> str:
    """A demo task's updates a side: once where every seed took the same (with the training examples
    they were drawn from, where the record has them), else seed by seed."""
    updates = [run["updates"] for run in task.get("per_seed", [])]
    if not updates:
        return "—"
    if len(set(updates)) > 1:
        return ", ".join(map(str, updates))
    size = f" of {task['train_examples']:,} examples" if task.get("train_examples") else ""
    return f"{updates[0]}{size}"


def paper_table(record: dict) -> list[str]:
    lines = [
        *heading(record),
        provenance(record),
        "`full` (pre-trained, λ = 0.5) − each variant, in points, ± the standard error of the difference",
        "over seeds and examples; a difference counts where it clears the threshold (in standard errors)",
        "that its number of seeds sets. With one seed the error counts the examples only, not the",
        "training noise (‡): a difference there is one to recheck with more seeds.",
        "",
        "| variant | task | examples | seeds | full − variant | in s.e. | threshold | per seed | clears |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for variant, tasks in record["comparisons"].items():
        for rows in tasks.values():
            for row in rows:
                per_seed = ", ".join(f"{x:+.2f}" for x in row["per_seed"])
                ratio = f"{row['difference'] / row['stderr']:+.1f}" if row["stderr"] else "—"
                mark = "" if row["training_noise_counted"] else " ‡"
                lines.append(
                    f"| {variant} | {row['title']} | {row['examples']:,} | {len(row['seeds'])} | "
                    f"{row['difference']:+.2f} ± {row['stderr']:.2f}{mark} | {ratio} | {row['threshold']:.2f} | "
                    f"{per_seed} | {'yes' if row['claimed'] else 'no'} |"
                )
    return [*lines, ""]


def keep(kind: str, source: Path, results: Path = RESULTS) -> Path:
    """``make demo``'s summary.json or ``make paper``'s suite results.json as results/<kind>.json:
    its figures, the machine and the run's date, without paths or samples."""
    from gptkit.hardware import describe, machine_summary
    from gptkit.io import write_json
    from gptkit.testing.provenance import source_commit

    run = json.loads(source.read_text(encoding="utf-8"))
    record = {
        "benchmark": kind,
        # The run's date, which is when its file was written, not when it is kept.
        "date": datetime.date.fromtimestamp(source.stat().st_mtime).isoformat(),
        "machine": machine_summary(),
        "hardware": describe(),
        "commit": source_commit(REPO),
    }
    if kind == "demo":
        record |= {
            "recipe": run["recipe"],
            "init": run.get("init"),
            "seconds": run["seconds"],
            "time_budget_s": run.get("time_budget_s"),
            "pretrain_updates": run.get("pretrain", {}).get("steps"),
            "tasks": run["tasks"],  # figures only: the run's paths and samples stay in the run
        }
    else:
        record["comparisons"] = run["comparisons"]
    results.mkdir(parents=True, exist_ok=True)
    # The demo from published weights is its own table beside the pre-training demo's.
    target = results / (
        f"{kind}.json" if not record.get("init") else f"{kind}-{Path(record['init']).name}.json"
    )
    write_json(target, record)
    return target


def render(results: Path = RESULTS) -> str:
    records = [json.loads(path.read_text(encoding="utf-8")) for path in sorted(results.glob("*.json"))]
    records = [record for record in records if record["benchmark"] not in RENDERED_ELSEWHERE]
    order = list(AREAS)
    records.sort(
        key=lambda r: (
            order.index(r["benchmark"]) if r["benchmark"] in order else len(order),
            r["benchmark"],
            r.get("init") or "",
        )
    )
    lines = [
        BEGIN,
        "",
        "Ratio: gptkit against the peer named, measured in the same run, higher is better for gptkit",
        "(times and memory inverted). A row of several figures (one of gptkit's against several peers, or",
        "several of one comparison) lists them in the same order in each cell, separated by semicolons.",
        "Every figure of each run, with its settings, is in `results/<benchmark>.json`.",
        "",
    ]
    for record in records:
        lines += table(record)
    return "\n".join([*lines, END])


def updated(document: str, tables: str) -> str:
    if BEGIN not in document or END not in document:
        raise SystemExit(f"{DOC}: the markers are missing; put {BEGIN!r} and {END!r} where the tables go")
    head, rest = document.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + tables + tail


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 when out of date")
    parser.add_argument(
        "--keep",
        nargs=2,
        metavar=("KIND", "FILE"),
        help="keep a run's figures first: demo runs/demo/summary.json, or paper runs/paper/suite/results.json",
    )
    args = parser.parse_args()
    if args.keep:
        kind, source = args.keep
        if kind not in ("demo", "paper"):
            parser.error(f"--keep: KIND is demo or paper, not {kind!r}")
        if not Path(source).is_file():
            parser.error(f"--keep: {source} does not exist; run `make {kind}` first")
        print(f"kept {source} as {keep(kind, Path(source)).relative_to(REPO)}")
    document = DOC.read_text(encoding="utf-8")
    new = updated(document, render())
    if args.check:
        if new != document:
            print(f"{DOC.relative_to(REPO)} is not what results/*.json render: run scripts/render_results.py")
            return 1
        return 0
    DOC.write_text(new, encoding="utf-8")
    print(f"rendered {len(list(RESULTS.glob('*.json')))} benchmarks into {DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
