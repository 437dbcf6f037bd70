"""Evaluation speed: tokens scored per second, gptkit against transformers, same text and same weights.

(a) perplexity of WikiText-2 test text (GPT-2 BPE) with a strided window (context, stride half of it):
    gptkit.evaluate.lm.perplexity (windows batched, PPL_BATCH at a time) against transformers'
    GPT2LMHeadModel over the same windows in the same batches, the tokens already scored masked out
    of the labels (-100), as its users compute a strided perplexity; and one window at a time (the
    gain from batching). tok/s counts the tokens scored.
(b) zero-shot multiple choice on Story Cloze (dev): gptkit.evaluate.lm.zeroshot_multiple_choice
    (ZEROSHOT_BATCH (context, answer) pairs a forward pass, longest first, right-padded) against
    GPT2LMHeadModel at the same batch size, the pairs sorted the same way, right-padded with an
    attention mask; and, labelled as the gain from batching, against GPT2LMHeadModel and gptkit's
    own reference (continuation_logprob) one pair at a time. tok/s counts the tokens run through the
    model (context + answer). Text is tokenized before the clock starts.
(c) fine-tuned task evaluation: TaskModel.logits on Story Cloze laid out as GPT-1 multiple choice
    (<s> context $ answer <e>), against OpenAIGPTModel's hidden states through the same head (the
    same network and head, the same padded batches), and against OpenAIGPTDoubleHeadsModel over the
    same batches (it also computes the language-model logits of every position, as a user calling it
    gets); tok/s counts the real (unpadded) tokens.

Random weights (speed does not depend on them): the transformers model is built from a config and
gptkit loads its saved weights through its checkpoint conversion; in fp32 the results are checked
equal (perplexity, accuracy, task logits). The libraries alternate, after a warm-up, REPEATS rounds;
medians with each side's least and most, "on par" where those overlap. Full mode is GPT-2 small / GPT-1 shape; ``--quick`` (or GPTKIT_BENCH_QUICK=1) is a smoke run
with a 2-layer model and little text. ``--device`` and ``--dtype`` (bfloat16 weights on both sides;
skipped where the hardware has no native bf16) serve benchmarks/gpu.sh. A measurement running past
common.TIME_LIMIT_S is reported as skipped.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable

import torch
from common import DATA, TIME_LIMIT_S, MeasurementTimeout, emit, skipped, spread_comparison, time_limit

from gptkit import GPT
from gptkit.data.batching import PAD_TO_MULTIPLE, length_batches
from gptkit.data.registry import read_dataset
from gptkit.data.tasks import TaskSpec, collate, encode_examples, special_token_ids
from gptkit.evaluate import lm
from gptkit.hardware import bf16_native
from gptkit.model.task import TaskModel
from gptkit.tokenizer import Tokenizer

REPEATS = 5
# Model shapes and amounts of text: full (GPT-2 small / GPT-1) and quick (a smoke run in seconds).
FULL = dict(n_layer=12, d_model=768, n_head=12, context=1024, gpt1_context=512)
FULL.update(ppl_tokens=4096, mc_examples=96, task_examples=64)
QUICK = dict(n_layer=2, d_model=128, n_head=2, context=128, gpt1_context=128)
QUICK.update(ppl_tokens=1024, mc_examples=16, task_examples=16)
PPL_BATCH, ZEROSHOT_BATCH, TASK_BATCH = 8, 32, 16
# The peers each measurement is compared with. A peer run one example at a time against gptkit's
# batches measures the gain from batching, and says so.
BATCHING_GAIN = "the gain from batching"
PPL_PEER = f"transformers GPT2LMHeadModel, the same windows in batches of {PPL_BATCH}"
PPL_ONE = f"transformers GPT2LMHeadModel, one window at a time ({BATCHING_GAIN})"
MC_PEER = f"transformers GPT2LMHeadModel, batches of {ZEROSHOT_BATCH} longest first, right-padded with an attention mask"
MC_ONE = f"transformers GPT2LMHeadModel, one pair at a time ({BATCHING_GAIN})"
MC_UNBATCHED = f"gptkit continuation_logprob, one pair at a time ({BATCHING_GAIN})"
TASK_BARE = "transformers OpenAIGPTModel + the same head, same batches"
TASK_PEER = (
    "transformers OpenAIGPTDoubleHeadsModel, same batches (it also computes every position's LM logits)"
)


def synchronize(device: torch.device) -> None:
    # CUDA runs asynchronously: the clock may only be read once the queued work is done.
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def race(fns: dict[str, Callable[[], object]], device: torch.device) -> tuple[dict[str, list[float]], dict]:
    """Seconds of each function in every round, alternating, after one warm-up each; and each one's
    last result."""
    results: dict[str, object] = {}
    seconds: dict[str, list[float]] = {name: [] for name in fns}
    with time_limit(TIME_LIMIT_S):
        for name, fn in fns.items():
            results[name] = fn()
        for _ in range(REPEATS):
            for name, fn in fns.items():
                synchronize(device)
                start = time.perf_counter()
                results[name] = fn()
                synchronize(device)
                seconds[name].append(time.perf_counter() - start)
    return seconds, results


def rows(
    what: str, tokens: int, fns: dict[str, Callable[[], object]], peers: dict[str, str], device
) -> tuple[list[dict], dict]:
    """One tok/s comparison per peer (``fns`` holds "ours" and the peers); skipped past the time limit."""
    try:
        times, results = race(fns, device)
    except MeasurementTimeout as e:
        return [skipped(what, "tok/s", p, f"the measurement {e}") for p in peers.values()], {}
    ours = [tokens / s for s in times["ours"]]
    out = [
        spread_comparison(what, "tok/s", ours, peer, [tokens / s for s in times[key]])
        for key, peer in peers.items()
    ]
    return out, results


def perplexity_rows(ours: GPT, peer, ids: list[int], what: str, device, check: bool) -> list[dict]:
    context = ours.config.context_length
    stride = context // 2
    windows = lm.strided_windows(len(ids), context, stride)  # the windows gptkit scores
    tokens = torch.tensor(ids, device=device)

    @torch.no_grad()
    def transformers_batches(batch_size: int) -> dict[str, float]:
        nll, count = 0.0, 0
        for batch in window_batches(windows, batch_size):
            ids = torch.stack([tokens[start:end] for start, end, _ in batch])
            labels = ids.clone()
            for row, (_, _, first_target) in enumerate(batch):
                labels[row, :first_target] = -100  # scored in an earlier window
            scored = sum(end - start - first for start, end, first in batch)
            nll += float(peer(ids, labels=labels).loss) * scored  # the mean over the batch's targets
            count += scored
        return {"tokens": count, "nll": nll / count}

    scored = sum(end - start - first for start, end, first in windows)
    out, results = rows(
        f"perplexity tok/s, {what}, stride {stride}, batch {PPL_BATCH}",
        scored,
        {
            "ours": lambda: lm.perplexity(ours, ids, stride=stride, batch_size=PPL_BATCH),
            "peer": lambda: transformers_batches(PPL_BATCH),
            "one": lambda: transformers_batches(1),
        },
        {"peer": PPL_PEER, "one": PPL_ONE},
        device,
    )
    if check and results:
        for key in ("peer", "one"):
            assert results["ours"]["tokens"] == results[key]["tokens"] == scored
            assert abs(results["ours"]["nll"] - results[key]["nll"]) < 1e-4, (
                "perplexity differs from transformers'"
            )
    return out


def window_batches(windows: list[tuple[int, int, int]], batch_size: int) -> list[list[tuple[int, int, int]]]:
    """The windows in order, batch_size at a time, a batch holding windows of one length (the last
    window may be shorter): what gptkit's perplexity batches too."""
    batches: list[list[tuple[int, int, int]]] = []
    for window in windows:
        last = batches[-1] if batches else None
        same = last is not None and last[0][1] - last[0][0] == window[1] - window[0]
        if same and len(last) < batch_size:
            last.append(window)
        else:
            batches.append([window])
    return batches


