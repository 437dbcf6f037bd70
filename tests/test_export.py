"""Models out: ONNX files run in ONNX Runtime, GGUF files read back with gguf's reader.

ONNX: logits within 1e-4 of gptkit's on several batch sizes and lengths, and a greedy continuation
decoded step by step through the past-key/value variant identical to gptkit's, for GPT-1 and GPT-2.
GGUF: the metadata and tokenizer llama.cpp reads, tensor names and the shapes llama.cpp's ``gpt2``
loader declares, values equal to the weights (f32), their exact fp16/bf16 casts (f16, bf16), and for
q8_0 the bytes of llama.cpp's reference Q8_0 (written here), within half a step per block, and a forward pass computed from the file's tensors the way llama.cpp's
``gpt2`` graph computes it, against gptkit's logits.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from gptkit import GPT, GPTConfig, Tokenizer, generate
from gptkit.cli import main
from gptkit.export import ExportConfig

ort = pytest.importorskip("onnxruntime", reason="the export extra: pip install -e '.[export]'")
gguf = pytest.importorskip("gguf", reason="the export extra: pip install -e '.[export]'")

from gptkit.export.gguf import GPT1_REFUSAL, export_gguf  # noqa: E402
from gptkit.export.onnx import past_names, present_names  # noqa: E402

pytestmark = pytest.mark.slow  # ONNX and GGUF exports of several models

SMALL = dict(n_layer=2, n_head=2, d_model=32, context_length=64, dropout=0.0)


def small_model(preset: str, vocab_size: int = 97) -> GPT:
    return GPT(GPTConfig.from_preset(preset, vocab_size=vocab_size, **SMALL)).eval()


# ONNX ------------------------------------------------------------------------------------------


# Exports per preset. Each takes seconds (torch.export, decompositions, the ONNX translation), so
# GPT-1 exports the decoding variant only: it runs GPT-1's blocks, and its prompt step with an empty
# past is the whole-sequence graph's computation; GPT-2 exports both.
ONNX_VARIANTS = {"gpt1": ("past",), "gpt2": ("sequence", "past")}


@pytest.fixture(scope="module", params=sorted(ONNX_VARIANTS))
def onnx_sessions(request, tmp_path_factory):
    """A GPT-1 (post-LN) or GPT-2 (pre-LN) model and ONNX Runtime sessions of its exports, written
    by `gptkit export` from the model's directory."""
    torch.manual_seed(0)
    model = small_model(request.param)
    model_dir = tmp_path_factory.mktemp(f"{request.param}-model")
    model.save_pretrained(model_dir)
    directory = tmp_path_factory.mktemp(f"onnx-{request.param}")
    sessions = {}
    for variant in ONNX_VARIANTS[request.param]:
        path = directory / f"{variant}.onnx"
        assert main(["export", str(model_dir), str(path), *(["--past"] if variant == "past" else [])]) == 0
        sessions[variant] = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    # Written whole, and nothing else: no staging directory or weights file left beside.
    assert sorted(p.name for p in directory.iterdir()) == sorted(f"{v}.onnx" for v in sessions)
    return model, sessions


def empty_past(model: GPT, batch: int) -> dict[str, np.ndarray]:
    config = model.config
    shape = (batch, config.n_head, 0, config.head_size)
    return {name: np.zeros(shape, np.float32) for name in past_names(config.n_layer)}


def test_onnx_logits_equal_gptkits_for_any_batch_and_length(onnx_sessions):
    model, sessions = onnx_sessions
    if "sequence" in sessions:
        sequence = sessions["sequence"]
        assert [(i.name, i.shape) for i in sequence.get_inputs()] == [("input_ids", ["batch", "sequence"])]
        assert [(o.name, o.shape) for o in sequence.get_outputs()] == [("logits", ["batch", "sequence", 97])]
    for batch, length in [(1, 1), (2, 7), (3, 20), (1, 64)]:
        ids = torch.randint(0, 97, (batch, length))
        with torch.no_grad():
            expected = model(ids).logits.numpy()
        for variant, session in sessions.items():
            # The decoding variant on a prompt: the same logits, from an empty past.
            feeds = {"input_ids": ids.numpy(), **(empty_past(model, batch) if variant == "past" else {})}
            got = session.run(["logits"], feeds)[0]
            assert got.shape == expected.shape
            assert np.abs(got - expected).max() < 1e-4, (variant, batch, length)


