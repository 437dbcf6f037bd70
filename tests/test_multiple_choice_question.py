"""Multiple choice with a question (GPT-1 §3.3, [z; q; $; a_k]): the token layout by hand, the
document-first truncation, the user-file readers, and a fine-tuning run that predicts with it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gptkit.data.examples import Example
from gptkit.data.formats import DataError
from gptkit.data.tables import parse_columns, read_table
from gptkit.data.tasks import (
    TaskSpec,
    build_sequences,
    encode_examples,
    fit_segments,
    special_token_ids,
)
from gptkit.evaluate.finetuned import predict
from gptkit.model.task import TaskModel
from gptkit.train.finetune.tasks import FinetuneConfig, finetune, paper_finetuning
from gptkit.train.run import ModelShape

SPECIALS = {"_start_": 100, "_delimiter_": 101, "_classify_": 102}
S, D, E = 100, 101, 102
WORDS = {w: i for i, w in enumerate("the cat sat on a mat dog ran far away yes no who what where".split())}
COLUMNS = "context=story,question=q,choices=a|b|c|d,label=answer"


def encode(text: str) -> list[int]:
    return [WORDS[w] for w in text.split()]


def test_layout_puts_the_question_between_context_and_delimiter():
    spec = TaskSpec("multiple_choice", specials=SPECIALS, max_length=32)
    example = Example(
        {"context": "the cat sat on a mat", "question": "where the cat", "choices": ["on a mat", "far away"]},
        0,
    )
    [encoded], _ = encode_examples([example], spec, encode)
    context = [0, 1, 2, 3, 4, 5]  # the cat sat on a mat
    question = [14, 0, 1]  # where the cat
    assert encoded.sequences == [
        [S, *context, *question, D, 3, 4, 5, E],  # ... $ on a mat <e>
        [S, *context, *question, D, 8, 9, E],  # ... $ far away <e>
    ]


def test_layout_without_a_question_is_unchanged():
    spec = TaskSpec("multiple_choice", specials=SPECIALS, max_length=32)
    example = Example({"context": "the cat sat", "choices": ["yes", "no"]}, 1)
    [encoded], _ = encode_examples([example], spec, encode)
    assert encoded.sequences == [[S, 0, 1, 2, D, 10, E], [S, 0, 1, 2, D, 11, E]]


def test_truncation_cuts_the_document_before_question_and_answer():
    document, question, answer = list(range(50)), [60, 61, 62, 63, 64, 65], [70, 71, 72]
    parts = {"context": document, "question": question, "choices": [answer, [80]]}
    sequences = build_sequences("multiple_choice", parts, SPECIALS, max_length=13)  # 10 text tokens
    assert sequences == [
        [S, 0, *question, D, *answer, E],
        [S, 0, 1, 2, *question, D, 80, E],
    ]
    assert all(len(s) <= 13 for s in sequences)
    # The longest-first rule alone would have cut the question once the document was as short.
    _, cut_question, _ = fit_segments([document, question, answer], 10)
    assert cut_question != question
    # Question and answer too long by themselves: the document goes, they share the budget.
    parts = {"context": document, "question": list(range(60, 68)), "choices": [[70, 71, 72, 73, 74, 75]]}
    [sequence] = build_sequences("multiple_choice", parts, SPECIALS, max_length=11)
    assert sequence == [S, 60, 61, 62, 63, D, 70, 71, 72, 73, E]


def _write(path, rows: list[list[str]], separator: str) -> None:
    path.write_text("\n".join(separator.join(row) for row in rows) + "\n", encoding="utf-8")


ROWS = [
    ["story", "q", "a", "b", "c", "d", "answer"],
    ["the cat sat on a mat", "where the cat", "on a mat", "far away", "yes", "no", "a"],  # column name
    ["a dog ran far away", "what the dog", "sat", "ran", "yes", "no", "1"],  # 0-based index
    ["the dog sat", "who sat", "the cat", "the dog", "a mat", "no", "the dog"],  # answer text
]


@pytest.mark.parametrize("suffix,separator", [(".csv", ","), (".tsv", "\t")])
def test_read_table_with_a_question_column(tmp_path, suffix, separator):
    path = tmp_path / f"stories{suffix}"
    _write(path, ROWS, separator)
    examples = read_table(path, "multiple_choice", parse_columns(COLUMNS))
    assert [e.label for e in examples] == [0, 1, 1]
    assert examples[0].fields == {
        "context": "the cat sat on a mat",
        "choices": ["on a mat", "far away", "yes", "no"],
        "question": "where the cat",
    }
    assert examples[2].source == f"{path}, line 4"
    # Without the question in the mapping (and no column named "question") the field is absent.
    plain = read_table(path, "multiple_choice", parse_columns("context=story,choices=a|b|c|d,label=answer"))
    assert all("question" not in e.fields for e in plain)


def test_a_column_named_question_is_read_by_default(tmp_path):
    path = tmp_path / "stories.csv"
    _write(path, [["story", "question", "a", "b", "answer"], ["the cat", "who sat", "yes", "no", "0"]], ",")
    [example] = read_table(path, "multiple_choice", parse_columns("context=story,choices=a|b,label=answer"))
    assert example.fields["question"] == "who sat"


def test_missing_question_column_names_file_line_and_column(tmp_path):
    path = tmp_path / "stories.csv"
    _write(path, [["story", "a", "b", "answer"], ["the cat", "yes", "no", "0"]], ",")
    with pytest.raises(DataError, match=r"stories.csv, line 2: missing column 'q' for field 'question'"):
        read_table(
            path, "multiple_choice", parse_columns("context=story,question=q,choices=a|b,label=answer")
        )


def test_an_empty_question_is_a_bad_row(tmp_path):
    path = tmp_path / "stories.csv"
    _write(path, [["story", "q", "a", "b", "answer"], ["the cat", "", "yes", "no", "0"]], ",")
    examples = read_table(
        path, "multiple_choice", parse_columns("context=story,question=q,choices=a|b,label=answer")
    )
    spec = TaskSpec("multiple_choice", specials=SPECIALS)
    with pytest.raises(DataError, match=r"stories.csv, line 2: field 'question' is empty"):
        encode_examples(examples, spec, encode)
    assert encode_examples(examples, spec, encode, skip_bad_rows=True) == ([], 1)


def _write_story_questions(train, dev) -> None:
    """16 stories, each with a question and four answers (the answer given by column name, by 0-based
    index and by its text, in turn): all in ``train``, the first 8 in ``dev``."""
    rows = [["story", "q", "a", "b", "c", "d", "answer"]]
    for i in range(16):
        cat_first = i % 2 == 0
        story = "the cat sat on the mat. the dog ran away." if cat_first else "the dog sat. the cat ran."
        question = "where did the cat go?" if i % 4 < 2 else "what did the dog do?"
        rows.append(
            [story, question, "sat", "ran away", "on the mat", "nothing", ["a", "1", "on the mat"][i % 3]]
        )
    _write(train, rows, ",")
    _write(dev, rows[:9], ",")


def _answer_probabilities_by_hand(model: TaskModel, example: Example, with_question: bool) -> list[float]:
    """[z; q; $; a_k] for each answer (without q if not ``with_question``), W_y at <e>, softmax over the
    answers: the model's scores, one sequence at a time."""
    tokenizer = model.tokenizer
    ids = special_token_ids(tokenizer)
    start, delim, extract = ids["_start_"], ids["_delimiter_"], ids["_classify_"]
    question = tokenizer.encode(example.fields["question"]) if with_question else []
    sequences = [
        [
            start,
            *tokenizer.encode(example.fields["context"]),
            *question,
            delim,
            *tokenizer.encode(a),
            extract,
        ]
        for a in example.fields["choices"]
    ]
    with torch.no_grad():
        logits = [model(torch.tensor([[s]]), torch.tensor([[len(s) - 1]])).logits[0, 0] for s in sequences]
    return torch.stack(logits).softmax(-1).tolist()


