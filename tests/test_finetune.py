"""Fine-tuning: input layouts by hand, the heads and L3 against separate computations and
transformers' double-heads model, the dataset readers, and a run end to end."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gptkit import GPT, GPTConfig
from gptkit.data.examples import Example
from gptkit.data.formats import DataError
from gptkit.data.registry import read_dataset
from gptkit.data.tables import read_table
from gptkit.data.tasks import TaskSpec, build_sequences, collate, encode_examples, fit_segments
from gptkit.evaluate.finetuned import evaluate_model, predict
from gptkit.model.task import TaskModel
from gptkit.train.finetune.tasks import FinetuneConfig, finetune, paper_finetuning
from gptkit.train.run import ModelShape

SPECIALS = {"_start_": 100, "_delimiter_": 101, "_classify_": 102}
WORDS = {w: i for i, w in enumerate("the cat sat on a mat dog ran far away yes no".split())}


def encode(text: str) -> list[int]:
    return [WORDS[w.strip('"')] for w in text.split()]


def test_input_transformations_token_layouts():
    s, d, e = 100, 101, 102
    cat, sat = WORDS["cat"], WORDS["sat"]
    assert build_sequences("classification", {"text": [cat, sat]}, SPECIALS, 16) == [[s, cat, sat, e]]
    assert build_sequences("entailment", {"premise": [cat], "hypothesis": [sat]}, SPECIALS, 16) == [
        [s, cat, d, sat, e]
    ]
    assert build_sequences("similarity", {"text_a": [cat], "text_b": [sat, sat]}, SPECIALS, 16) == [
        [s, cat, d, sat, sat, e],
        [s, sat, sat, d, cat, e],
    ]
    assert build_sequences(
        "multiple_choice", {"context": [cat, cat], "choices": [[sat], [1, 2]]}, SPECIALS, 16
    ) == [[s, cat, cat, d, sat, e], [s, cat, cat, d, 1, 2, e]]


def test_truncation_cuts_the_longest_segment_from_its_end():
    assert fit_segments([[1, 2, 3, 4, 5, 6], [7, 8]], 5) == [[1, 2, 3], [7, 8]]
    assert fit_segments([[1, 2, 3], [4, 5, 6]], 4) == [[1, 2], [4, 5]]
    seqs = build_sequences("entailment", {"premise": list(range(50)), "hypothesis": [7, 8]}, SPECIALS, 10)
    assert seqs == [[100, 0, 1, 2, 3, 4, 101, 7, 8, 102]] and len(seqs[0]) == 10


def tiny_gpt(vocab=103, **overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(
        GPTConfig(
            vocab_size=vocab, context_length=32, n_layer=2, n_head=2, d_model=16, dropout=0.0, **overrides
        )
    ).eval()


def test_similarity_head_adds_the_two_orders():
    gpt = tiny_gpt()
    model = TaskModel(
        gpt, TaskSpec("similarity", labels=["0", "1"], specials=SPECIALS), clf_dropout=0.0
    ).eval()
    example = Example({"text_a": "the cat sat", "text_b": "a dog ran far"}, "1")
    [encoded], _ = encode_examples([example], model.spec, encode)
    batch = collate([encoded])
    logits = model(batch["input_ids"], batch["clf_positions"]).logits
    # By hand: run each order alone, take h_n at its <e>, add, apply W_y.
    h = [gpt(torch.tensor([seq])).hidden_states[0, -1] for seq in encoded.sequences]
    torch.testing.assert_close(logits[0], model.head(h[0] + h[1]), atol=1e-5, rtol=1e-5)
    # Padding to a multiple of 16 (fewer shapes for the CPU's kernels) changes nothing.
    padded = collate([encoded], pad_to_multiple=16, max_length=16)
    assert padded["input_ids"].shape[-1] == 16 > batch["input_ids"].shape[-1]
    torch.testing.assert_close(model(padded["input_ids"], padded["clf_positions"]).logits, logits)
    assert collate([encoded], pad_to_multiple=16, max_length=10)["input_ids"].shape[-1] == 10


def test_inference_runs_batches_of_similar_length_and_answers_in_the_callers_order():
    from gptkit.data.batching import PADDING_SLACK, length_batches
    from gptkit.data.tasks import EncodedExample

    lengths = [5, 30, 6, 28, 7, 29]
    examples = [EncodedExample([[(i * 7 + j) % 100 for j in range(n)]], None) for i, n in enumerate(lengths)]
    # Shortest first; 28 after 5, 6, 7 would pad 4 × 28 = 112 tokens for 46 real ones (> 1.25×).
    assert length_batches(lengths, batch_size=4, slack=PADDING_SLACK) == [[0, 2, 4], [3, 5, 1]]
    assert length_batches(lengths, batch_size=2, slack=PADDING_SLACK) == [[0, 2], [4], [3, 5], [1]]
    model = TaskModel(tiny_gpt(), TaskSpec("classification", labels=["no", "yes"], specials=SPECIALS))
    one_by_one = torch.cat([model.logits([e], batch_size=1) for e in examples])
    by_hand = torch.stack(
        [model.head(model.gpt(torch.tensor(e.sequences)).hidden_states[0, -1]) for e in examples]
    )
    torch.testing.assert_close(model.logits(examples, batch_size=4), one_by_one, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(one_by_one, by_hand.detach(), atol=1e-5, rtol=1e-5)


def test_l3_is_l2_plus_lambda_l1():
    gpt = tiny_gpt()
    spec = TaskSpec("classification", labels=["no", "yes"], specials=SPECIALS)
    model = TaskModel(gpt, spec, clf_dropout=0.0, lm_coef=0.5).eval()
    examples = [Example({"text": "the cat sat on a mat"}, "yes"), Example({"text": "a dog ran"}, "no")]
    encoded, _ = encode_examples(examples, spec, encode)
    batch = collate(encoded)
    out = model(**batch)
    # L2 by hand: cross-entropy of W_y·h_n at <e>.
    h = [gpt(torch.tensor([e.sequences[0]])).hidden_states[0, -1] for e in encoded]
    clf_logits = model.head(torch.stack(h))
    l2 = F.cross_entropy(clf_logits, torch.tensor([1, 0]))
    # L1 by hand: next-token log-likelihood over every real token of both sequences (no padding).
    nll, count = 0.0, 0
    for e in encoded:
        seq = torch.tensor([e.sequences[0]])
        log_probs = gpt(seq).logits[0].log_softmax(-1)
        for i in range(seq.size(1) - 1):
            nll -= log_probs[i, seq[0, i + 1]]
            count += 1
    l1 = nll / count
    torch.testing.assert_close(out.clf_loss, l2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.lm_loss, l1, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.loss, l2 + 0.5 * l1, atol=1e-5, rtol=1e-5)
    model.lm_coef = 0.0
    torch.testing.assert_close(model(**batch).loss, l2, atol=1e-5, rtol=1e-5)


def test_multiple_choice_scores_equal_transformers_double_heads(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.OpenAIGPTConfig(vocab_size=103, n_positions=32, n_embd=16, n_layer=2, n_head=2)
    reference = transformers.OpenAIGPTDoubleHeadsModel(config).eval()
    reference.save_pretrained(tmp_path)
    gpt = GPT.from_pretrained(tmp_path)
    model = TaskModel(gpt, TaskSpec("multiple_choice", specials=SPECIALS), clf_dropout=0.0).eval()
    with torch.no_grad():
        model.head.weight.copy_(reference.multiple_choice_head.summary.weight)
        model.head.bias.copy_(reference.multiple_choice_head.summary.bias)
    examples = [
        Example({"context": "the cat sat on", "choices": ["a mat", "a dog ran far away", "yes"]}, 0),
        Example({"context": "a dog", "choices": ["ran", "sat on the mat", "no"]}, 2),
    ]
    encoded, _ = encode_examples(examples, model.spec, encode)
    batch = collate(encoded)
    with torch.no_grad():
        ours = model(batch["input_ids"], batch["clf_positions"]).logits
        theirs = reference(input_ids=batch["input_ids"], mc_token_ids=batch["clf_positions"]).mc_logits
    assert ours.shape == (2, 3)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def test_transfer_layers_keeps_only_the_first_blocks():
    gpt = tiny_gpt()
    before = {k: v.clone() for k, v in gpt.state_dict().items()}
    gpt.reinitialize_blocks(keep=1)
    after = gpt.state_dict()
    assert torch.equal(after["wte.weight"], before["wte.weight"])
    assert torch.equal(after["h.0.attn.c_attn.weight"], before["h.0.attn.c_attn.weight"])
    assert not torch.equal(after["h.1.attn.c_attn.weight"], before["h.1.attn.c_attn.weight"])
    with pytest.raises(ValueError, match="0..2"):
        gpt.reinitialize_blocks(keep=3)


# Readers ----------------------------------------------------------------------------------------


class Starts(str):
    """An expected text given by its beginning (the whole is a long story)."""


def assert_example(example: Example, label, fields: dict) -> None:
    assert example.label == label and example.fields.keys() == fields.keys()
    for name, want in fields.items():
        got = example.fields[name]
        assert got.startswith(want) if isinstance(want, Starts) else got == want, (name, got)


MCTEST_DEV_CHOICES = [
    f"If the rain arrived on Saturday, {day} day did Stewart go to the beach."
    for day in ("Friday", "Monday", "Sunday", "Wednesday")
]
FRANKS_CAMP = [
    f"{who} explained to Frank's mom that it was safe to send Frank to summer camp."
    for who in ("Frank", "The camp leaders", "Frank's friends", "The scout masters")
]
# Each file's size, and its first and last examples read off its lines by hand: (label, fields).
READER_ROWS = [
    ("sst2", "train", 6920,
     ("1", {"text": "a stirring , funny and finally transporting re-imagining of beauty and the beast and 1930s horror films"}),
     ("1", {"text": "a deliciously nonsensical comedy about a city coming apart at its seams ."})),
    ("sst2", "dev", 872,
     ("0", {"text": "one long string of cliches ."}),
     ("1", {"text": Starts("an effectively creepy , fear-inducing -lrb- not fear-reducing -rrb- film")})),
    ("cola", "train", 8551,
     ("1", {"text": "Our friends won't buy this analysis, let alone the next one we propose."}),
     ("1", {"text": "What all did you get for Christmas?"})),
    ("cola", "dev", 527,
     ("1", {"text": "The sailors rode the breeze clear of the rocks."}),
     ("0", {"text": "Anson became a muscle bound."})),  # the '*' column is not the text
    ("rte", "train", 2490,
     ("not_entailment", {"premise": "No Weapons of Mass Destruction Found in Iraq Yet.",
                         "hypothesis": "Weapons of Mass Destruction Found in Iraq."}),
     ("not_entailment", {"premise": Starts("Turkey is unlikely to become involved in"),
                         "hypothesis": "U.S. to use Turkish military bases."})),
    ("rte", "dev", 277,
     ("not_entailment", {"premise": Starts("Dana Reeve, the widow of the actor Christopher Reeve,"),
                         "hypothesis": "Christopher Reeve had an accident."}),
     ("not_entailment", {"premise": Starts('Danny Kennedy, Greenpeace campaigns director, said: "The burden'),
                         "hypothesis": "Greenpeace director said that peace is terrorism."})),
    ("mrpc", "train", 3576,
     ("1", {"text_a": 'Amrozi accused his brother, whom he called "the witness", of deliberately distorting his evidence.',
            "text_b": 'Referring to him as only "the witness", Amrozi accused his brother of deliberately distorting his evidence.'}),
     ("1", {"text_a": Starts("He is blocking them until the Air Force assigns four additional C-130"),
            "text_b": "He is holding them up until the Air Force agrees to assign four additional C-130 cargo planes to the Idaho Air National Guard."})),
    ("mrpc", "dev", 500,
     ("1", {"text_a": Starts("Stocks have rallied sharply for more than three months"),
            "text_b": "Stocks have rallied sharply for more than three months in anticipation of an economic rebound in the year's second half."}),
     ("0", {"text_a": Starts("The 30-year bond US30YT=RR rose 22/32"),
            "text_b": "The 30-year bond US30YT=RR grew 1-3/32 for a yield of 4.30 percent, down from 4.35 percent late Wednesday."})),
    ("stsb", "train", 5749,
     (5.0, {"text_a": "A plane is taking off.", "text_b": "An air plane is taking off."}),
     (0.0, {"text_a": "Putin spokesman: Doping charges appear unfounded",  # two source columns follow
            "text_b": "The Latest on Severe Weather: 1 Dead in Texas After Tornado"})),
    ("stsb", "dev", 1500,
     (5.0, {"text_a": "A man with a hard hat is dancing.", "text_b": "A man wearing a hard hat is dancing."}),
     (0.0, {"text_a": "New video shows US police officers beating mentally-ill man",
            "text_b": "New York police officer critically wounded in hatchet attack"})),
    ("story_cloze", "test", 1871,
     (1, {"context": "My friends all love to go to the club to dance. They think it's a lot of fun and always "
                     "invite. I finally decided to tag along last Saturday. I danced terribly and broke a friend's toe.",
          "choices": ["My friends decided to keep inviting me out as I am so much fun.",
                      "The next weekend, I was asked to please stay home."]}),  # AnswerRightEnding 2
     (1, {"context": "Tam felt defeated as she looked at her lawn covered with Dandelions. Kids came to her "
                     "daycare, one of them picking a Dandelion for Tam. Tam had an idea. Before they left, Tam "
                     "told the kids to pick a bouquet for their moms.",
          "choices": ["Tam took the kids to Canada.", "The kids picked bouquets."]})),
    ("mctest", "train", 1200,
     (1, {"context": Starts("Alyssa got to the beach after a long trip. She's from Charlotte."),
          "choices": [f"Alyssa is in the {place} city." for place in ("trip", "Miami", "Atlanta", "beach")]}),
     (3, {"context": Starts("This summer Frank and his friends went to Boy Scout camp for two weeks."),
          "choices": FRANKS_CAMP})),
    ("mctest", "dev", 200,
     (0, {"context": Starts("One sunny morning, Stewart chose to go to the beach."), "choices": MCTEST_DEV_CHOICES}),
     (0, {"context": Starts("Lucy is an eight year old girl who lives with her parents and pet bird."),
          "choices": [f"Martha's favorite is color {c}." for c in ("purple", "yellow", "brown", "silver")]})),
]  # fmt: skip


@pytest.mark.parametrize(
    "name,split,count,first,last", READER_ROWS, ids=[f"{r[0]}-{r[1]}" for r in READER_ROWS]
)
def test_public_dataset_readers(data_dir, name, split, count, first, last):
    examples = read_dataset(name, split, data_dir)
    assert len(examples) == count
    assert_example(examples[0], *first)
    assert_example(examples[-1], *last)


def test_story_clozes_train_and_dev_split_the_validation_file(data_dir):
    """GPT-1's train and dev are a fixed split of the validation file's 1,871 stories: together every
    row once (lines 2 to 1872; line 1 is the header), each part in the file's order."""
    lines = {}
    for split in ("train", "dev"):
        sources = [e.source for e in read_dataset("story_cloze", split, data_dir)]
        lines[split] = [int(source.rsplit(" ", 1)[1]) for source in sources]
        assert lines[split] == sorted(lines[split])
    assert (len(lines["train"]), len(lines["dev"])) == (1497, 374)
    assert sorted(lines["train"] + lines["dev"]) == list(range(2, 1873))


