"""The network against the paper's equations and against transformers' implementations."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gptkit import GPT, GPTConfig
from gptkit.model import fused_next_token_loss
from gptkit.model.weights import read_openai_release

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=101, n_positions=24, n_embd=48, n_layer=2, n_head=4)


def hf_openai_gpt(**overrides):
    config = transformers.OpenAIGPTConfig(**{**TINY, **overrides})
    return transformers.OpenAIGPTLMHeadModel(config).eval()


def hf_gpt2(**overrides):
    config = transformers.GPT2Config(**{**TINY, **overrides}, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval()


def randomize_layer_norms(model: torch.nn.Module) -> None:
    """Fresh LayerNorms are (1, 0): randomise them so the parity tests would see a swapped gain/bias."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.normal_(1.0, 0.1)
                module.bias.normal_(0.0, 0.1)


@pytest.mark.parametrize("make_hf", [hf_openai_gpt, hf_gpt2], ids=["openai-gpt", "gpt2"])
def test_logits_match_transformers_both_directions(make_hf, tmp_path):
    reference = make_hf()
    randomize_layer_norms(reference)
    ids = torch.randint(0, TINY["vocab_size"], (3, TINY["n_positions"]))
    reference.save_pretrained(tmp_path / "hf")

    ours = GPT.from_pretrained(tmp_path / "hf")
    with torch.no_grad():
        expected = reference(ids).logits
        got = ours(ids).logits
    assert got.shape == (3, TINY["n_positions"], TINY["vocab_size"])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)

    # And back: what gptkit writes, transformers reads and computes the same logits from.
    ours.save_pretrained(tmp_path / "ours")
    reloaded = type(reference).from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, expected, atol=1e-4, rtol=0)


def test_gptkit_model_exported_to_transformers(tmp_path):
    """A model born in gptkit (GPT-2 layout, relu) means the same thing to transformers."""
    config = GPTConfig(
        vocab_size=77,
        context_length=16,
        n_layer=2,
        n_head=2,
        d_model=16,
        ln_position="pre",
        activation="relu",
        dropout=0.0,
    )
    ours = GPT(config).eval()
    randomize_layer_norms(ours)
    ours.save_pretrained(tmp_path)
    reference = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 77, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, reference(ids).logits, atol=1e-4, rtol=0)


