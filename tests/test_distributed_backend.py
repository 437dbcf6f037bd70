"""NCCL's rule, made to apply on a CPU: a process group serves only the device types its backend
string names, and NCCL serves CUDA alone. With ``--fsdp-offload`` the gradient shards live on the
host, and clipping all-reduces their norm there: a group started as plain ``"nccl"`` refuses it
("No backend type associated with device type cpu"). Here two gloo processes start their group
through gptkit's own :func:`init_distributed` as it does for CUDA, with NCCL replaced by gloo
restricted to the ``cuda`` device type, exactly what NCCL offers; then clip the norm of
gradients sharded on the CPU, as FSDP2 leaves them with offload."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gptkit.testing.processes import free_port, torchrun_environment


def as_nccl_would_serve(backend: str | None = None, **kwargs) -> None:
    """``dist.init_process_group`` with NCCL swapped for gloo on the device types NCCL serves:
    ``"nccl"`` alone becomes ``"cuda:gloo"`` (no CPU backend), ``"cuda:nccl,cpu:gloo"`` keeps its
    CPU backend."""
    if backend == "nccl":
        backend = "cuda:gloo"
    backend = backend.replace("cuda:nccl", "cuda:gloo")
    assert "nccl" not in backend, backend
    REAL_INIT(backend, **kwargs)


REAL_INIT = dist.init_process_group


def clip_host_shards(rank: int, world_size: int, port: int, results) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from gptkit.train.distributed import processes as distributed

    torchrun_environment(rank, world_size, port)
    cuda = torch.device("cuda")
    with (
        mock.patch.object(distributed, "resolve_device", return_value=cuda),
        mock.patch.object(torch.cuda, "set_device"),
        mock.patch.object(dist, "init_process_group", as_nccl_would_serve),
    ):
        distributed.init_distributed("cuda", fsdp=True, offload=True)
    try:
        # The full gradient is 0..7 (norm sqrt(140)); each rank holds its half on the host, as
        # FSDP2 shards with CPUOffloadPolicy.
        mesh = init_device_mesh("cpu", (world_size,))
        full = torch.arange(8, dtype=torch.float32).reshape(4, 2)
        param = torch.nn.Parameter(DTensor.from_local(full.chunk(world_size)[rank].clone(), mesh, [Shard(0)]))
        param.grad = DTensor.from_local(full.chunk(world_size)[rank].clone(), mesh, [Shard(0)])
        try:
            norm = torch.nn.utils.clip_grad_norm_([param], max_norm=1.0)
            results[rank] = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        except RuntimeError as e:
            results[rank] = str(e).splitlines()[0]
    finally:
        dist.destroy_process_group()


def test_process_group_backend_names_a_host_backend_beside_nccl_only_under_offload():
    """gloo beside NCCL would need its own TCP connections between every pair of nodes; only
    FSDP2's offloaded shards need a host backend."""
    from gptkit.train.distributed.processes import process_group_backend

    assert process_group_backend("cuda", offload=True) == "cuda:nccl,cpu:gloo"
    assert process_group_backend("cuda") == "nccl"
    assert process_group_backend("cpu") == "gloo"


@pytest.mark.parametrize(
    ("flags", "backend", "minutes"),
    [
        ((), "nccl", 10),
        (("--fsdp", "--fsdp-offload"), "cuda:nccl,cpu:gloo", 10),
        (("--collective-timeout", "45m"), "nccl", 45),
    ],
)
def test_the_process_group_gets_the_collective_timeout_whatever_its_backend(
    monkeypatch, flags, backend, minutes
):
    """torch's default timeout keys on the backend string (NCCL's 10 minutes, a mixed group's 30):
    the group is started with the run's own, 10 minutes unless --collective-timeout says otherwise."""
    import argparse
    from datetime import timedelta

    from gptkit.cli_flags import add_dataclass_arguments, dataclass_from_args
    from gptkit.train.config import TrainConfig, parse_duration
    from gptkit.train.distributed import processes

    started = {}
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(processes, "resolve_device", lambda device: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(
        dist, "init_process_group", lambda backend, **kwargs: started.update(backend=backend, **kwargs)
    )
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, TrainConfig)
    train = dataclass_from_args(TrainConfig, parser.parse_args(list(flags)))
    timeout = parse_duration(train.collective_timeout)
    processes.init_distributed("cuda", train.fsdp, train.fsdp_offload, timeout)
    assert started == {"backend": backend, "timeout": timedelta(minutes=minutes)}


@pytest.mark.slow
def test_clip_grad_norm_on_host_shards_in_the_group_started_for_cuda():
    """A group of NCCL alone refuses it: "No backend type associated with device type cpu"."""
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(clip_host_shards, args=(2, free_port(), results), nprocs=2, join=True)
        got = dict(results)
    expected = float(torch.arange(8, dtype=torch.float32).norm())
    assert got == {0: pytest.approx(expected), 1: pytest.approx(expected)}