def test_reader_quirks(data_dir):
    mrpc = read_dataset("mrpc", "train", data_dir)
    assert mrpc[0].label == "1" and mrpc[0].fields["text_a"].startswith("Amrozi accused")  # BOM, CRLF
    assert {e.label for e in mrpc} == {"0", "1"}
    rte = read_dataset("rte", "dev", data_dir)
    assert {e.label for e in rte} == {"entailment", "not_entailment"}
    stsb = read_dataset("stsb", "train", data_dir)
    assert all(0.0 <= e.label <= 5.0 for e in stsb)
    cloze = read_dataset("story_cloze", "test", data_dir)
    assert {e.label for e in cloze} == {0, 1} and len(cloze[0].fields["choices"]) == 2
    assert sum(e.label == 0 for e in cloze) == 960  # AnswerRightEnding 1 → index 0
    mc = read_dataset("mctest", "dev", data_dir)
    assert len(mc[0].fields["choices"]) == 4 and "\\newline" not in mc[0].fields["context"]
    assert mc[0].label == 0 and mc[1].label == 0 and mc[2].label == 2  # dev answers: A A C B


def test_user_files_and_bad_rows(tmp_path):
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text(
        'sentence_A\tsentence_B\tgold\nthe "cat" sat\ta dog\tyes\nthe mat\t\tno\n', encoding="utf-8"
    )
    columns = {"premise": "sentence_A", "hypothesis": "sentence_B", "label": "gold"}
    examples = read_table(tsv, "entailment", columns)
    assert examples[0].fields == {"premise": 'the "cat" sat', "hypothesis": "a dog"}
    spec = TaskSpec("entailment", labels=["no", "yes"], specials=SPECIALS)
    with pytest.raises(DataError, match=r"pairs.tsv, line 3: field 'hypothesis' is empty"):
        encode_examples(examples, spec, encode)
    encoded, skipped = encode_examples(examples, spec, encode, skip_bad_rows=True)
    assert len(encoded) == 1 and skipped == 1
    with pytest.raises(DataError, match=r"line 2: missing column 'premise'"):
        read_table(tsv, "entailment", {})
    jsonl = tmp_path / "mc.jsonl"
    jsonl.write_text(json.dumps({"story": "the cat", "a": "sat", "b": "ran", "right": "b"}) + "\n")
    [mc] = read_table(jsonl, "multiple_choice", {"context": "story", "choices": ["a", "b"], "label": "right"})
    assert mc.fields["choices"] == ["sat", "ran"] and mc.label == 1
    unknown = [Example({"text": "the cat"}, "maybe", "f.csv, line 9")]
    with pytest.raises(
        DataError, match=r"f.csv, line 9: field 'label' = 'maybe' is not one of the training labels"
    ):
        encode_examples(unknown, TaskSpec("classification", labels=["no", "yes"], specials=SPECIALS), encode)