def test_pytorch_bin_checkpoint_loads(tmp_path):
    reference = hf_gpt2()
    reference.save_pretrained(tmp_path)
    state = {k: v.clone() for k, v in reference.state_dict().items()}
    (tmp_path / "model.safetensors").unlink()
    torch.save(state, tmp_path / "pytorch_model.bin")
    ours = GPT.from_pretrained(tmp_path)
    ids = torch.randint(0, TINY["vocab_size"], (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, reference(ids).logits, atol=1e-4, rtol=0)


def test_from_pretrained_converts_each_block_before_the_next_is_read(tmp_path):
    """convert_block sees block i with its saved weights while the later blocks are still shapes
    only (no memory), and its result takes the block's place."""
    torch.manual_seed(0)
    saved = GPT(GPTConfig.from_preset("tiny", dropout=0.0))
    saved.save_pretrained(tmp_path)
    built, seen = [], []

    class Remembered(GPT):  # the model being loaded, to look at its later blocks
        def __init__(self, config):
            super().__init__(config)
            built.append(self)

    def convert(block):
        i = len(seen)
        assert torch.equal(block.mlp.c_fc.weight, saved.h[i].mlp.c_fc.weight)
        assert all(p.is_meta for later in built[0].h[i + 1 :] for p in later.parameters())
        seen.append(block)
        return torch.nn.Identity()

    loaded = Remembered.from_pretrained(tmp_path, convert_block=convert)
    assert len(seen) == saved.config.n_layer
    assert all(isinstance(block, torch.nn.Identity) for block in loaded.h)
    assert torch.equal(loaded.wte.weight, saved.wte.weight)
    assert not any(p.is_meta for p in loaded.parameters())


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads Linux's /proc/self/maps")
def test_from_pretrained_lets_go_of_each_tensor_of_the_file_once_copied(tmp_path):
    """Each tensor read from model.safetensors has a mapping of the file of its own (gptkit.io): once
    the tensors outside the blocks are copied, only the blocks' are still mapped, so the pages of
    the embedding (GPT-2's largest tensor) have left memory while the blocks load."""
    saved = GPT(GPTConfig.from_preset("tiny"))
    saved.save_pretrained(tmp_path)
    file = str(tmp_path / "model.safetensors")
    still_mapped = []

    def count_mappings(model):
        maps = Path("/proc/self/maps").read_text().splitlines()
        still_mapped.append(sum(line.endswith(file) for line in maps))

    GPT.from_pretrained(tmp_path, convert_embeddings=count_mappings)
    assert still_mapped == [sum(name.startswith("h.") for name in saved.state_dict())]


def test_from_pretrained_copies_each_tensor_of_the_file_into_memory_of_its_own(tmp_path):
    """Loading builds shapes only, then copies the file's tensors in: the parameters are the saved
    ones (in the dtype asked for), contiguous and trainable, and no random initialisation draws
    from the caller's generator."""
    torch.manual_seed(0)
    saved = GPT(GPTConfig.from_preset("tiny", dropout=0.0))
    randomize_layer_norms(saved)
    saved.save_pretrained(tmp_path)
    expected = saved.state_dict()

    generator_state = torch.random.get_rng_state()
    loaded = GPT.from_pretrained(tmp_path)
    assert torch.equal(torch.random.get_rng_state(), generator_state)
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
        assert tensor.device.type == "cpu" and tensor.is_contiguous(), name
    assert all(p.requires_grad for p in loaded.parameters())

    # The parameters are the model's own memory, not the file's pages: training writes them, and
    # the file still holds what was saved.
    loaded.train()
    optimizer = torch.optim.SGD(loaded.parameters(), lr=0.1)
    loaded(torch.randint(0, 512, (2, 8)), labels=torch.randint(0, 512, (2, 8))).loss.backward()
    optimizer.step()
    assert not torch.equal(loaded.h[0].mlp.c_fc.weight, expected["h.0.mlp.c_fc.weight"])
    again = GPT.from_pretrained(tmp_path)
    assert torch.equal(again.h[0].mlp.c_fc.weight, expected["h.0.mlp.c_fc.weight"])

    in_bf16 = GPT.from_pretrained(tmp_path, dtype=torch.bfloat16)
    for name, tensor in in_bf16.state_dict().items():
        assert torch.equal(tensor, expected[name].to(torch.bfloat16)), name


def test_loss_is_mean_next_token_negative_log_likelihood():
    """L1 = Σ log P(u_i | u_<i) (eq. 1): computed here position by position, by hand."""
    model = GPT(GPTConfig.from_preset("tiny", dropout=0.0)).eval()
    ids = torch.randint(0, 512, (2, 9))
    labels = ids.clone()
    labels[0, 3] = -100  # ignored as a target
    labels[1, 0] = -100  # position 0 is never a target anyway
    with torch.no_grad():
        out = model(ids, labels=labels)

    total, count = 0.0, 0
    for b in range(2):
        for i in range(ids.size(1) - 1):  # position i predicts token i+1; the last predicts nothing
            target = int(labels[b, i + 1])
            if target == -100:
                continue
            log_probs = out.logits[b, i].double().log_softmax(-1)
            total -= float(log_probs[target])
            count += 1
    assert count == 2 * 8 - 1
    assert out.loss.item() == pytest.approx(total / count, rel=1e-5)


def test_hidden_states_are_h_n_before_the_tied_output_layer():
    model = GPT(GPTConfig.from_preset("tiny")).eval()
    ids = torch.randint(0, 512, (1, 7))
    out = model(ids)
    assert out.hidden_states.shape == (1, 7, 32)
    # P(u) = softmax(h_n · W_e^T): the output layer is the input embedding.
    torch.testing.assert_close(out.logits, out.hidden_states @ model.wte.weight.T)


def test_post_ln_block_matches_gpt1_equations():
    """GPT-1 block by hand: n = LN(h + attn(h)); h' = LN(n + MLP(n))."""
    config = GPTConfig(vocab_size=11, context_length=8, n_layer=1, n_head=2, d_model=8, dropout=0.0)
    model = GPT(config).eval()
    randomize_layer_norms(model)
    ids = torch.randint(0, 11, (1, 5))
    block = model.h[0]
    h0 = model.wte.weight[ids] + model.wpe.weight[:5]

    q, k, v = (h0 @ block.attn.c_attn.weight.T + block.attn.c_attn.bias).split(8, dim=-1)
    heads = []
    for head in range(2):
        sl = slice(4 * head, 4 * head + 4)
        scores = q[..., sl] @ k[..., sl].transpose(-1, -2) / math.sqrt(4)
        scores = scores.masked_fill(torch.triu(torch.ones(5, 5, dtype=torch.bool), 1), float("-inf"))
        heads.append(scores.softmax(-1) @ v[..., sl])
    attn = torch.cat(heads, -1) @ block.attn.c_proj.weight.T + block.attn.c_proj.bias
    n = F.layer_norm(h0 + attn, (8,), block.ln_1.weight, block.ln_1.bias, 1e-5)
    inner = n @ block.mlp.c_fc.weight.T + block.mlp.c_fc.bias
    gelu = 0.5 * inner * (1 + torch.tanh(math.sqrt(2 / math.pi) * (inner + 0.044715 * inner**3)))
    mlp = gelu @ block.mlp.c_proj.weight.T + block.mlp.c_proj.bias
    h1 = F.layer_norm(n + mlp, (8,), block.ln_2.weight, block.ln_2.bias, 1e-5)

    torch.testing.assert_close(model(ids).hidden_states, h1, atol=1e-5, rtol=1e-5)


def test_sinusoidal_positions_follow_vaswani():
    config = GPTConfig.from_preset("tiny", position_encoding="sinusoidal", d_model=8, n_head=2)
    model = GPT(config)
    assert "wpe.weight" not in model.state_dict()
    table = model.sinusoids
    for pos in (0, 1, 17):
        for i in range(4):
            angle = pos / 10000 ** (2 * i / 8)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoidal_model_round_trips_and_transformers_agrees(tmp_path):
    config = GPTConfig.from_preset("tiny", position_encoding="sinusoidal", dropout=0.0)
    model = GPT(config).eval()
    model.save_pretrained(tmp_path)
    reloaded = GPT.from_pretrained(tmp_path)
    assert reloaded.config == config
    reference = transformers.OpenAIGPTLMHeadModel.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 512, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, model(ids).logits)
        torch.testing.assert_close(reference(ids).logits, model(ids).logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "activation,reference",
    [("gelu_tanh", lambda x: F.gelu(x, approximate="tanh")), ("gelu", F.gelu), ("relu", F.relu)],
)
def test_activation_option(activation, reference):
    model = GPT(GPTConfig.from_preset("tiny", activation=activation)).eval()
    mlp = model.h[0].mlp
    x = torch.randn(4, model.config.d_model)
    # The block's MLP, by hand: c_proj(activation(c_fc(x))).
    expected = F.linear(
        reference(F.linear(x, mlp.c_fc.weight, mlp.c_fc.bias)), mlp.c_proj.weight, mlp.c_proj.bias
    )
    with torch.no_grad():
        torch.testing.assert_close(mlp(x), expected)