def test_onnx_greedy_decoding_with_past_equals_gptkits(onnx_sessions):
    model, sessions = onnx_sessions
    past, n_layer = sessions["past"], model.config.n_layer
    assert [i.name for i in past.get_inputs()] == ["input_ids", *past_names(n_layer)]
    assert [o.name for o in past.get_outputs()] == ["logits", *present_names(n_layer)]
    prompt = torch.randint(0, 97, (3, 6))
    expected = generate(model, prompt, 20, temperature=0)

    feeds = {"input_ids": prompt.numpy(), **empty_past(model, 3)}
    sequence = prompt.numpy()
    for _ in range(20):
        logits, *present = past.run(None, feeds)
        assert present[0].shape == (3, model.config.n_head, sequence.shape[1], model.config.head_size)
        with torch.no_grad():  # each step's logits against the whole sequence recomputed
            full = model(torch.from_numpy(sequence)).logits[:, -1].numpy()
        assert np.abs(logits[:, -1] - full).max() < 1e-4
        next_ids = logits[:, -1].argmax(-1)[:, None]
        sequence = np.concatenate([sequence, next_ids], axis=1)
        feeds = {"input_ids": next_ids, **dict(zip(past_names(n_layer), present))}
    np.testing.assert_array_equal(sequence, expected.numpy())


def test_onnx_file_records_the_config(onnx_sessions):
    model, sessions = onnx_sessions
    for variant, session in sessions.items():
        meta = session.get_modelmeta().custom_metadata_map
        assert json.loads(meta["gptkit.config"]) == model.config.to_dict()
        assert meta["gptkit.variant"] == variant


# GGUF ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2_tokenizer(data_dir) -> Tokenizer:
    return Tokenizer.from_pretrained(data_dir / "gpt2_bpe")


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory) -> Tokenizer:
    """A byte-level BPE in GPT-2's format: the 256 bytes, six merges and <|endoftext|> (263 tokens;
    gguf's reader takes seconds to parse GPT-2's 50,257 tokens and 50,000 merges)."""
    from gptkit.tokenizer.bytelevel import byte_to_char

    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("r", "e")]
    tokens = [*byte_to_char().values(), *(left + right for left, right in merges), "<|endoftext|>"]
    directory = tmp_path_factory.mktemp("tokenizer")
    (directory / "encoder.json").write_text(
        json.dumps({t: i for i, t in enumerate(tokens)}), encoding="utf-8"
    )
    lines = "".join(f"{left} {right}\n" for left, right in merges)
    (directory / "vocab.bpe").write_text("#version: 0.2\n" + lines, encoding="utf-8")
    return Tokenizer.from_pretrained(directory)


@pytest.fixture(scope="module")
def gpt2_vocabulary_file(gpt2_tokenizer, tmp_path_factory):
    """A GPT-2-shaped model over GPT-2's own vocabulary, as f32 GGUF, read back."""
    torch.manual_seed(0)
    model = small_model("gpt2", vocab_size=len(gpt2_tokenizer))
    path = export_gguf(model, gpt2_tokenizer, tmp_path_factory.mktemp("gguf") / "gpt2.gguf")
    return model, gguf.GGUFReader(path)


@pytest.fixture(scope="module")
def gguf_files(small_tokenizer, tmp_path_factory):
    """A GPT-2-shaped model over the small vocabulary, written in each dtype and read back."""
    torch.manual_seed(0)
    model = small_model("gpt2", vocab_size=len(small_tokenizer))
    directory = tmp_path_factory.mktemp("gguf")
    readers = {}
    for dtype in ("f32", "f16", "bf16", "q8_0"):
        readers[dtype] = gguf.GGUFReader(
            export_gguf(model, small_tokenizer, directory / f"{dtype}.gguf", dtype)
        )
    return model, readers


def field(reader, key):
    return reader.fields[key].contents()


def tensor_values(reader) -> dict[str, np.ndarray]:
    """Every tensor as float32 in numpy's order (quantized ones dequantized)."""
    return {
        t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape(
            tuple(int(n) for n in reversed(t.shape))
        )
        for t in reader.tensors
    }


