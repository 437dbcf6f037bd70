"""Device and precision by the hardware: what is detected, what is chosen, and why."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

from gptkit import hardware


@pytest.fixture
def cpu_flags(monkeypatch):
    """Pretend the CPU has (or lacks) AVX512-BF16 and AMX."""

    def set_flags(avx512_bf16: bool, amx: bool = False, onednn_isa: str | None = None):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
        if onednn_isa is None:
            monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
        else:
            monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", onednn_isa)

    return set_flags


def test_auto_precision_is_bf16_only_where_the_cpu_has_bf16_instructions(cpu_flags):
    cpu = torch.device("cpu")
    cpu_flags(avx512_bf16=False)
    choice = hardware.resolve_precision("auto", cpu, "training")
    assert choice.dtype == torch.float32 and "no AVX512-BF16 or AMX" in choice.reason
    cpu_flags(avx512_bf16=True)
    assert hardware.resolve_precision("auto", cpu, "training") == (
        torch.bfloat16,
        "auto: bf16 autocast, since this CPU has AVX512-BF16",
    )
    cpu_flags(avx512_bf16=False, amx=True)
    assert hardware.resolve_precision("auto", cpu, "training").dtype == torch.bfloat16
    # oneDNN held below its bf16 kernels computes bf16 the slow way, instructions or not.
    cpu_flags(avx512_bf16=True, onednn_isa="AVX2")
    choice = hardware.resolve_precision("auto", cpu, "training")
    assert choice.dtype == torch.float32 and "ONEDNN_MAX_CPU_ISA=AVX2" in choice.reason
    cpu_flags(avx512_bf16=True, onednn_isa="avx512_core_bf16")
    assert hardware.resolve_precision("auto", cpu, "training").dtype == torch.bfloat16


def test_explicit_bf16_without_native_support_runs_with_a_warning(cpu_flags):
    cpu = torch.device("cpu")
    cpu_flags(avx512_bf16=False)
    with pytest.warns(UserWarning, match="slow path, measured 30-65x slower than fp32") as caught:
        assert hardware.resolve_precision("bf16", cpu, "training").dtype == torch.bfloat16
    assert caught[0].filename == __file__  # the warning points at the caller that asked for bf16
    assert hardware.resolve_precision("fp32", cpu, "training").dtype == torch.float32
    expected = "precision must be one of auto, fp32, bf16, fp16, float32, bfloat16, float16, got 'fp8'"
    for use in ("training", "decoding", "scoring"):
        with pytest.raises(ValueError, match=expected):
            hardware.resolve_precision("fp8", cpu, use)
    with pytest.raises(ValueError, match="use must be one of training, decoding, scoring, got 'serving'"):
        hardware.resolve_precision("auto", cpu, "serving")


@pytest.mark.slow
def test_the_reproduced_avx2_cpu_is_detected_in_a_fresh_process():
    """The environment of docs/results.md's AVX2 runs: a new process sees no native bf16."""
    code = (
        "from gptkit.hardware import *; import torch; "
        "print(resolve_precision('auto', torch.device('cpu'), 'training').name)"
    )
    env = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "PATH": ""}
    env.update({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {})  # this gptkit
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "fp32"


def test_inference_precision(cpu_flags, monkeypatch):
    cpu = torch.device("cpu")
    assert hardware.resolve_precision("float32", cpu, "decoding") == (torch.float32, "float32, as asked")
    assert hardware.resolve_precision(None, cpu, "scoring") == hardware.resolve_precision(
        "auto", cpu, "scoring"
    )
    # Scoring whole sequences is matrix-matrix work: bf16 weights only where bf16 is native.
    cpu_flags(avx512_bf16=False)
    assert hardware.resolve_precision("auto", cpu, "scoring") == (
        torch.float32,
        "auto: float32, since this CPU (" + torch.backends.cpu.get_cpu_capability() + ") has no AVX512-BF16 "
        "or AMX instructions",
    )
    cpu_flags(avx512_bf16=True)
    assert hardware.resolve_precision("auto", cpu, "scoring").dtype == torch.bfloat16
    # Decoding is decided by the measurement, whatever it finds.
    monkeypatch.setattr(hardware, "_cpu_decoding_prefers_bf16", lambda: (True, 1.6))
    choice = hardware.resolve_precision("auto", cpu, "decoding")
    assert choice.dtype == torch.bfloat16 and "1.60x" in choice.reason
    monkeypatch.setattr(hardware, "_cpu_decoding_prefers_bf16", lambda: (False, 0.9))
    assert hardware.resolve_precision("auto", cpu, "decoding").dtype == torch.float32
    # An explicit bf16 for inference is a storage format, not a slow path to warn about.
    cpu_flags(avx512_bf16=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hardware.resolve_precision("bf16", cpu, "scoring").dtype == torch.bfloat16


def test_every_spelling_of_a_format_resolves_alike_and_configs_record_the_short_one():
    """One vocabulary: fp32/float32 and bf16/bfloat16 are the same formats for every use, and
    TrainConfig records fp32/bf16 (run_config.json's spelling)."""
    from gptkit.train.config import TrainConfig

    cpu = torch.device("cpu")
    for use in ("training", "decoding", "scoring"):
        for short, long, dtype in (
            ("fp32", "float32", torch.float32),
            ("bf16", "bfloat16", torch.bfloat16),
            ("fp16", "float16", torch.float16),
        ):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # training's warning for bf16 without native support
                assert hardware.resolve_precision(short, cpu, use) == hardware.resolve_precision(
                    long, cpu, use
                )
                assert hardware.resolve_precision(short, cpu, use).dtype == dtype
    assert hardware.resolve_precision("bfloat16", cpu, "scoring").name == "bf16"
    assert TrainConfig(max_steps=1, precision="bfloat16").precision == "bf16"
    assert TrainConfig(max_steps=1, precision="float32").precision == "fp32"
    assert TrainConfig(max_steps=1, precision="float16").precision == "fp16"
    assert hardware.resolve_precision("float16", cpu, "decoding").name == "fp16"
    assert TrainConfig(max_steps=1).precision == "auto"


def test_every_config_takes_the_one_precision_vocabulary():
    """Each command's precision or dtype field is annotated with hardware.Precision, so each
    accepts the same spellings (the CLI's choices come from the annotation)."""
    import typing

    from gptkit.demo import DemoConfig
    from gptkit.evaluate.harness import HarnessConfig
    from gptkit.generation.text import InferenceConfig
    from gptkit.train.config import TrainConfig

    expected = ("auto", "fp32", "bf16", "fp16", "float32", "bfloat16", "float16")
    for config, name in (
        (TrainConfig, "precision"),
        (DemoConfig, "precision"),
        (InferenceConfig, "dtype"),
        (HarnessConfig, "dtype"),
    ):
        assert typing.get_args(typing.get_type_hints(config)[name]) == expected, config.__name__


@pytest.fixture
def fake_gpu(monkeypatch):
    """Pretend cuda:0 is a GPU of the given name, compute capability and bf16 support."""

    def set_gpu(name: str, capability: tuple[int, int], bf16: bool):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16)
        return torch.device("cuda", 0)

    return set_gpu


# (name, compute capability, native bf16) -> what auto trains in, and what it infers in. The
# capabilities are NVIDIA's; fp16 is fast from Volta's tensor cores on, and on the P100 before them.
GPUS = [
    ("NVIDIA H100 80GB HBM3", (9, 0), True, torch.bfloat16, torch.bfloat16),
    ("NVIDIA A100-SXM4-40GB", (8, 0), True, torch.bfloat16, torch.bfloat16),
    ("Tesla T4", (7, 5), False, torch.float16, torch.float16),
    ("Tesla V100-SXM2-16GB", (7, 0), False, torch.float16, torch.float16),
    ("Tesla P100-PCIE-16GB", (6, 0), False, torch.float16, torch.float16),
    ("NVIDIA GeForce GTX 1080", (6, 1), False, torch.float32, torch.float32),
    ("Tesla K80", (3, 7), False, torch.float32, torch.float32),
]


@pytest.mark.parametrize("name, capability, bf16, training, inference", GPUS)
def test_auto_on_a_cuda_gpu_is_bf16_else_fp16_where_fp16_is_fast(
    fake_gpu, name, capability, bf16, training, inference
):
    gpu = fake_gpu(name, capability, bf16)
    choice = hardware.resolve_precision("auto", gpu, "training")
    assert choice.dtype == training and name in choice.reason
    if training == torch.float16:
        assert "dynamic loss scaling" in choice.reason
    for use in ("decoding", "scoring"):
        assert hardware.resolve_precision("auto", gpu, use).dtype == inference
    # Asked for explicitly, fp16 runs on every GPU; a warning where it is slow.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert hardware.resolve_precision("fp16", gpu, "training").dtype == torch.float16
    assert bool(caught) == (inference == torch.float32)
    choice = hardware.resolve_precision("float16", gpu, "decoding")
    assert choice.dtype == torch.float16 and choice.reason.startswith("float16, as asked")


def test_fp16_on_a_cpu_trains_with_a_warning_and_infers_as_a_storage_format(cpu_flags, monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(torch.cpu, "_is_amx_fp16_supported", lambda: False)
    for avx512_bf16, auto in ((True, "bf16"), (False, "fp32")):
        cpu_flags(avx512_bf16=avx512_bf16)
        assert hardware.resolve_precision("auto", cpu, "training").name == auto  # never fp16 on a CPU
        with pytest.warns(UserWarning, match=f"no AMX-FP16 .* 5-100x slower .* auto picks {auto} here"):
            assert hardware.resolve_precision("fp16", cpu, "training").dtype == torch.float16
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # for inference a storage format, whose cost the reason states
        scoring = hardware.resolve_precision("fp16", cpu, "scoring")
        assert scoring.dtype == torch.float16 and "whole sequences take a slow path" in scoring.reason
        assert "slow" not in hardware.resolve_precision("fp16", cpu, "decoding").reason
    monkeypatch.setattr(torch.cpu, "_is_amx_fp16_supported", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert (
            hardware.resolve_precision("fp16", cpu, "training").reason
            == "fp16, as asked (this CPU has AMX-FP16)"
        )
    cpu_flags(avx512_bf16=False)
    assert hardware.resolve_precision("auto", cpu, "training").name == "fp32"  # AMX-FP16 or not


def test_device_auto_and_explicit_devices():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available() and torch.backends.mps.is_available():
        expected = "mps"
    assert hardware.resolve_device("auto").type == expected
    assert hardware.resolve_device(None).type == expected
    assert hardware.resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="PyTorch sees no CUDA GPU; use --device cpu"):
            hardware.resolve_device("cuda")
    with pytest.raises(ValueError, match="device must be auto, cpu, cuda"):
        hardware.resolve_device("tpu")


def test_describe_records_the_cpu():
    info = hardware.describe()
    assert info["cpu"]["aten_capability"] == torch.backends.cpu.get_cpu_capability()
    assert isinstance(info["cpu_bf16_native"], bool)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("onednn", [True, False], ids=["onednn", "no-onednn"])
def test_the_timed_decoding_product_is_x_times_w_transposed(dtype, onednn, monkeypatch):
    """What dtype="auto" times for decoding is the product decoding runs, in each of its forms."""
    if onednn and not hardware.onednn_packing_available():
        pytest.skip("this PyTorch lacks oneDNN's linear ops")
    if onednn and dtype == torch.bfloat16 and not hardware.cpu_bf16_native().native:
        pytest.skip("bf16 is packed only where the CPU multiplies it natively")
    monkeypatch.setattr(hardware, "onednn_packing_available", lambda: onednn)
    torch.manual_seed(0)
    weight, x = torch.randn(48, 32).to(dtype), torch.randn(1, 32).to(dtype)
    expected = (x.float() @ weight.float().t()).to(dtype)
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=5e-2)
    torch.testing.assert_close(hardware._decoding_product(weight)(x), expected, **tolerance)


def test_the_decoding_dtype_is_measured_once_per_process():
    hardware._cpu_decoding_prefers_bf16.cache_clear()
    first = hardware._cpu_decoding_prefers_bf16()
    assert hardware._cpu_decoding_prefers_bf16() is first  # the same answer, not a new measurement
    assert first[1] > 0


def test_measuring_the_matmul_peak_leaves_the_global_random_state_alone():
    """Training measures it as it starts, after a resume restored the RNG: it must draw nothing."""
    hardware.matmul_peak_flops.cache_clear()
    state = torch.get_rng_state()
    assert hardware.matmul_peak_flops(torch.device("cpu"), torch.float32) > 0
    assert torch.equal(torch.get_rng_state(), state)