def test_initialisation_is_normal_002_and_gpt2_scales_residual_projections():
    gpt1 = GPT(GPTConfig(vocab_size=2000, context_length=64, n_layer=4, n_head=4, d_model=128))
    assert gpt1.wte.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert gpt1.h[0].attn.c_attn.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert gpt1.h[0].mlp.c_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert gpt1.h[0].attn.c_attn.bias.abs().max().item() == 0.0
    gpt2 = GPT(
        GPTConfig(
            vocab_size=2000,
            context_length=64,
            n_layer=4,
            n_head=4,
            d_model=128,
            ln_position="pre",
            scale_residual_init=True,
        )
    )
    expected = 0.02 / math.sqrt(2 * 4)
    assert gpt2.h[0].mlp.c_proj.weight.std().item() == pytest.approx(expected, rel=0.05)
    assert gpt2.h[0].attn.c_proj.weight.std().item() == pytest.approx(expected, rel=0.05)
    assert gpt2.ln_f is not None and gpt1.ln_f is None


def test_presets_have_the_published_shapes():
    gpt1 = GPTConfig.from_preset("gpt1")
    assert (gpt1.n_layer, gpt1.d_model, gpt1.n_head, gpt1.context_length, gpt1.vocab_size) == (
        12,
        768,
        12,
        512,
        40478,
    )
    assert gpt1.ln_position == "post"
    expected = {
        "gpt2": (12, 768, 12),
        "gpt2-medium": (24, 1024, 16),
        "gpt2-large": (36, 1280, 20),
        "gpt2-xl": (48, 1600, 25),
    }
    for name, (n_layer, d_model, n_head) in expected.items():
        config = GPTConfig.from_preset(name)
        assert (config.n_layer, config.d_model, config.n_head) == (n_layer, d_model, n_head)
        assert (config.context_length, config.vocab_size, config.ln_position) == (1024, 50257, "pre")
    # GPT-2 small has 124M parameters (Radford et al. 2019 report 117M with a smaller count convention).
    with torch.device("meta"):
        assert GPT(GPTConfig.from_preset("gpt2")).num_parameters() == 124_439_808


