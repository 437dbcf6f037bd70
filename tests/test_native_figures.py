"""The decoding benchmark's figures: a peer that crashes becomes skipped rows naming it (the run goes
on); rows carry their spread and say when the two sides are on par; llama.cpp's q8_0 rows on an
AMX CPU load with use_extra_bufts off."""

from __future__ import annotations

import ctypes
import sys
import types
from pathlib import Path

import pytest
import torch

from gptkit import GPT, GPTConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import generate_throughput as bench  # noqa: E402


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(bench, "NEW", 4)
    monkeypatch.setattr(bench, "REPEATS", 2)
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=97, context_length=64, n_layer=1, n_head=2, d_model=16)).eval()


@pytest.mark.parametrize("crash", ["greedy", "load"])
def test_a_crashing_peer_becomes_skipped_rows_and_the_run_goes_on(crash, tiny):
    """A peer that segfaults (as llama.cpp's AMX q8_0 product did, taking the benchmark with it with
    exit -11), measuring or loading: both its rows skipped, naming it and its signal."""
    prompt, long_prompt = torch.randint(0, 97, (1, 5)), torch.randint(0, 97, (1, 20))
    rows = bench.peer_pair(
        "greedy new tok/s, test",
        "time to first token, test",
        "a crashing peer",
        tiny,
        lambda: bench.PeerProcess("crashing-peer", crash=crash),
        prompt,
        long_prompt,
    )
    assert [row["what"] for row in rows] == ["greedy new tok/s, test", "time to first token, test"]
    for row in rows:
        assert row["ratio"] is None and row["peer"] == "a crashing peer"
        assert "crashing-peer crashed (signal 11 (SIGSEGV))" in row["skipped"]


def test_a_peer_process_answers_until_it_is_closed(tiny):
    """The worker's protocol, with a peer that answers: ready, then its greedy ids."""
    peer = bench.PeerProcess("crashing-peer", crash="never")
    try:
        assert peer.call(op="ready") == {"ready": True}
        with pytest.raises(RuntimeError, match="unknown command"):
            peer.call(op="nothing")
    finally:
        peer.close()
    assert peer.process.returncode == 0


def test_rows_carry_their_spread_and_say_when_they_are_on_par():
    apart = bench.spread_comparison("what", "tok/s", [10.0, 11.0, 12.0], "peer", [7.0, 8.0, 9.0])
    assert apart["ratio"] == pytest.approx(11 / 8, abs=1e-3) and not apart["on_par"]
    assert (
        apart["ours_spread"] == [10.0, 12.0] and apart["peer_spread"] == [7.0, 9.0] and apart["rounds"] == 3
    )
    overlapping = bench.spread_comparison("what", "tok/s", [10.0, 11.0, 14.0], "peer", [9.0, 10.5, 12.0])
    assert overlapping["on_par"]
    times = bench.spread_comparison("what", "s", [1.0, 2.0], "peer", [3.0, 4.0], higher_is_better=False)
    assert times["ratio"] == pytest.approx(2.333, abs=1e-3) and not times["on_par"]


def test_the_benchmarks_bandwidth_is_a_streaming_reads():
    """Bytes a step reads ÷ a read's bandwidth, not a copy's (whose writes cost more): fractions of
    it stay at or below 1."""
    assert 1e8 < bench.memory_bandwidth() < 1e13


class FakeParams(ctypes.Structure):
    _fields_ = [("n_gpu_layers", ctypes.c_int32), ("use_extra_bufts", ctypes.c_bool)]


def test_llama_cpp_q8_0_on_an_amx_cpu_loads_without_extra_buffer_types(monkeypatch):
    """On a CPU with AMX the q8_0 rows load llama.cpp with its model parameter use_extra_bufts off
    (its AMX product crashes on gptkit's files, ggml-org/llama.cpp#20824), and say so; other loads,
    and later ones, keep llama.cpp's defaults."""
    binding = types.ModuleType("llama_cpp.llama_cpp")
    binding.llama_model_default_params = lambda: FakeParams(0, True)
    seen = []

    class Llama:
        def __init__(self, **kwargs):
            seen.append(binding.llama_model_default_params().use_extra_bufts)

    package = types.ModuleType("llama_cpp")
    package.Llama, package.llama_cpp = Llama, binding
    monkeypatch.setitem(sys.modules, "llama_cpp", package)
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_cpp", binding)
    bench.llama_cpp_model("model.gguf", extra_bufts=False)
    bench.llama_cpp_model("model.gguf")
    assert seen == [False, True]
    assert binding.llama_model_default_params().use_extra_bufts  # restored
    monkeypatch.setattr(bench, "cpu_flags", lambda: {"avx512f", "amx_tile", "amx_int8"})
    assert bench.has_amx()
    monkeypatch.setattr(bench, "cpu_flags", lambda: {"avx512f", "avx2"})
    assert not bench.has_amx()
