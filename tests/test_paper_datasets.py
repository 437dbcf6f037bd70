"""The other GPT-1 benchmarks (SNLI, MultiNLI, QNLI, SciTail, QQP, RACE): readers on the real format
samples, with expectations taken from shared/data/SOURCES.md §4, and their archive sources fetched
from file:// URLs (no network)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import re
import tarfile
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from gptkit.data.benchmarks import read_nli, read_qnli, read_qqp, read_race, read_scitail
from gptkit.data.fetch import fetch
from gptkit.data.formats import DataError
from gptkit.data.registry import DATASETS, REGISTRY, Archive, read_dataset


def pairs(examples) -> list[tuple[str, str, str | None]]:
    return [(*e.fields.values(), e.label) for e in examples]


NLI = ("entailment", "neutral", "contradiction")
QNLI = ("entailment", "not_entailment")


def race(a: int, b: int, c: int, d: int) -> dict[int, int]:
    """RACE's answers A-D, counted, as the labels 0-3."""
    return {0: a, 1: b, 2: c, 3: d}


def both(*levels: dict[int, int]) -> dict[int, int]:
    return dict(sum((Counter(level) for level in levels), Counter()))


# The labels of each sample, counted by hand in its files (grep the gold labels, the last column,
# the answer letters); a test split has none. Their sum is the sample's size.
RACE = {
    ("train", "middle"): race(1, 4, 3, 2),
    ("train", "high"): race(3, 4, 2, 3),
    ("dev", "middle"): race(4, 3, 1, 3),
    ("dev", "high"): race(1, 1, 3, 1),
    ("test", "middle"): race(3, 1, 5, 5),
    ("test", "high"): race(2, 2, 2, 2),
}


@pytest.mark.parametrize(
    "name, split, labels",
    [
        ("snli", "train", dict(zip(NLI, (3, 4, 3)))),
        ("snli", "dev", dict(zip(NLI, (160, 165, 168)))),  # 500 rows, 7 of them without a gold label
        ("snli", "test", dict(zip(NLI, (3, 4, 3)))),
        ("mnli", "train", dict(zip(NLI, (3, 1, 0)))),
        ("mnli", "dev", dict(zip(NLI, (1, 1, 2)))),
        ("mnli", "dev_mismatched", dict(zip(NLI, (1, 0, 3)))),
        ("qnli", "train", dict(zip(QNLI, (1, 2)))),
        ("qnli", "dev", dict(zip(QNLI, (229, 271)))),
        ("qnli", "test", {None: 300}),
        ("scitail", "dev", {"entails": 3, "neutral": 3}),
        ("qqp", "train", {"0": 6, "1": 3}),
        ("qqp", "dev", {"0": 5, "1": 4}),
        ("qqp", "test", {None: 9}),
        ("race", "train", both(RACE["train", "middle"], RACE["train", "high"])),
        ("race", "dev", both(RACE["dev", "middle"], RACE["dev", "high"])),
        ("race", "test", both(RACE["test", "middle"], RACE["test", "high"])),
        *[(f"race_{level}", split, RACE[split, level]) for split, level in RACE],
    ],
)
def test_sample_sizes_and_labels(data_dir, name, split, labels):
    examples = read_dataset(name, split, data_dir)
    assert Counter(e.label for e in examples) == Counter(labels)
    assert len(examples) == sum(labels.values())


def test_snli_skips_rows_without_a_gold_label(data_dir):
    dev = read_dataset("snli", "dev", data_dir)
    assert Counter(e.label for e in dev) == {"neutral": 165, "entailment": 160, "contradiction": 168}
    assert dev[0].fields == {
        "premise": "Two women are embracing while holding to go packages.",
        "hypothesis": "The sisters are hugging goodbye while holding to go packages after just eating lunch.",
    }
    path = data_dir / "snli/snli_1.0/snli_1.0_dev.jsonl"
    assert dev[0].source == f"{path}, line 1"
    lines = path.read_text(encoding="utf-8").splitlines()
    skipped = next(n for n, line in enumerate(lines, 1) if '"3184031654.jpg#0r1e"' in line)
    kept = {e.source for e in dev}
    assert f"{path}, line {skipped}" not in kept and f"{path}, line {skipped - 1}" in kept
    assert any('with the words "HELP ME" on it.' in e.fields["hypothesis"] for e in dev)


