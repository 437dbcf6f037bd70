"""Every damaged input is one exception whose message names the file and says what is wrong.

Each test damages one file the way files get damaged (cut short by a full disk or an interrupted
copy, overwritten with something else, edited by hand) and checks the exception type, the file's
name and the kind of problem in the message.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from gptkit import GPT, GPTConfig
from gptkit.data.prepare import prepare
from gptkit.data.shards import TokenShard
from gptkit.io import read_json, read_train_state
from gptkit.model.weights import (
    PYTORCH_NAME,
    SAFETENSORS_NAME,
    read_openai_release,
    read_state_dict,
    state_dict_to_hf,
)
from gptkit.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parents[1]


def truncate(path: Path, fraction: float = 0.5) -> None:
    """Keep the first ``fraction`` of the file's bytes, as an interrupted write or copy does."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])


# Fixtures: a tiny model, tiny shards and GPT-2's tokenizer, built once, copied per test ---------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("model")
    torch.manual_seed(0)
    GPT(GPTConfig.from_preset("tiny")).save_pretrained(directory)
    return directory


@pytest.fixture
def model(model_dir, tmp_path) -> Path:
    return Path(shutil.copytree(model_dir, tmp_path / "model"))


@pytest.fixture(scope="module")
def tokenizer_dir(data_dir, tmp_path_factory) -> Path:
    """GPT-2's vocabulary saved by gptkit: encoder.json, vocab.bpe and tokenizer_config.json."""
    directory = tmp_path_factory.mktemp("tokenizer")
    Tokenizer.from_pretrained(data_dir / "gpt2_bpe").save_pretrained(directory)
    return directory


@pytest.fixture
def tokenizer(tokenizer_dir, tmp_path) -> Path:
    return Path(shutil.copytree(tokenizer_dir, tmp_path / "tokenizer"))