def test_parquet_and_json_lines_take_the_same_columns(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [
        {"story": "the cat", "a": "sat", "b": "ran", "right": 1, "q": "on a mat"},
        {"story": "a dog", "a": "ran far", "b": "sat", "right": 0, "q": "the mat"},
        {"story": "the dog", "a": "ran", "b": "sat", "right": None, "q": "far away"},  # unlabelled
    ]
    jsonl = tmp_path / "mc.jsonl"
    jsonl.write_text("".join(json.dumps({k: v for k, v in r.items() if v is not None}) + "\n" for r in rows))
    parquet = tmp_path / "mc.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet, row_group_size=2)
    columns = {"context": "story", "question": "q", "choices": ["a", "b"], "label": "right"}
    from_jsonl = read_table(jsonl, "multiple_choice", columns)
    from_parquet = read_table(parquet, "multiple_choice", columns)
    assert [(e.fields, e.label) for e in from_parquet] == [(e.fields, e.label) for e in from_jsonl]
    assert [e.label for e in from_parquet] == [1, 0, None]
    assert from_parquet[2].source == f"{parquet}, row 2"  # rows count from 0, as pyarrow's do
    pq.write_table(pa.table({"story": ["the cat", None], "a": ["sat"] * 2, "b": ["ran"] * 2}), parquet)
    with pytest.raises(DataError, match=r"mc.parquet, row 1: column 'story' is null for field 'context'"):
        read_table(parquet, "multiple_choice", {"context": "story", "choices": ["a", "b"]})
    with pytest.raises(DataError, match=r"mc.parquet, row 0: missing column 'premise'"):
        read_table(parquet, "entailment", {})


@pytest.mark.slow
def test_finetune_end_to_end_from_scratch(tmp_path, data_dir):
    """A learnable toy task from a user CSV: string labels in, string labels out."""
    import random

    rng = random.Random(0)
    good, bad = ["wonderful", "great", "superb", "lovely"], ["awful", "dreadful", "boring", "terrible"]
    filler = "the film was quite a story of people and places".split()

    def rows(n):
        out = ["review,sentiment"]
        for _ in range(n):
            positive = rng.random() < 0.5
            words = rng.sample(filler, 5) + [rng.choice(good if positive else bad)]
            rng.shuffle(words)
            out.append(f"{' '.join(words)},{'pos' if positive else 'neg'}")
        return "\n".join(out) + "\n"

    (tmp_path / "train.csv").write_text(rows(256))
    (tmp_path / "dev.csv").write_text(rows(64))
    config = csv_config(
        data_dir / "gpt2_bpe",
        tmp_path,
        model=ModelShape(preset="tiny", d_model=32, context_length=32),
        epochs=8,
        lm_coef=0.0,
        training=dataclasses.replace(paper_finetuning(), lr=3e-3, batch_size=16, progress=False),
    )
    results = finetune(config)
    assert results["best"]["dev_accuracy"] >= 0.9
    # The config passed in is not changed: a second run with it derives its own step counts.
    train = config.training
    assert (train.max_steps, train.warmup_steps, train.eval_every) == (None, None, None)
    assert results["steps"] == 8 * (256 // 16)
    run = tmp_path / "run"
    assert json.loads((run / "task.json").read_text())["spec"]["labels"] == ["neg", "pos"]
    assert json.loads((run / "best.json").read_text())["score"] == results["best"]["dev_accuracy"]
    dev = read_table(tmp_path / "dev.csv", "classification", {"text": "review", "label": "sentiment"})
    metrics = evaluate_model(run, dev)
    assert metrics["accuracy"] == pytest.approx(results["best"]["dev_accuracy"])
    predictions = predict(run, dev)
    assert len(predictions) == 64 and {p["label"] for p in predictions} <= {"neg", "pos"}
    assert sum(p["label"] == e.label for p, e in zip(predictions, dev)) / 64 == pytest.approx(
        metrics["accuracy"]
    )
    assert all(abs(sum(p["probabilities"].values()) - 1) < 1e-5 for p in predictions)
    # The first-class model: loaded from the directory, it predicts raw rows the same way, and
    # saved again it loads to the same predictions.
    model = TaskModel.from_pretrained(run)
    rows = [{"text": e.fields["text"]} for e in dev[:8]]
    model.save_pretrained(tmp_path / "copy")
    again = TaskModel.from_pretrained(tmp_path / "copy")
    for ours, saved, expected in zip(model.predict(rows), again.predict(rows), predictions):
        for record in (ours, saved):
            assert record["label"] == expected["label"]
            assert record["probabilities"] == pytest.approx(expected["probabilities"], abs=1e-5)


@pytest.mark.parametrize(
    "train_text, dev_text, message",
    [
        ("review,sentiment\nfine,pos\ndull,neg\n", "", r"dev.csv: no examples \(the file is empty"),
        ("review,sentiment\nfine,pos\ndull,neg\n", "review,sentiment\n", r"dev.csv: no examples"),
        ("review,sentiment\n", "review,sentiment\nfine,pos\n", r"train.csv: no examples"),
        ("review,mood\nfine,pos\ndull,neg\n", "review,mood\nfine,pos\n", r"train.csv.*'sentiment'"),
    ],
    ids=["empty dev", "header-only dev", "header-only train", "no label column"],
)
def test_unusable_training_files_stop_before_training_naming_file_and_column(
    small_tokenizer, tmp_path, train_text, dev_text, message
):
    (tmp_path / "train.csv").write_text(train_text)
    (tmp_path / "dev.csv").write_text(dev_text)
    config = csv_config(small_tokenizer, tmp_path)
    with pytest.raises(ValueError, match=message):
        finetune(config)
    assert not (tmp_path / "run" / "checkpoints").exists()


def csv_config(tokenizer: Path, tmp_path: Path, **overrides) -> FinetuneConfig:
    """Fine-tuning a tiny model with ``tokenizer`` on tmp_path's train.csv/dev.csv (review, sentiment
    columns)."""
    values = dict(
        task="classification",
        train=str(tmp_path / "train.csv"),
        dev=str(tmp_path / "dev.csv"),
        columns="text=review,label=sentiment",
        tokenizer=str(tokenizer),
        model=ModelShape(preset="tiny"),
        out=str(tmp_path / "run"),
        training=dataclasses.replace(paper_finetuning(), progress=False),
    )
    return FinetuneConfig(**{**values, **overrides})