def test_snli_txt_and_jsonl_give_the_same_examples(data_dir):
    folder = data_dir / "snli/snli_1.0"
    dev_txt = read_nli(folder / "snli_1.0_dev.txt")
    assert len(dev_txt) == 10
    assert pairs(dev_txt) == pairs(read_nli(folder / "snli_1.0_dev.jsonl"))[:10]
    assert pairs(read_nli(folder / "snli_1.0_test.txt")) == pairs(read_nli(folder / "snli_1.0_test.jsonl"))
    assert dev_txt[1].source == f"{folder / 'snli_1.0_dev.txt'}, line 3"  # line 1 is the header


def test_multinli_release_and_glue_files_agree_and_keep_spaces(data_dir):
    train = read_dataset("mnli", "train", data_dir)
    matched = read_dataset("mnli", "dev", data_dir)
    mismatched = read_dataset("mnli", "dev_mismatched", data_dir)
    assert train[0].fields["premise"].startswith("Conceptually cream skimming")
    assert matched[0].fields["premise"] == "The new rights are nice enough"
    assert matched[0].fields["hypothesis"] == "Everyone really likes the newest benefits "  # not stripped
    assert any(e.fields["premise"].startswith(" We serve a classic Tuscan meal") for e in mismatched)
    release, glue = data_dir / "multinli/multinli_1.0", data_dir / "multinli/MNLI"
    for examples, stem, rows in (
        (train, "train", 3),
        (matched, "dev_matched", 2),
        (mismatched, "dev_mismatched", 2),
    ):
        txt = read_nli(release / f"multinli_1.0_{stem}.txt")  # train lines end in four empty fields
        assert len(txt) == 3 and pairs(txt) == pairs(examples)[:3]
        tsv = read_nli(glue / f"{stem}.tsv")
        assert len(tsv) == rows and pairs(tsv) == pairs(examples)[:rows]
    test = read_nli(glue / "test_matched.tsv")
    assert len(test) == 1 and test[0].label is None and test[0].fields["premise"].startswith("Hierbas")


def test_qnli(data_dir):
    dev = read_dataset("qnli", "dev", data_dir)
    assert Counter(e.label for e in dev) == {"entailment": 229, "not_entailment": 271}
    assert dev[0].fields == {
        "premise": "What came into force after the new constitution was herald?",
        "hypothesis": "As of that day, the new constitution heralding the Second Republic came into force.",
    }
    assert dev[0].source.endswith("dev.tsv, line 2")
    texts = [e.fields["premise"] + e.fields["hypothesis"] for e in dev]
    assert sum('"' in t for t in texts) == 61  # bare quotes: read with quoting off
    assert sum(not t.isascii() for t in texts) == 66
    assert Counter(e.label for e in read_dataset("qnli", "train", data_dir)) == {
        "entailment": 1,
        "not_entailment": 2,
    }
    assert {e.label for e in read_dataset("qnli", "test", data_dir)} == {None}


def test_scitail_formats_agree(data_dir):
    folder = data_dir / "scitail/SciTailV1.1"
    tsv = read_dataset("scitail", "dev", data_dir)
    assert Counter(e.label for e in tsv) == {"entails": 3, "neutral": 3}
    assert "kinetic energy\u00a0 the energy of motion." in [e.fields["premise"] for e in tsv]
    snli = read_scitail(folder / "snli_format/scitail_1.0_dev.txt")
    dgem = read_scitail(folder / "dgem_format/scitail_1.0_structure_dev.tsv")
    predictor = read_scitail(folder / "predictor_format/scitail_1.0_structure_dev.tsv")
    assert (len(snli), len(dgem), len(predictor)) == (4, 2, 2)
    assert pairs(snli) == pairs(tsv)[:4]  # gold_label "entailment" read as "entails"
    assert pairs(dgem) == pairs(predictor) == pairs(tsv)[:2]
    assert pairs(tsv)[1][2] == "entails"
    fixture = read_scitail(data_dir / "scitail/scitail_dgem.tsv")  # no format folder: by suffix
    assert [e.label for e in fixture] == ["neutral", "entails", "entails"]
    with pytest.raises(FileNotFoundError, match="scitail_1.0_train.tsv: not found"):
        read_dataset("scitail", "train", data_dir)