def test_finetune_and_predict_with_a_question(tmp_path, small_tokenizer):
    """A tiny run on a story/question/answers CSV; the saved model's predictions use the question."""
    _write_story_questions(tmp_path / "train.csv", tmp_path / "dev.csv")
    config = FinetuneConfig(
        task="multiple_choice",
        train=str(tmp_path / "train.csv"),
        dev=str(tmp_path / "dev.csv"),
        columns=COLUMNS,
        tokenizer=str(small_tokenizer),
        model=ModelShape(preset="tiny", d_model=32),
        out=str(tmp_path / "run"),
        epochs=1,
        training=dataclasses.replace(
            paper_finetuning(), lr=1e-3, batch_size=8, precision="fp32", progress=False
        ),
    )
    results = finetune(config)
    assert results["examples"] == {"train": 16, "dev": 8}

    dev = read_table(tmp_path / "dev.csv", "multiple_choice", parse_columns(COLUMNS))
    predictions = predict(tmp_path / "run", dev)
    assert len(predictions) == 8

    # The same scores by hand, from the saved model.
    model = TaskModel.from_pretrained(tmp_path / "run")
    for prediction, example in zip(predictions, dev):
        expected = _answer_probabilities_by_hand(model, example, with_question=True)
        assert list(prediction["probabilities"].values()) == pytest.approx(expected, abs=1e-5)
        assert prediction["label"] == max(range(4), key=lambda k: expected[k])
    # The question changes the scores: without it, some example's answers score otherwise.
    assert any(
        _answer_probabilities_by_hand(model, e, with_question=False)
        != pytest.approx(_answer_probabilities_by_hand(model, e, with_question=True), abs=1e-5)
        for e in dev
    )


def test_a_question_column_mapped_to_the_context_is_not_read_twice(tmp_path):
    """ARC-style files: the stem is the context (--columns context=question); no second question."""
    path = tmp_path / "arc.csv"
    _write(
        path,
        [["question", "A", "B", "answerKey"], ["Which gas do plants take in?", "oxygen", "CO2", "B"]],
        ",",
    )
    [example] = read_table(
        path, "multiple_choice", parse_columns("context=question,choices=A|B,label=answerKey")
    )
    assert example.fields == {"context": "Which gas do plants take in?", "choices": ["oxygen", "CO2"]}
    assert example.label == 1