def test_dropout_is_active_only_in_training():
    model = GPT(GPTConfig.from_preset("tiny", dropout=0.1))
    ids = torch.randint(0, 512, (2, 16))
    model.train()
    assert not torch.equal(model(ids).logits, model(ids).logits)
    model.eval()
    assert torch.equal(model(ids).logits, model(ids).logits)


def test_left_padding_with_attention_mask_leaves_real_tokens_unchanged():
    model = GPT(GPTConfig.from_preset("tiny", dropout=0.0)).eval()
    ids = torch.randint(0, 512, (1, 6))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        expected = model(ids).logits
        got = model(padded, attention_mask=mask).logits[:, 3:]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_special_tokens_are_appended_rows():
    model = GPT(GPTConfig.from_preset("tiny", dropout=0.0)).eval()
    ids = torch.randint(0, 512, (1, 8))
    before_rows = model.wte.weight.detach().clone()
    with torch.no_grad():
        before = model(ids).logits
    model.add_special_tokens(3)
    assert model.config.n_special == 3 and model.wte.weight.shape == (515, 32)
    torch.testing.assert_close(model.wte.weight[:512], before_rows)
    with torch.no_grad():
        after = model(ids).logits
    torch.testing.assert_close(after[..., :512], before)  # old tokens: same function
    assert model(torch.tensor([[512, 513, 514]])).logits.shape == (1, 3, 515)


def test_errors_name_the_numbers():
    with pytest.raises(ValueError, match=r"d_model \(50\).*n_head \(3\)"):
        GPTConfig(d_model=50, n_head=3)
    model = GPT(GPTConfig.from_preset("tiny"))
    with pytest.raises(ValueError, match="65 tokens.*context of 64"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="token id 512 is out of range.*512 token"):
        model(torch.tensor([[1, 512]]))
    with pytest.raises(ValueError, match="token id -1"):
        model(torch.tensor([[-1, 2]]))
    with pytest.raises(ValueError, match="must be 2-D"):
        model(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="unknown preset"):
        GPTConfig.from_preset("gpt5")


# OpenAI's original GPT-1 release -------------------------------------------------------------------


def write_openai_release(reference, directory, n_files=10):
    """Write a transformers OpenAIGPT model in the layout of openai/finetune-transformer-lm's model/."""
    state = reference.state_dict()
    arrays = [state["transformer.positions_embed.weight"], state["transformer.tokens_embed.weight"]]
    for i in range(reference.config.n_layer):
        prefix = f"transformer.h.{i}."
        for name in [
            "attn.c_attn.weight",
            "attn.c_attn.bias",
            "attn.c_proj.weight",
            "attn.c_proj.bias",
            "ln_1.weight",
            "ln_1.bias",
            "mlp.c_fc.weight",
            "mlp.c_fc.bias",
            "mlp.c_proj.weight",
            "mlp.c_proj.bias",
            "ln_2.weight",
            "ln_2.bias",
        ]:
            tensor = state[prefix + name]
            # The original code kept projection weights as 1x1 convolutions: [1, in, out]; HF's Conv1D
            # weight is [in, out] already.
            arrays.append(tensor[None] if tensor.dim() == 2 else tensor)
    arrays = [a.numpy() for a in arrays]
    (directory / "params_shapes.json").write_text(json.dumps([list(a.shape) for a in arrays]))
    flat = np.concatenate([a.reshape(-1) for a in arrays])
    for i, part in enumerate(np.array_split(flat, n_files)):
        np.save(directory / f"params_{i}.npy", part)
    return [list(a.shape) for a in arrays]