def test_qqp(data_dir):
    train = read_dataset("qqp", "train", data_dir)
    assert Counter(e.label for e in train) == {"0": 6, "1": 3}
    assert train[1].fields == {
        "text_a": "How do I control my horny emotions?",
        "text_b": "How do you control your horniness?",
    }
    assert Counter(e.label for e in read_dataset("qqp", "dev", data_dir)) == {"0": 5, "1": 4}
    test = read_dataset("qqp", "test", data_dir)
    assert {e.label for e in test} == {None} and set(test[0].fields) == {"text_a", "text_b"}
    assert DATASETS["qqp"].metric == "f1" and DATASETS["qqp"].task == "similarity"


def test_race(data_dir):
    dev = read_dataset("race", "dev", data_dir)
    files = [e.source.rsplit(", question", 1)[0] for e in dev]
    root = data_dir / "race/RACE/dev"
    # middle before high; within a level by number
    assert list(dict.fromkeys(files)) == [
        str(root / p)
        for p in ("middle/13.txt", "middle/34.txt", "middle/73.txt", "high/73.txt", "high/80.txt")
    ]
    assert [e.label for e in dev[:5]] == [0, 2, 0, 3, 1]  # middle/13.txt: A C A D B
    assert dev[0].source == f"{root / 'middle/13.txt'}, question 1"
    assert dev[0].fields["question"] == "When something reflects light, we can   _  ."  # the gap is kept
    assert dev[0].fields["choices"] == ["see its color", "see its heat", "not see its color", "see nothing"]
    assert dev[0].fields["context"].startswith("What is color?") and "\n" in dev[0].fields["context"]
    one = read_race(root / "high/73.txt")
    assert len(one) == 1 and one[0].label == 2  # answer C
    test_high = read_dataset("race_high", "test", data_dir)
    names = [Path(e.source.split(",")[0]).name for e in test_high]
    assert list(dict.fromkeys(names)) == ["98.txt", "122.txt"]  # 98 before 122: by number, not text
    assert all(len(e.fields["choices"]) == 4 for e in dev)


def test_race_split_needs_both_levels(data_dir, tmp_path):
    split = tmp_path / "race/RACE/dev"
    (split / "middle").mkdir(parents=True)
    (split / "middle/13.txt").write_bytes((data_dir / "race/RACE/dev/middle/13.txt").read_bytes())
    assert len(read_dataset("race_middle", "dev", tmp_path)) == 5
    with pytest.raises(FileNotFoundError, match=r"dev/high: not found"):
        read_dataset("race", "dev", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"race/RACE/train: not found"):
        read_dataset("race", "train", tmp_path)


def test_damaged_json_line_is_named(data_dir, tmp_path):
    lines = (data_dir / "snli/snli_1.0/snli_1.0_dev.jsonl").read_text(encoding="utf-8").splitlines()
    lines[4] = lines[4][:200]  # a line cut short
    damaged = tmp_path / "snli_1.0_dev.jsonl"
    damaged.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(DataError, match=r"snli_1.0_dev.jsonl, line 5: not valid JSON"):
        read_nli(damaged)
    lines[4] = re.sub(r'"gold_label": "\w+"', '"gold_label": "contradicts"', lines[3])
    damaged.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(DataError, match=r"line 5: field 'gold_label' is 'contradicts'"):
        read_nli(damaged)