def test_gguf_metadata_and_tokenizer_are_what_llama_cpp_reads(gpt2_vocabulary_file, gguf_files, data_dir):
    model, reader = gpt2_vocabulary_file
    config = model.config
    assert field(reader, "general.architecture") == "gpt2"
    assert field(reader, "gpt2.context_length") == config.context_length
    assert field(reader, "gpt2.embedding_length") == config.d_model
    assert field(reader, "gpt2.feed_forward_length") == 4 * config.d_model
    assert field(reader, "gpt2.block_count") == config.n_layer
    assert field(reader, "gpt2.attention.head_count") == config.n_head
    assert field(reader, "gpt2.attention.layer_norm_epsilon") == pytest.approx(config.layer_norm_eps)
    assert field(reader, "tokenizer.ggml.model") == "gpt2"
    assert field(reader, "tokenizer.ggml.pre") == "gpt-2"
    # The token list is GPT-2's encoder.json in id order; the merges are vocab.bpe's lines.
    encoder = json.loads((data_dir / "gpt2_bpe" / "encoder.json").read_text(encoding="utf-8"))
    tokens = field(reader, "tokenizer.ggml.tokens")
    assert tokens == sorted(encoder, key=encoder.get)
    merges = (data_dir / "gpt2_bpe" / "vocab.bpe").read_text(encoding="utf-8").splitlines()[1:]
    assert field(reader, "tokenizer.ggml.merges") == [m for m in merges if m]
    types = field(reader, "tokenizer.ggml.token_type")
    assert types[50256] == gguf.TokenType.CONTROL and set(types[:50256]) == {gguf.TokenType.NORMAL}
    assert (
        field(reader, "tokenizer.ggml.bos_token_id") == field(reader, "tokenizer.ggml.eos_token_id") == 50256
    )
    assert field(reader, "tokenizer.ggml.add_bos_token") is False
    assert {t.name: tuple(int(n) for n in t.shape) for t in reader.tensors} == llama_cpp_shapes(config)
    file_types = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16}
    file_types |= {"bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}
    for dtype, other in gguf_files[1].items():
        assert field(other, "general.file_type") == file_types[dtype]


def llama_cpp_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """The shapes llama.cpp's gpt2 loader declares (ggml order: the fastest dimension first)."""
    d, ff, V, ctx = config.d_model, 4 * config.d_model, config.total_vocab_size, config.context_length
    shapes = {
        "token_embd.weight": (d, V),
        "position_embd.weight": (d, ctx),
        "output_norm.weight": (d,),
        "output_norm.bias": (d,),
        "output.weight": (d, V),
    }
    for i in range(config.n_layer):
        shapes |= {
            f"blk.{i}.attn_norm.weight": (d,),
            f"blk.{i}.attn_norm.bias": (d,),
            f"blk.{i}.attn_qkv.weight": (d, 3 * d),
            f"blk.{i}.attn_qkv.bias": (3 * d,),
            f"blk.{i}.attn_output.weight": (d, d),
            f"blk.{i}.attn_output.bias": (d,),
            f"blk.{i}.ffn_norm.weight": (d,),
            f"blk.{i}.ffn_norm.bias": (d,),
            f"blk.{i}.ffn_up.weight": (d, ff),
            f"blk.{i}.ffn_up.bias": (ff,),
            f"blk.{i}.ffn_down.weight": (ff, d),
            f"blk.{i}.ffn_down.bias": (d,),
        }
    return shapes


def hf_gpt2_weights(model: GPT) -> dict[str, np.ndarray]:
    """Our weights under llama.cpp's names, the way its converter maps GPT2LMHeadModel's: Conv1D
    weights (in, out) transposed to (out, in)."""
    from gptkit.model.weights import state_dict_to_hf

    hf = {
        k.removeprefix("transformer."): v.numpy()
        for k, v in state_dict_to_hf(model.config, model.state_dict()).items()
    }
    names = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm"}
    names |= {"mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
    out = {"token_embd.weight": hf["wte.weight"], "position_embd.weight": hf["wpe.weight"]}
    out |= {
        "output_norm.weight": hf["ln_f.weight"],
        "output_norm.bias": hf["ln_f.bias"],
        "output.weight": hf["wte.weight"],
    }
    for i in range(model.config.n_layer):
        for ours, theirs in names.items():
            weight = hf[f"h.{i}.{ours}.weight"]
            out[f"blk.{i}.{theirs}.weight"] = weight.T if weight.ndim == 2 else weight
            out[f"blk.{i}.{theirs}.bias"] = hf[f"h.{i}.{ours}.bias"]
    return out


def test_gguf_tensors_have_llama_cpps_names_shapes_and_the_weights(gguf_files):
    model, readers = gguf_files
    shapes = llama_cpp_shapes(model.config)
    expected = hf_gpt2_weights(model)
    for dtype, reader in readers.items():
        assert {t.name: tuple(int(n) for n in t.shape) for t in reader.tensors} == shapes
        types = {t.name: t.tensor_type for t in reader.tensors}
        for name, values in tensor_values(reader).items():
            reference = expected[name]
            is_matrix = reference.ndim == 2 and name != "position_embd.weight"
            if dtype == "f32" or not is_matrix:
                assert types[name] == gguf.GGMLQuantizationType.F32
                np.testing.assert_array_equal(values, reference, err_msg=f"{dtype} {name}")
            elif dtype in ("f16", "bf16"):
                # Matrices (the token embedding included) as the exact round-to-nearest-even cast.
                assert types[name] == getattr(gguf.GGMLQuantizationType, dtype.upper()), name
                cast = torch.from_numpy(reference).to(torch.float16 if dtype == "f16" else torch.bfloat16)
                np.testing.assert_array_equal(values, cast.float().numpy(), err_msg=f"{dtype} {name}")
            else:
                assert types[name] == gguf.GGMLQuantizationType.Q8_0
                # Q8_0: each block of 32 weights is d·q with q = round(w / d) an int8, d = max|w|/127,
                # stored in fp16: |w - fp16(d)·q| <= d/2 + |q|·|d - fp16(d)| <= d·(1/2 + 127·2^-11).
                blocks = reference.reshape(-1, 32)
                bound = np.abs(blocks).max(axis=1, keepdims=True) / 127 * (0.5 + 127 * 2.0**-11) + 1e-8
                assert np.all(np.abs(values.reshape(-1, 32) - blocks) <= bound), name


def reference_q8_0(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's reference Q8_0 (quantize_row_q8_0_ref), written here from its definition: each block
    of 32 consecutive weights of a row gets d = max|w| / 127 (float32) and q = roundf(w · (1/d)),
    rounding half away from zero; d is stored as fp16. Returns (fp16 scales (blocks,), int8 (blocks, 32))."""
    blocks = weights.astype(np.float32).reshape(-1, 32)
    d = np.abs(blocks).max(axis=1) / np.float32(127)
    inverse = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    scaled = blocks * inverse[:, None]
    q = np.sign(scaled) * np.floor(np.abs(scaled) + np.float32(0.5))
    return d.astype(np.float16), q.astype(np.int8)


def read_q8_0(tensor) -> tuple[np.ndarray, np.ndarray]:
    """A Q8_0 tensor's raw bytes, read by hand: blocks of 34 bytes, an fp16 scale then 32 int8."""
    raw = np.asarray(tensor.data, dtype=np.uint8).reshape(-1, 34)
    return raw[:, :2].copy().view(np.float16)[:, 0], raw[:, 2:].copy().view(np.int8)


def test_gguf_q8_0_holds_llama_cpps_blocks(gguf_files):
    """The q8_0 file's matrices are byte for byte ggml's reference quantization, and the weights
    dequantized by hand (scale · q) are within half a quantization step of the model's, per block."""
    model, readers = gguf_files
    expected = hf_gpt2_weights(model)
    quantized = [t for t in readers["q8_0"].tensors if t.tensor_type == gguf.GGMLQuantizationType.Q8_0]
    # Every matrix but the position table, the token embedding (and the tied output) included.
    assert sorted(t.name for t in quantized) == sorted(
        name for name, w in expected.items() if w.ndim == 2 and name != "position_embd.weight"
    )
    for tensor in quantized:
        scales, q = read_q8_0(tensor)
        reference_scales, reference_q = reference_q8_0(expected[tensor.name])
        np.testing.assert_array_equal(scales, reference_scales, err_msg=tensor.name)
        np.testing.assert_array_equal(q, reference_q, err_msg=tensor.name)
        blocks = expected[tensor.name].reshape(-1, 32)
        error = np.abs(scales.astype(np.float32)[:, None] * q - blocks).max(axis=1)
        # Rounding costs at most half a step, d/2; the scale's own fp16 rounding (|d - fp16(d)| ≤
        # 2^-11·d) adds up to 127·2^-11·d at the largest |q|. Measured: the first term dominates.
        step = scales.astype(np.float32)
        assert np.all(error <= step * (0.5 + 127 * 2.0**-11) * (1 + 2.0**-11) + 1e-12), tensor.name


def llama_cpp_gpt2_forward(tensors: dict[str, np.ndarray], config: GPTConfig, ids: np.ndarray) -> np.ndarray:
    """GPT-2 as llama.cpp's gpt2 graph computes it, from the file's tensors (numpy order (out, in),
    so a product is x·Wᵀ), written here independently of gptkit's model: logits (T, V)."""

    def norm(x, name):
        mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + config.layer_norm_eps) * tensors[f"{name}.weight"] + tensors[
            f"{name}.bias"
        ]

    def linear(x, name):
        return x @ tensors[f"{name}.weight"].T + tensors[f"{name}.bias"]

    T, d, heads = len(ids), config.d_model, config.n_head
    x = tensors["token_embd.weight"][ids] + tensors["position_embd.weight"][:T]
    causal = np.tril(np.ones((T, T), dtype=bool))
    for i in range(config.n_layer):
        q, k, v = np.split(linear(norm(x, f"blk.{i}.attn_norm"), f"blk.{i}.attn_qkv"), 3, axis=-1)
        q, k, v = (a.reshape(T, heads, d // heads).transpose(1, 0, 2) for a in (q, k, v))
        scores = np.where(causal, q @ k.transpose(0, 2, 1) / np.sqrt(d // heads), -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        attended = (weights / weights.sum(-1, keepdims=True)) @ v
        x = x + linear(attended.transpose(1, 0, 2).reshape(T, d), f"blk.{i}.attn_output")
        h = linear(norm(x, f"blk.{i}.ffn_norm"), f"blk.{i}.ffn_up")
        h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))  # ggml_gelu: the tanh form
        x = x + linear(h, f"blk.{i}.ffn_down")
    return norm(x, "output_norm") @ tensors["output.weight"].T


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def test_gguf_tensors_compute_the_model_in_llama_cpps_graph(gguf_files, small_tokenizer):
    model, readers = gguf_files
    ids = np.array(small_tokenizer.encode("The quick brown fox jumps over the lazy dog, and then"))
    with torch.no_grad():
        expected = model(torch.from_numpy(ids)[None]).logits[0].double().numpy()
    # Next-token log-probabilities at every position: f32 to float rounding; f16 and q8_0 as their
    # rounding allows (this small random model measured 2e-4 and 5e-3 over GPT-2's vocabulary).
    tolerance = {"f32": 1e-5, "f16": 2e-3, "bf16": 0.015, "q8_0": 0.03}
    for dtype, reader in readers.items():
        tensors = {name: values.astype(np.float64) for name, values in tensor_values(reader).items()}
        got = llama_cpp_gpt2_forward(tensors, model.config, ids)
        assert np.abs(log_softmax(got) - log_softmax(expected)).max() < tolerance[dtype], dtype


HELD_OUT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age "
    "of foolishness, it was the epoch of belief."
)


# llama.cpp runs in a process of its own: a crash in it (on an Intel CPU with AMX its q8_0 product
# segfaults on these files, ggml-org/llama.cpp#20824) fails the one test, naming the signal, rather
# than taking the pytest run down. On such a CPU q8_0 loads with use_extra_bufts off, which avoids it.
LLAMA_CPP_SCORES = """
import json, sys
import numpy as np
import llama_cpp
import llama_cpp.llama_cpp as binding

spec = json.loads(sys.argv[1])
if not spec["extra_bufts"]:
    defaults = binding.llama_model_default_params

    def without_extra_bufts():
        params = defaults()
        if hasattr(params, "use_extra_bufts"):
            params.use_extra_bufts = False
        return params

    binding.llama_model_default_params = without_extra_bufts
llm = llama_cpp.Llama(model_path=spec["path"], n_ctx=spec["n_ctx"], logits_all=True, verbose=False)
llm.eval(spec["ids"])
np.save(spec["out"], np.array(llm.scores[: len(spec["ids"])]))
"""


def has_amx() -> bool:
    try:
        return any(
            {"amx_int8", "amx_tile"} & set(line.split())
            for line in open("/proc/cpuinfo").read().splitlines()
            if line.startswith("flags")
        )
    except OSError:
        return False


def llama_cpp_scores(path, ids: list[int], n_ctx: int, extra_bufts: bool = True) -> np.ndarray:
    """llama.cpp's logits at every position of ``ids`` for the GGUF file ``path``, computed in a
    process of its own (a crash there fails this test, not the run)."""
    out = path.with_suffix(".scores.npy")
    spec = {"path": str(path), "ids": ids, "n_ctx": n_ctx, "extra_bufts": extra_bufts, "out": str(out)}
    done = subprocess.run(
        [sys.executable, "-c", LLAMA_CPP_SCORES, json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode < 0:
        pytest.fail(f"llama.cpp crashed on {path.name} (signal {signal.Signals(-done.returncode).name})")
    if done.returncode != 0:
        pytest.fail(f"llama.cpp failed on {path.name}: {done.stderr.strip()[-1000:]}")
    return np.load(out)


def test_gguf_q8_0_perplexity_in_llama_cpp_is_within_one_percent_of_f32(small_tokenizer, tmp_path):
    """llama.cpp itself runs the f32 and q8_0 files: perplexity on a text the model never saw, f32
    equal to gptkit's (to ggml's float rounding), q8_0 within 1% of f32."""
    if importlib.util.find_spec("llama_cpp") is None:  # found, not imported: it runs in its own process
        pytest.skip("llama.cpp's binding: pip install -e '.[llama]' (builds llama.cpp from source)")
    torch.manual_seed(0)
    model = small_model("gpt2", vocab_size=len(small_tokenizer))
    # Larger matrices than init's: peaked next-token distributions (at init they are near-uniform, and
    # any rounding would leave the perplexity where it is).
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim == 2:
                parameter.normal_(0.0, 0.15)
    ids = small_tokenizer.encode(HELD_OUT)[: model.config.context_length]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double().numpy()
    perplexity = {"gptkit": next_token_perplexity(logits, ids)}
    for quantize in ("f32", "q8_0"):
        path = export_gguf(model, small_tokenizer, tmp_path / f"{quantize}.gguf", quantize=quantize)
        extra_bufts = not (quantize == "q8_0" and has_amx())
        scores = llama_cpp_scores(path, ids, model.config.context_length, extra_bufts)
        perplexity[quantize] = next_token_perplexity(scores, ids)
    assert perplexity["f32"] == pytest.approx(perplexity["gptkit"], rel=1e-3), perplexity
    assert perplexity["q8_0"] == pytest.approx(perplexity["f32"], rel=0.01), perplexity


def next_token_perplexity(logits: np.ndarray, ids: list[int]) -> float:
    """exp of the mean negative log-probability of each next token (positions 0 … n-2 predict 1 … n-1)."""
    log_probs = log_softmax(logits.astype(np.float64))[:-1]
    return float(np.exp(-log_probs[np.arange(len(ids) - 1), ids[1:]].mean()))


def test_gguf_pads_token_rows_the_tokenizer_has_no_token_for(small_tokenizer, tmp_path):
    model = small_model("gpt2", vocab_size=len(small_tokenizer))
    model.add_special_tokens(3)  # e.g. fine-tuning's added tokens
    reader = gguf.GGUFReader(export_gguf(model, small_tokenizer, tmp_path / "padded.gguf"))
    tokens = field(reader, "tokenizer.ggml.tokens")
    assert len(tokens) == model.config.total_vocab_size == 266
    assert tokens[-4:] == ["<|endoftext|>", "[PAD263]", "[PAD264]", "[PAD265]"]
    assert field(reader, "tokenizer.ggml.token_type")[-3:] == [gguf.TokenType.UNUSED] * 3


def test_gguf_refuses_gpt1_and_what_llama_cpp_cannot_run(small_tokenizer, data_dir, tmp_path):
    with pytest.raises(ValueError, match="llama.cpp has no architecture for GPT-1's post-LN blocks"):
        export_gguf(small_model("gpt1", len(small_tokenizer)), small_tokenizer, tmp_path / "gpt1.gguf")
    gelu_erf = GPT(GPTConfig.from_preset("gpt2", vocab_size=263, activation="gelu", **SMALL))
    with pytest.raises(ValueError, match="tanh form"):
        export_gguf(gelu_erf, small_tokenizer, tmp_path / "erf.gguf")
    pytest.importorskip("spacy", reason="GPT-1's tokenizer: pip install -e '.[gpt1]'")
    gpt1_tokenizer = Tokenizer.from_pretrained(data_dir / "gpt1_bpe")
    with pytest.raises(ValueError, match="byte-level BPE; this tokenizer is 'gpt1'"):
        export_gguf(small_model("gpt2", len(gpt1_tokenizer)), gpt1_tokenizer, tmp_path / "bpe.gguf")
    with pytest.raises(ValueError, match="263 tokens but the model only 97"):
        export_gguf(small_model("gpt2"), small_tokenizer, tmp_path / "short.gguf")
    assert not list(tmp_path.iterdir())  # nothing written, not even in part


# The command -----------------------------------------------------------------------------------


def test_export_command_writes_a_gguf_and_refuses_gpt1_in_one_line(small_tokenizer, tmp_path, capsys):
    gpt2_dir, gpt1_dir = tmp_path / "gpt2", tmp_path / "gpt1"
    small_model("gpt2", len(small_tokenizer)).save_pretrained(gpt2_dir)
    small_tokenizer.save_pretrained(gpt2_dir)
    assert main(["export", str(gpt2_dir), str(tmp_path / "model.gguf"), "--quantize", "q8_0"]) == 0
    assert "wrote" in capsys.readouterr().out
    reader = gguf.GGUFReader(tmp_path / "model.gguf")
    assert field(reader, "general.file_type") == gguf.LlamaFileType.MOSTLY_Q8_0
    # --dtype, the flag's first name, still works, and says it is deprecated.
    assert main(["export", str(gpt2_dir), str(tmp_path / "bf16.gguf"), "--dtype", "bf16"]) == 0
    assert "--dtype is deprecated: use --quantize" in capsys.readouterr().err
    reader = gguf.GGUFReader(tmp_path / "bf16.gguf")
    assert field(reader, "general.file_type") == gguf.LlamaFileType.MOSTLY_BF16

    small_model("gpt1").save_pretrained(gpt1_dir)
    assert main(["export", str(gpt1_dir), str(tmp_path / "gpt1.gguf")]) == 2
    error = capsys.readouterr().err.strip()
    assert error == f"gptkit export: error: {GPT1_REFUSAL}"
    assert not (tmp_path / "gpt1.gguf").exists()


def test_export_quantize_flag_is_in_the_help_and_refuses_unknown_types(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--quantize {f32,f16,bf16,q8_0}" in help_text and "(default: f32)" in help_text
    assert "--dtype" not in help_text  # the deprecated spelling is hidden
    with pytest.raises(SystemExit) as exit_info:
        main(["export", "m", str(tmp_path / "model.gguf"), "--quantize", "q4_0"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.replace("'", "")  # quoted by some Python versions
    assert "argument --quantize: invalid choice: q4_0 (choose from f32, f16, bf16, q8_0)" in error
    assert not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match=r"quantize must be one of f32, f16, bf16, q8_0, got 'q4_0'"):
        export_gguf(small_model("gpt2"), None, tmp_path / "x.gguf", quantize="q4_0")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(out="model.bin"), "ends neither in .onnx nor .gguf"),
        (dict(out="model.onnx", quantize="q8_0"), r"ExportConfig.quantize \(--quantize\): q8_0 is for gguf"),
        (dict(out="model.gguf", quantize="int8"), "must be one of f32, f16, bf16, q8_0, got 'int8'"),
        (dict(out="model.gguf", past=True), "is for onnx"),
        (dict(out="model.onnx", format="tflite"), "must be one of onnx, gguf"),
    ],
)
def test_export_config_says_what_to_change(fields, message):
    with pytest.raises(ValueError, match=message):
        ExportConfig(model="m", **fields)
    assert ExportConfig(model="m", out="x.bin", format="gguf").resolved_format() == "gguf"


def test_a_missing_export_package_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "gguf", None)  # as if not installed
    with pytest.raises(
        ImportError, match=r"GGUF export needs the gguf package: pip install -e '\.\[export\]'"
    ):
        export_gguf(small_model("gpt2"), None, tmp_path / "x.gguf")