def multiple_choice_rows(ours: GPT, peer, tokenizer: Tokenizer, n: int, what: str, device, check: bool):
    examples = read_dataset("story_cloze", "dev", DATA)[:n]
    contexts = [e.fields["context"] for e in examples]
    choices = [e.fields["choices"] for e in examples]
    labels = [int(e.label) for e in examples]
    # Tokenized once, before the clock: both sides score the same ids and tokenizing is not measured.
    encoded = {text: tokenizer.encode(text) for text in contexts + [c for cs in choices for c in cs]}
    encode = encoded.__getitem__
    context = ours.config.context_length
    pairs = []
    for text, answers in zip(contexts, choices):
        for answer in answers:
            continuation = encode(answer)[: context - 1]  # continuation_logprob's truncation
            pairs.append((encode(text)[-(context - len(continuation)) :], continuation))
    tokens = sum(len(p) + len(c) for p, c in pairs)

    def accuracy_of(pair_scores: list[float]) -> float:
        scores = iter(score / max(len(c), 1) for score, (_, c) in zip(pair_scores, pairs))
        right = 0
        for answers, label in zip(choices, labels):
            per_answer = [next(scores) for _ in answers]
            right += max(range(len(per_answer)), key=per_answer.__getitem__) == label
        return right / len(labels)

    @torch.no_grad()
    def transformers_pair(prefix: list[int], continuation: list[int]) -> float:
        ids = torch.tensor([prefix + continuation], device=device)
        log_probs = peer(ids).logits[0, len(prefix) - 1 : -1].float().log_softmax(-1)
        return float(log_probs.gather(1, ids[0, len(prefix) :, None]).sum())

    batches = length_batches([len(p) + len(c) for p, c in pairs], ZEROSHOT_BATCH, longest_first=True)
    out, results = rows(
        f"zero-shot multiple-choice tok/s, {what}, batch {ZEROSHOT_BATCH}",
        tokens,
        {
            "ours": lambda: lm.zeroshot_multiple_choice(
                ours, encode, contexts, choices, labels, ZEROSHOT_BATCH
            )["accuracy"],
            "peer": lambda: accuracy_of(transformers_batched(peer, pairs, batches, device)),
            "one": lambda: accuracy_of([transformers_pair(p, c) for p, c in pairs]),
            "unbatched": lambda: accuracy_of([lm.continuation_logprob(ours, p, c)[0] for p, c in pairs]),
        },
        {"peer": MC_PEER, "one": MC_ONE, "unbatched": MC_UNBATCHED},
        device,
    )
    same = bool(results) and len({results[key] for key in ("ours", "peer", "one", "unbatched")}) == 1
    if check and results and device.type == "cpu":
        assert same, "zero-shot accuracy differs"
    elif check and results:  # GPU kernels may flip a near-tie between two answers: reported, not fatal
        out[0]["same_accuracy"] = same
    return out