def test_damaged_tsv_rows_are_named(data_dir, tmp_path):
    lines = (data_dir / "qnli/dev.tsv").read_text(encoding="utf-8").splitlines()
    damaged = tmp_path / "dev.tsv"
    damaged.write_text("\n".join([*lines[:3], "\t".join(lines[3].split("\t")[:2])]), encoding="utf-8")
    with pytest.raises(DataError, match=r"dev.tsv, line 4: field 'sentence' is missing"):
        read_qnli(damaged)
    damaged.write_text("\n".join(lines[:3]).replace("\tnot_entailment", "\tnot_entail"), encoding="utf-8")
    with pytest.raises(DataError, match=r"dev.tsv, line 3: field 'label' is 'not_entail'"):
        read_qnli(damaged)
    damaged.write_text("id\tq1\tq2\n0\ta\tb\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"dev.tsv, line 1: no column 'question1'"):
        read_qqp(damaged)


def test_race_bad_answer_letter_is_named(data_dir, tmp_path):
    passage = json.loads((data_dir / "race/RACE/dev/middle/13.txt").read_text(encoding="utf-8"))
    passage["answers"][1] = "E"
    damaged = tmp_path / "13.txt"
    damaged.write_text(json.dumps(passage), encoding="utf-8")
    with pytest.raises(DataError, match=r"13.txt, question 2: field 'answers' is 'E', not A-D"):
        read_race(damaged)
    passage["answers"][1], passage["options"][3] = "C", ["only", "three", "options"]
    damaged.write_text(json.dumps(passage), encoding="utf-8")
    with pytest.raises(DataError, match=r"13.txt, question 4: field 'options' needs a list of 4"):
        read_race(damaged)
    damaged.write_text(json.dumps(passage)[:-30], encoding="utf-8")
    with pytest.raises(DataError, match=r"13.txt: not valid JSON"):
        read_race(damaged)


def test_label_sets(data_dir, tmp_path):
    assert DATASETS["snli"].labels == DATASETS["mnli"].labels == ("entailment", "neutral", "contradiction")
    assert DATASETS["qnli"].labels == DATASETS["rte"].labels == ("entailment", "not_entailment")
    assert DATASETS["scitail"].labels == ("entails", "neutral")
    assert DATASETS["qqp"].labels == DATASETS["mrpc"].labels == DATASETS["sst2"].labels == ("0", "1")
    assert DATASETS["race"].labels is None
    # A label outside the fixed set is named with its row.
    (tmp_path / "sst2").mkdir()
    (tmp_path / "sst2/stsa.binary.dev").write_text("1 good\n2 odd\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"stsa.binary.dev, line 2: label '2' is not one of 0, 1"):
        read_dataset("sst2", "dev", tmp_path)


# Fetching the archives -------------------------------------------------------------------------


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def make_tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


def with_source(monkeypatch, name: str, **changes) -> None:
    """Change fields of a dataset's archive source in the registry, for this test."""
    dataset = REGISTRY[name]
    source = dataclasses.replace(dataset.source, **changes)
    monkeypatch.setitem(REGISTRY, name, dataclasses.replace(dataset, source=source))


def serve(monkeypatch, name: str, archive: Path, checksum: str | None = "real") -> None:
    """Point a dataset's archive source at a local file."""
    with_source(
        monkeypatch, name, url=archive.as_uri(), sha256=sha256(archive) if checksum == "real" else checksum
    )


def test_fetch_extracts_a_zip_into_the_readers_layout(data_dir, tmp_path, monkeypatch):
    members = {f"QNLI/{s}.tsv": (data_dir / f"qnli/{s}.tsv").read_bytes() for s in ("train", "dev", "test")}
    members["__MACOSX/QNLI/._dev.tsv"] = b"resource fork"
    serve(monkeypatch, "qnli", make_zip(tmp_path / "QNLIv2.zip", members))
    out = tmp_path / "data"
    written = fetch(["qnli"], out)
    assert sorted(p.relative_to(out).as_posix() for p in written) == [
        "qnli/dev.tsv",
        "qnli/test.tsv",
        "qnli/train.tsv",
    ]
    assert (out / "qnli/dev.tsv").read_bytes() == members["QNLI/dev.tsv"]
    assert not list(out.rglob("._dev.tsv")) and not list((out / ".downloads").iterdir())  # archive removed
    assert Counter(e.label for e in read_dataset("qnli", "dev", out)) == {
        "entailment": 229,
        "not_entailment": 271,
    }
    # Fetched already: nothing is downloaded (the URL now points nowhere) and nothing rewritten.
    with_source(monkeypatch, "qnli", url="file:///nowhere.zip")
    assert fetch(["qnli"], out) == []


def test_fetch_extracts_race_from_a_tar_gz(data_dir, tmp_path, monkeypatch):
    sample = data_dir / "race"
    members = {p.relative_to(sample).as_posix(): p.read_bytes() for p in sorted(sample.rglob("*.txt"))}
    serve(monkeypatch, "race", make_tar(tmp_path / "RACE.tar.gz", members))
    out = tmp_path / "data"
    assert len(fetch(["race"], out)) == 15
    assert (out / "race/RACE/dev/high/73.txt").read_bytes() == (sample / "RACE/dev/high/73.txt").read_bytes()
    assert [len(read_dataset("race", s, out)) for s in ("train", "dev", "test")] == [22, 17, 22]


def test_fetch_checksum_mismatch_removes_the_archive(data_dir, tmp_path, monkeypatch):
    archive = make_zip(tmp_path / "QQP-clean.zip", {"QQP/dev.tsv": (data_dir / "qqp/dev.tsv").read_bytes()})
    serve(monkeypatch, "qqp", archive, checksum="0" * 64)
    out = tmp_path / "data"
    with pytest.raises(ValueError, match="checksum mismatch"):
        fetch(["qqp"], out)
    assert not (out / ".downloads/QQP-clean.zip").exists() and not (out / "qqp").exists()
    assert archive.exists()  # the source itself is untouched


@pytest.mark.parametrize("kind", ["zip with ..", "tar with an absolute path"])
def test_fetch_refuses_members_that_escape(tmp_path, monkeypatch, kind):
    if kind.startswith("zip"):
        dataset, good, bad = "qqp", "QQP/dev.tsv", "QQP/../../evil.tsv"
        archive = make_zip(tmp_path / "QQP-clean.zip", {good: b"first\n", bad: b"evil\n"})
    else:  # an absolute name inside tmp_path, so that a failure could not write elsewhere
        dataset, good, bad = "race", "RACE/dev/high/73.txt", str(tmp_path / "abs/evil.txt")
        archive = make_tar(tmp_path / "RACE.tar.gz", {good: b"{}", bad: b"evil\n"})
    serve(monkeypatch, dataset, archive)
    out = tmp_path / "deep/data"
    with pytest.raises(ValueError, match=r"refusing member .*evil.*: an absolute path or '\.\.'"):
        fetch([dataset], out)
    assert not list(tmp_path.rglob("evil.*")) and not (out / dataset).exists()  # nothing at all written


def test_fetch_an_archive_dataset_from_a_mirror(data_dir, tmp_path):
    out = tmp_path / "data"
    written = fetch(["qqp", "race"], out, mirror=data_dir)
    assert len(written) == 3 + 15
    assert (out / "qqp/train.tsv").read_bytes() == (data_dir / "qqp/train.tsv").read_bytes()
    assert len(read_dataset("race_middle", "test", out)) == 14
    with pytest.raises(FileNotFoundError, match="not in the mirror"):
        fetch(["snli"], out, mirror=tmp_path / "empty")


def test_archive_sources_hold_every_dataset_file():
    archives = {name: d.source for name, d in REGISTRY.items() if isinstance(d.source, Archive)}
    assert archives["qnli"].url == "https://dl.fbaipublicfiles.com/glue/data/QNLIv2.zip"
    assert archives["race"].url == "http://www.cs.cmu.edu/~glai1/data/race/RACE.tar.gz"
    assert archives["race_middle"] is archives["race_high"] is archives["race"]
    assert sorted(archives) == ["mnli", "qnli", "qqp", "race", "race_high", "race_middle", "scitail", "snli"]
    for name, archive in archives.items():
        assert archive.sha256 is None or len(bytes.fromhex(archive.sha256)) == 32
        for path in REGISTRY[name].local_files:
            # each file (or RACE's split folder) lands under a folder the archive is extracted into
            assert any(path.startswith(local) for local in archive.folders.values()), (name, path)


def test_repository_sources_map_local_files_to_their_published_paths():
    from gptkit.data.fetch import remote_path

    def remote(name: str, local: str) -> str:
        return remote_path(REGISTRY[name].source, local)

    # Paths as published in each repository, written out by hand.
    assert (
        remote("cola", "cola/out_of_domain_dev.tsv")
        == "acceptability_corpus/cola_public/raw/out_of_domain_dev.tsv"
    )
    assert remote("mctest", "mctest/mc500.dev.ans") == "data/hypev/mctest/mc500.dev.ans"
    assert remote("gutenberg", "gutenberg/pg11.txt") == "pg11.txt"
    assert "mctest/mc500.test.ans" in REGISTRY["mctest"].local_files  # the answers are fetched too
    assert REGISTRY["story_cloze"].local_files == [
        "story_cloze_2016/cloze_test_val__spring2016 - cloze_test_ALL_val.csv",
        "story_cloze_2016/cloze_test_test__spring2016 - cloze_test_ALL_test.csv",
    ]
    assert (
        "gpt2_bpe" in REGISTRY and "gpt2_bpe" not in DATASETS
    )  # a vocabulary: fetched, never read as a task
    with pytest.raises(ValueError, match="not a labelled dataset 'gutenberg'"):
        read_dataset("gutenberg", "train", "data")