@pytest.fixture(scope="module")
def shards_dir(data_dir, tokenizer_dir, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shards")
    corpus = root / "corpus.txt"
    text = (data_dir / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")[:20_000]
    corpus.write_text(text, encoding="utf-8")
    prepare(tokenizer_dir, [corpus], root / "prepared", val_fraction=0.1, show_progress=False)
    return root / "prepared"


@pytest.fixture
def shards(shards_dir, tmp_path) -> Path:
    return Path(shutil.copytree(shards_dir, tmp_path / "prepared"))


def edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)
    path.write_text(json.dumps(data), encoding="utf-8")


# Model weights -------------------------------------------------------------------------------------


def test_undamaged_fixtures_load(model, shards, tokenizer):
    """The damage below is all that is wrong: the files as written load."""
    assert GPT.from_pretrained(model).config == GPTConfig.from_preset("tiny")
    assert len(TokenShard.open(shards, "train").tokens) > 0
    assert Tokenizer.from_pretrained(tokenizer).encode("hello") == [31373]


def test_truncated_safetensors(model):
    truncate(model / SAFETENSORS_NAME)
    path = str(model / SAFETENSORS_NAME)
    with pytest.raises(ValueError, match="truncated or not a safetensors file") as error:
        GPT.from_pretrained(model)
    assert path in str(error.value) and "re-download or re-save" in str(error.value)
    with pytest.raises(ValueError, match="truncated or not a safetensors file") as error:
        read_state_dict(model)
    assert path in str(error.value)


def test_garbage_safetensors(model):
    (model / SAFETENSORS_NAME).write_bytes(b"<html>404 Not Found</html>\n" * 40)
    with pytest.raises(ValueError, match="not a safetensors file") as error:
        GPT.from_pretrained(model)
    assert str(model / SAFETENSORS_NAME) in str(error.value)


def test_truncated_pytorch_model_bin(model):
    config = GPTConfig.from_preset("tiny")
    state = state_dict_to_hf(config, GPT(config).state_dict())
    (model / SAFETENSORS_NAME).unlink()
    torch.save(state, model / PYTORCH_NAME)
    assert GPT.from_pretrained(model).config == config  # undamaged, it loads
    truncate(model / PYTORCH_NAME)
    with pytest.raises(ValueError, match="truncated") as error:
        GPT.from_pretrained(model)
    assert str(model / PYTORCH_NAME) in str(error.value)
    assert "\n" not in str(error.value)  # torch's own message runs over several lines


def test_pytorch_model_bin_of_objects_is_refused(model):
    (model / SAFETENSORS_NAME).unlink()
    torch.save({"weights": GPTConfig()}, model / PYTORCH_NAME)  # a pickled object, not tensors
    with pytest.raises(ValueError, match="Python objects other than tensors") as error:
        GPT.from_pretrained(model)
    assert str(model / PYTORCH_NAME) in str(error.value) and "\n" not in str(error.value)


def write_openai_release(directory: Path, config: GPTConfig) -> None:
    """A tiny model in the layout of OpenAI's GPT-1 release: flat arrays split over .npy files."""
    state = GPT(config).state_dict()
    order = [
        "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
        "ln_1.weight", "ln_1.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
        "mlp.c_proj.weight", "mlp.c_proj.bias", "ln_2.weight", "ln_2.bias",
    ]  # fmt: skip
    arrays = [state["wpe.weight"].numpy(), state["wte.weight"].numpy()]
    for i in range(config.n_layer):
        for name in order:
            array = state[f"h.{i}.{name}"].numpy()
            arrays.append(array.T[None] if array.ndim == 2 else array)  # Linear → conv [1, in, out]
    directory.mkdir()
    (directory / "params_shapes.json").write_text(json.dumps([list(a.shape) for a in arrays]))
    flat = np.concatenate([a.reshape(-1) for a in arrays])
    for index, part in enumerate(np.array_split(flat, 3)):
        np.save(directory / f"params_{index}.npy", part)


def test_truncated_openai_release_params(tmp_path):
    config = GPTConfig.from_preset("tiny", n_head=12, d_model=48)
    release = tmp_path / "release"
    write_openai_release(release, config)
    assert GPT.from_pretrained(release).config.d_model == 48  # undamaged, it loads
    truncate(release / "params_1.npy")
    with pytest.raises(ValueError, match="truncated") as error:
        read_openai_release(release)
    assert str(release / "params_1.npy") in str(error.value)
    (release / "params_1.npy").unlink()
    with pytest.raises(FileNotFoundError, match="params_1.npy missing"):
        read_openai_release(release)


# config.json -------------------------------------------------------------------------------------


def test_truncated_config_json(model):
    truncate(model / "config.json")
    with pytest.raises(ValueError, match="truncated") as error:
        GPT.from_pretrained(model)
    assert str(model / "config.json") in str(error.value)


def test_config_json_that_is_not_an_object(model):
    (model / "config.json").write_text("[1, 2, 3]\n")
    with pytest.raises(ValueError, match="expected a JSON object") as error:
        GPT.from_pretrained(model)
    assert str(model / "config.json") in str(error.value)


def test_config_json_with_an_invalid_gptkit_block(model):
    edit_json(model / "config.json", lambda config: config["gptkit"].update(n_head=5))
    with pytest.raises(ValueError, match="'gptkit' block is invalid: d_model") as error:
        GPT.from_pretrained(model)
    assert str(model / "config.json") in str(error.value)


def test_config_json_that_does_not_fit_the_weights(model):
    """A config edited to another shape (both its blocks, so they agree): the error names both files
    and what does not fit, before a model of the config's shape is built."""

    def reshape(**fields: int):
        hf_names = {"n_layer": "n_layer", "d_model": "n_embd"}

        def edit(config: dict) -> None:
            config["gptkit"].update(fields)
            config.update({hf_names[name]: value for name, value in fields.items()})

        return edit

    edit_json(model / "config.json", reshape(n_layer=3))
    with pytest.raises(ValueError, match="config.json: n_layer is 3, but .* holds 2: ") as error:
        GPT.from_pretrained(model)
    assert str(model / SAFETENSORS_NAME) in str(error.value)
    edit_json(model / "config.json", reshape(n_layer=2, d_model=64))
    with pytest.raises(ValueError, match="config.json: d_model is 64, but .* holds 32: ") as error:
        GPT.from_pretrained(model)
    assert str(model / SAFETENSORS_NAME) in str(error.value)


def test_config_json_hf_fields_disagreeing_with_gptkit_block_warn(model):
    def hand_edit(config: dict) -> None:
        config["n_layer"] = 6  # the gptkit block says 2
        config["layer_norm_epsilon"] = 1e-6  # and 1e-5

    edit_json(model / "config.json", hand_edit)
    with pytest.warns(UserWarning) as record:
        loaded = GPT.from_pretrained(model)
    assert len(record) == 1
    message = str(record[0].message)
    assert str(model / "config.json") in message
    assert "n_layer=6" in message and "gives 2" in message
    assert "layer_norm_epsilon=1e-06" in message and "gives 1e-05" in message
    assert "uses the 'gptkit' block" in message
    assert "n_embd" not in message  # fields that agree are not listed
    assert loaded.config.n_layer == 2


def test_agreeing_config_json_does_not_warn(model):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GPT.from_pretrained(model)


# Token shards ------------------------------------------------------------------------------------


def test_shard_shorter_than_meta_json_says(shards):
    truncate(shards / "train.bin")
    with pytest.raises(ValueError, match="the shard is truncated; re-run `gptkit prepare`") as error:
        TokenShard.open(shards, "train")
    assert str(shards / "train.bin") in str(error.value) and "meta.json" in str(error.value)


def test_shard_longer_than_meta_json_says(shards):
    with open(shards / "val.bin", "ab") as f:
        f.write(b"\0\0" * 10)
    with pytest.raises(ValueError, match="longer than meta.json says") as error:
        TokenShard.open(shards, "val")
    assert str(shards / "val.bin") in str(error.value)


def test_missing_shard(shards):
    (shards / "train.bin").unlink()
    with pytest.raises(FileNotFoundError, match="gptkit prepare") as error:
        TokenShard.open(shards, "train")
    assert str(shards / "train.bin") in str(error.value)


def test_truncated_meta_json(shards):
    truncate(shards / "meta.json")
    with pytest.raises(ValueError, match="truncated.*re-run `gptkit prepare`") as error:
        TokenShard.open(shards, "train")
    assert str(shards / "meta.json") in str(error.value)


def test_meta_json_that_is_not_an_object(shards):
    (shards / "meta.json").write_text('"train.bin"\n')
    with pytest.raises(ValueError, match="expected a JSON object") as error:
        TokenShard.open(shards, "train")
    assert str(shards / "meta.json") in str(error.value)


def test_meta_json_missing_a_field(shards):
    edit_json(shards / "meta.json", lambda meta: meta.pop("counts"))
    with pytest.raises(ValueError, match="missing field 'counts'") as error:
        TokenShard.open(shards, "train")
    assert str(shards / "meta.json") in str(error.value)


def test_meta_json_with_a_wrong_count(shards):
    edit_json(shards / "meta.json", lambda meta: meta["counts"].update(val="12"))
    with pytest.raises(ValueError, match="counts.val is '12'") as error:
        TokenShard.open(shards, "train")
    assert str(shards / "meta.json") in str(error.value)


def test_meta_json_with_a_wrong_dtype_name(shards):
    edit_json(shards / "meta.json", lambda meta: meta.update(dtype="uint17"))
    with pytest.raises(ValueError, match="dtype 'uint17' is not an unsigned integer type") as error:
        TokenShard.open(shards, "train")
    assert str(shards / "meta.json") in str(error.value)


# train_state.pt ----------------------------------------------------------------------------------


def write_train_state(path: Path) -> None:
    path.parent.mkdir(parents=True)
    optimizer = torch.optim.AdamW(torch.nn.Linear(4, 4).parameters())
    state = {
        "step": 3,
        "optimizer": optimizer.state_dict(),
        "data": {"epoch": 0},
        "rng": [torch.get_rng_state()],
    }
    torch.save(state, path)


def test_truncated_train_state(tmp_path):
    path = tmp_path / "checkpoints" / "step-0000003" / "train_state.pt"
    write_train_state(path)
    assert read_train_state(path)["step"] == 3  # undamaged, it loads
    truncate(path)
    with pytest.raises(ValueError, match="truncated") as error:
        read_train_state(path)
    message = str(error.value)
    assert str(path) in message and "step-0000003 is damaged" in message and "\n" not in message


def test_garbage_train_state(tmp_path):
    path = tmp_path / "train_state.pt"
    path.write_bytes(b"\x00garbage" * 100)
    with pytest.raises(ValueError, match="cannot be read") as error:
        read_train_state(path)
    assert str(path) in str(error.value)


def test_train_state_missing_fields(tmp_path):
    path = tmp_path / "train_state.pt"
    torch.save({"step": 3}, path)
    with pytest.raises(ValueError, match="missing field.s. optimizer, data, rng") as error:
        read_train_state(path)
    assert str(path) in str(error.value)


def test_missing_train_state(tmp_path):
    with pytest.raises(FileNotFoundError, match="train_state.pt"):
        read_train_state(tmp_path / "train_state.pt")


# Tokenizer files ---------------------------------------------------------------------------------


def test_truncated_encoder_json(tokenizer):
    truncate(tokenizer / "encoder.json")
    with pytest.raises(ValueError, match="not valid JSON: the file ends early, it is truncated") as error:
        Tokenizer.from_pretrained(tokenizer)
    assert str(tokenizer / "encoder.json") in str(error.value)


def test_encoder_json_with_a_bad_id(tokenizer):
    edit_json(tokenizer / "encoder.json", lambda encoder: encoder.update(hello="31373"))
    with pytest.raises(ValueError, match="token 'hello' has id '31373', expected an integer") as error:
        Tokenizer.from_pretrained(tokenizer)
    assert str(tokenizer / "encoder.json") in str(error.value)


def test_vocab_bpe_cut_inside_a_line(tokenizer):
    data = (tokenizer / "vocab.bpe").read_bytes()
    cut = data.index(b"\n", len(data) // 2) - 2  # two bytes before a line's end: "Ġth e" → "Ġth"
    (tokenizer / "vocab.bpe").write_bytes(data[:cut])
    with pytest.raises(ValueError, match="the file ends inside this line, it is truncated") as error:
        Tokenizer.from_pretrained(tokenizer)
    assert str(tokenizer / "vocab.bpe") in str(error.value)


def test_vocab_bpe_cut_at_a_line_end(tokenizer):
    lines = (tokenizer / "vocab.bpe").read_text(encoding="utf-8").splitlines(keepends=True)
    (tokenizer / "vocab.bpe").write_text("".join(lines[: len(lines) // 2]), encoding="utf-8")
    with pytest.raises(ValueError, match="that file is truncated") as error:
        Tokenizer.from_pretrained(tokenizer)
    assert str(tokenizer / "vocab.bpe") in str(error.value)


def test_empty_vocab_bpe(tokenizer):
    (tokenizer / "vocab.bpe").write_bytes(b"")
    with pytest.raises(ValueError, match="the file is empty") as error:
        Tokenizer.from_pretrained(tokenizer)
    assert str(tokenizer / "vocab.bpe") in str(error.value)


def test_truncated_tokenizer_config_json(tokenizer):
    truncate(tokenizer / "tokenizer_config.json")
    with pytest.raises(ValueError, match="truncated") as error:
        Tokenizer.from_pretrained(tokenizer)
    assert str(tokenizer / "tokenizer_config.json") in str(error.value)


def test_read_json_names_the_file_for_every_damage(tmp_path):
    path = tmp_path / "data.json"
    cases = {
        b"": "the file is empty",
        b'{"a": [1, 2': "truncated",
        b'{"a": "unfinished': "truncated",
        b'{"a": 1} extra': "Extra data",
        b'{"caf\xe9": 1}': "not UTF-8 text",  # Latin-1, not UTF-8
    }
    for content, problem in cases.items():
        path.write_bytes(content)
        with pytest.raises(ValueError, match=problem) as error:
            read_json(path)
        assert str(path) in str(error.value), content


# The command line --------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_reports_a_truncated_model_in_one_line(model):
    truncate(model / SAFETENSORS_NAME)
    result = subprocess.run(
        [sys.executable, "-m", "gptkit", "generate", "--model", str(model), "--prompt", "hi"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    # Other lines may report the device chosen before the model is read; the error is one line.
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith("gptkit generate: error: ")
    assert errors[0] == result.stderr.strip().splitlines()[-1]
    assert str(model / SAFETENSORS_NAME) in errors[0] and "truncated" in errors[0]