def test_openai_release_loads_and_matches(tmp_path):
    reference = hf_openai_gpt(n_embd=24, n_head=12)
    randomize_layer_norms(reference)
    write_openai_release(reference, tmp_path)
    ours = GPT.from_pretrained(tmp_path)  # detected by params_shapes.json
    ids = torch.randint(0, TINY["vocab_size"], (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, reference(ids).logits, atol=1e-4, rtol=0)


def test_release_layout_matches_the_real_params_shapes(data_dir):
    """Our writer's layout for a GPT-1-shaped model is exactly the real release's params_shapes.json."""
    real = json.loads((data_dir / "gpt1_bpe" / "params_shapes.json").read_text())
    assert len(real) == 2 + 12 * 12
    model_shapes = [[512, 768], [40478, 768]]
    block = [
        [1, 768, 2304],
        [2304],
        [1, 768, 768],
        [768],
        [768],
        [768],
        [1, 768, 3072],
        [3072],
        [1, 3072, 768],
        [768],
        [768],
        [768],
    ]
    assert real == model_shapes + block * 12
    # and a GPT-1 preset model has exactly those tensors
    with torch.device("meta"):
        gpt1 = GPT(GPTConfig.from_preset("gpt1"))
    assert sum(math.prod(s) for s in real) == gpt1.num_parameters()


def test_openai_release_errors(tmp_path):
    (tmp_path / "params_shapes.json").write_text("[[4, 8], [10, 8]]")
    with pytest.raises(FileNotFoundError, match="params_"):
        read_openai_release(tmp_path, n_head=2)
    np.save(tmp_path / "params_0.npy", np.zeros(5, dtype=np.float32))
    with pytest.raises(ValueError, match="hold 5 numbers.*describes 112"):
        read_openai_release(tmp_path, n_head=2)


def test_bad_directories_get_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        GPT.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ValueError, match="model_type 'llama' is not supported"):
        GPT.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "vocab_size": 10,')
    with pytest.raises(ValueError, match="config.json: not valid JSON"):
        GPT.from_pretrained(tmp_path)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
def test_fused_loss_equals_full_logits_loss_and_gradients(bf16):
    """compute_logits=False computes the same loss and gradients without the (B, T, V) logits."""
    model = GPT(GPTConfig.from_preset("tiny", dropout=0.0))
    ids = torch.randint(0, 512, (3, 20))
    labels = ids.clone()
    labels[0, 5] = -100
    grads = []
    for compute_logits in (True, False):  # the plain path, then the fused one
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(ids, labels=labels, compute_logits=compute_logits)
        out.loss.backward()
        grads.append((out.loss.detach(), [p.grad.clone() for p in model.parameters()]))
        model.zero_grad()
        assert (out.logits is None) != compute_logits
    (full_loss, full_grads), (fused_loss, fused_grads) = grads
    torch.testing.assert_close(fused_loss, full_loss, atol=1e-5, rtol=1e-5)
    for a, b in zip(full_grads, fused_grads):
        torch.testing.assert_close(b, a, atol=1e-4 if bf16 else 1e-6, rtol=1e-2 if bf16 else 1e-5)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
def test_fused_loss_in_chunks_equals_cross_entropy(bf16):
    """Chunked (7 positions at a time, the last chunk short): loss and gradients are those of
    F.cross_entropy over the full logits, computed independently."""
    torch.manual_seed(0)
    hidden = torch.randn(2, 12, 16, requires_grad=True)
    weight = (torch.randn(40, 16) * 0.5).requires_grad_()
    labels = torch.randint(0, 40, (2, 12))
    labels[1, 3] = -100
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        fused = fused_next_token_loss(hidden, weight, labels, chunk_positions=7)
    fused.backward()
    fused_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    # bf16: the same rounding of the product's inputs and of its output (the fused path's matmul
    # returns bf16 logits, then works in fp32).
    cast = (lambda t: t.bfloat16().float()) if bf16 else (lambda t: t)
    logits = cast(cast(hidden)[:, :-1] @ cast(weight).t())
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 40), labels[:, 1:].reshape(-1))
    expected.backward()
    torch.testing.assert_close(fused.float(), expected, atol=1e-5, rtol=1e-5)
    tol = dict(atol=1e-3, rtol=2e-2) if bf16 else dict(atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(fused_grads[0], hidden.grad, **tol)
    torch.testing.assert_close(fused_grads[1], weight.grad, **tol)