@torch.no_grad()
def transformers_batched(
    peer, pairs: list[tuple[list[int], list[int]]], batches: list[list[int]], device
) -> list[float]:
    """Σ log P(continuation | prefix) of every pair, ``batches`` of pair indices a forward pass each,
    right-padded with an attention mask: transformers batched as its users batch it."""
    scores = [0.0] * len(pairs)
    for batch in batches:
        sequences = [pairs[i][0] + pairs[i][1] for i in batch]
        ids = torch.zeros(len(batch), max(map(len, sequences)), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, sequence in enumerate(sequences):
            ids[row, : len(sequence)] = torch.tensor(sequence)
            mask[row, : len(sequence)] = 1
        logits = peer(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        log_probs = logits.float().log_softmax(-1)
        for row, i in enumerate(batch):
            prefix, continuation = pairs[i]
            picked = log_probs[row, len(prefix) - 1 : len(prefix) + len(continuation) - 1]
            scores[i] = float(picked.gather(1, torch.tensor(continuation, device=device)[:, None]).sum())
    return scores


def gpt1_task_models(
    tokenizer: Tokenizer, n_layer: int, d_model: int, n_head: int, context: int, device, dtype
) -> tuple[TaskModel, object, TaskSpec]:
    """gptkit's TaskModel and transformers' OpenAIGPTDoubleHeadsModel with the same random weights (gptkit
    loads the peer's saved ones; its head is the peer's multiple-choice summary), on ``device`` in
    ``dtype``; and the task's spec."""
    import transformers

    config = transformers.OpenAIGPTConfig(
        vocab_size=len(tokenizer), n_positions=context, n_embd=d_model, n_layer=n_layer, n_head=n_head
    )
    double_heads = transformers.OpenAIGPTDoubleHeadsModel(config).eval()
    with tempfile.TemporaryDirectory() as tmp:
        double_heads.save_pretrained(tmp)
        gpt = GPT.from_pretrained(tmp)
    spec = TaskSpec("multiple_choice", max_length=context, specials=special_token_ids(tokenizer))
    model = TaskModel(gpt, spec, clf_dropout=0.0).eval()
    summary = double_heads.multiple_choice_head.summary
    with torch.no_grad():
        model.head.weight.copy_(summary.weight)
        model.head.bias.copy_(summary.bias)
    model.to(device=device, dtype=dtype)
    double_heads.to(device=device, dtype=dtype)
    return model, double_heads, spec


def task_batches(examples: list, spec: TaskSpec, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The batches TaskModel.logits forms, (input ids, classify positions), to hand to the peers as they are."""
    batches = []
    for start in range(0, len(examples), TASK_BATCH):
        batch = collate(examples[start : start + TASK_BATCH], False, PAD_TO_MULTIPLE, spec.max_length)
        batches.append((batch["input_ids"].to(device), batch["clf_positions"].to(device)))
    return batches


def task_rows(n_layer: int, d_model: int, n_head: int, context: int, n: int, what, device, dtype, check):
    tokenizer = Tokenizer.from_pretrained(DATA / "gpt1_bpe")
    model, double_heads, spec = gpt1_task_models(tokenizer, n_layer, d_model, n_head, context, device, dtype)
    summary = double_heads.multiple_choice_head.summary
    bare = double_heads.transformer  # OpenAIGPTModel, sharing the weights

    examples, _ = encode_examples(read_dataset("story_cloze", "dev", DATA)[:n], spec, tokenizer.encode)
    tokens = sum(len(s) for e in examples for s in e.sequences)
    batches = task_batches(examples, spec, device)

    @torch.no_grad()
    def transformers_double_heads() -> torch.Tensor:
        return torch.cat(
            [double_heads(input_ids=i, mc_token_ids=p).mc_logits.float().cpu() for i, p in batches]
        )

    @torch.no_grad()
    def transformers_bare() -> torch.Tensor:
        out = []
        for input_ids, positions in batches:
            N, C, T = input_ids.shape
            hidden = bare(input_ids.view(N * C, T)).last_hidden_state.view(N, C, T, -1)
            h_e = hidden[torch.arange(N, device=device)[:, None], torch.arange(C, device=device), positions]
            out.append(summary(h_e).squeeze(-1).float().cpu())
        return torch.cat(out)

    out, results = rows(
        f"fine-tuned multiple-choice eval tok/s, {what}, batch {TASK_BATCH}",
        tokens,
        {
            "ours": lambda: model.logits(examples, TASK_BATCH),
            "bare": transformers_bare,
            "peer": transformers_double_heads,
        },
        {"bare": TASK_BARE, "peer": TASK_PEER},
        device,
    )
    if check and results:
        for key in ("peer", "bare"):
            torch.testing.assert_close(results["ours"], results[key], atol=1e-4, rtol=1e-4)
    return out


# The peers of each measurement, by the measurement's name.
PEERS = {
    "perplexity": [PPL_PEER, PPL_ONE],
    "zero-shot multiple-choice": [MC_PEER, MC_ONE, MC_UNBATCHED],
    "fine-tuned multiple-choice eval": [TASK_BARE, TASK_PEER],
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", default=os.environ.get("GPTKIT_BENCH_QUICK") == "1")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    return parser.parse_args()


def gpt2_rows(shape: dict, what: str, device: torch.device, dtype: torch.dtype, check: bool) -> list[dict]:
    """Perplexity and zero-shot multiple choice: GPT-2 of ``shape`` with random weights on both sides."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=shape["n_layer"],
        n_embd=shape["d_model"],
        n_head=shape["n_head"],
        n_positions=shape["context"],
    )
    peer = transformers.GPT2LMHeadModel(config).eval()
    with tempfile.TemporaryDirectory() as tmp:
        peer.save_pretrained(tmp)
        ours = GPT.from_pretrained(tmp, dtype=dtype, device=str(device))
    peer.to(device=device, dtype=dtype)
    tokenizer = Tokenizer.from_pretrained(DATA / "gpt2_bpe")
    text = (DATA / "wikitext2" / "test.txt").read_text(encoding="utf-8")
    # About 5 characters a token: enough text for the tokens wanted, without encoding all of it.
    ids = tokenizer.encode(text[: shape["ppl_tokens"] * 6])[: shape["ppl_tokens"]]
    return perplexity_rows(ours, peer, ids, what, device, check) + multiple_choice_rows(
        ours, peer, tokenizer, shape["mc_examples"], what, device, check
    )


def main() -> None:
    args = parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    shape = QUICK if args.quick else FULL
    fp32 = dtype == torch.float32
    what = f"{shape['n_layer']}L/{shape['d_model']}, context {shape['context']}, {args.device}, " + (
        "fp32" if fp32 else "bf16 weights"
    )
    gpt1_what = what.replace(f"context {shape['context']}", f"context {shape['gpt1_context']}")
    native = bf16_native(device)
    comparisons: list[dict] = []
    if not fp32 and not native.native:
        # bf16 matrix products without hardware support run tens of times slower than fp32: not a
        # figure anyone would use.
        for name, names in PEERS.items():
            comparisons += [
                skipped(f"{name} tok/s, {what}", "tok/s", p, f"no native bf16: {native.reason}")
                for p in names
            ]
    else:
        comparisons += gpt2_rows(shape, what, device, dtype, fp32)  # its models freed before GPT-1's
        comparisons += task_rows(
            shape["n_layer"],
            shape["d_model"],
            shape["n_head"],
            shape["gpt1_context"],
            shape["task_examples"],
            gpt1_what,
            device,
            dtype,
            fp32,
        )
    emit(
        "evaluate_throughput",
        comparisons,
        quick=args.quick,
        device=str(device),
        dtype=args.dtype,
        perplexity_tokens=shape["ppl_tokens"],
        zeroshot_examples=shape["mc_examples"],
        task_examples=shape["task_examples"],
    )


if __name__ == "__main__":
    main()
