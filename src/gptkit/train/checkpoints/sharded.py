"""Sharded checkpoints under FSDP2, through ``torch.distributed.checkpoint`` (DCP).

Each process writes the shards it holds (``__RANK_N.distcp``), and rank 0 the index of where
every piece of every tensor lies (``.metadata``); reading, each process takes the pieces of its
own shards, whatever number of processes wrote them (DCP reshards on load), so a run saved by 2
processes resumes on 1 or on 3. Nothing is gathered: no process ever holds the whole model and
optimizer, as torchtitan saves. :mod:`gptkit.train.checkpoints.checkpointer` puts these files in a
``step-NNNNNNN`` folder beside ``train_state.pt`` and the manifest, as for a whole checkpoint;
:mod:`gptkit.train.checkpoints.export` turns one into the single-file model other commands read.
"""

from __future__ import annotations

import functools
import io
import pickle
from pathlib import Path

import torch
import torch.nn as nn

from gptkit.io import file_sha256
from gptkit.train.distributed.processes import DistributedContext, unwrap

SHARDED_FORMAT = "dcp"  # train_state.pt's "format" for a checkpoint whose model and moments are shards
DCP_METADATA = ".metadata"  # DCP's index of the shards, written by rank 0
MODEL_KEY, OPTIMIZER_KEY = "model", "optimizer"  # the two parts of the state DCP writes


def is_sharded_model(model: nn.Module) -> bool:
    """Whether ``model`` is sharded by FSDP2 (``fully_shard`` makes it an ``FSDPModule``)."""
    return hasattr(unwrap(model), "set_requires_gradient_sync")


def save_shards(
    directory: Path, model: nn.Module, optimizers: list[torch.optim.Optimizer], ctx: DistributedContext
) -> dict[str, dict]:
    """Write this process's shards of the model and the optimizers' moments into ``directory``
    (every process calls it, the directory existing); return every process's files with their
    size and sha256 (each process hashes what it wrote, so the hashing is shared too)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(unwrap(model), optimizers)
    writer = dcp.FileSystemWriter(directory, single_file_per_rank=True, sync_files=True)
    dcp.save({MODEL_KEY: model_state, OPTIMIZER_KEY: optim_state}, storage_writer=writer)
    try:
        mine: dict | str = {
            path.name: {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
            for path in sorted(directory.glob(f"__{ctx.rank}_*.distcp"))
        }
    except OSError as e:  # told to the others in the gather they wait in, not left out of it
        mine = f"{e.strerror or e} ({e.filename})"
    gathered = ctx.all_gather_object(mine)
    failed = next(((rank, m) for rank, m in enumerate(gathered) if isinstance(m, str)), None)
    if failed is not None:
        raise OSError(f"could not hash the shards of rank {failed[0]}: {failed[1]}")
    entries: dict[str, dict] = {}
    for files in gathered:
        entries.update(files)
    return entries


def load_shards(directory: Path, model: nn.Module, optimizers: list[torch.optim.Optimizer]) -> None:
    """Read ``directory``'s shards into ``model`` and ``optimizers`` as they are laid out now:
    sharded by FSDP2 over any number of processes, or whole in one process."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    module = unwrap(model)
    model_state, optim_state = get_state_dict(module, optimizers)  # the layout to read into
    state = {MODEL_KEY: model_state, OPTIMIZER_KEY: optim_state}
    load_state(state, directory)
    set_state_dict(
        module, optimizers, model_state_dict=state[MODEL_KEY], optim_state_dict=state[OPTIMIZER_KEY]
    )


def load_state(state: dict, directory: Path) -> None:
    """Fill ``state`` (DCP's nested layout) from ``directory``'s shards: the index and the plain
    values unpickled safely; a shard that cannot be read is one error naming the folder."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.load(state, storage_reader=CheckedReader(directory), planner=weights_only_planner())
    except CheckpointException as e:  # each process's failure, with its traceback in the message
        cause = next(iter(e.failures.values()), e)  # (the exception, its frames) for each process
        cause = cause[0] if isinstance(cause, tuple) else cause
        first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        raise ValueError(f"{directory}: a shard could not be read ({type(cause).__name__}: {first})") from e


def read_model_state(directory: Path) -> dict[str, torch.Tensor]:
    """The whole model of a sharded checkpoint, in this one process, on the CPU: the model's
    tensors only (not the optimizer's moments, twice the model's size), keyed by parameter name."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = CheckedReader(directory)
    prefix = f"{MODEL_KEY}."
    state = {
        key.removeprefix(prefix): torch.empty(entry.size, dtype=entry.properties.dtype)
        for key, entry in reader.read_metadata().state_dict_metadata.items()
        if key.startswith(prefix) and isinstance(entry, TensorStorageMetadata)
    }
    if not state:
        raise ValueError(f"{directory / DCP_METADATA}: no model tensors in this sharded checkpoint")
    dcp.load({MODEL_KEY: state}, storage_reader=CheckedReader(directory), no_dist=True)
    return state


# DCP's index is a pickle. It is read through an unpickler that builds DCP's own metadata records
# and nothing else, so a damaged or hostile file cannot run code. Names are matched whole: pickle
# resolves a dotted name attribute by attribute, so a module's prefix would let through whatever
# that module imported (``os.system`` from any module that imports os). The shards' tensors are
# read by DCP; their other values (the optimizer's settings) by :class:`_WeightsOnlyPlanner`.
_DCP_METADATA = "torch.distributed.checkpoint.metadata"
_ALLOWED = {
    (_DCP_METADATA, "Metadata"),
    (_DCP_METADATA, "MetadataIndex"),
    (_DCP_METADATA, "StorageMeta"),
    (_DCP_METADATA, "TensorProperties"),
    (_DCP_METADATA, "TensorStorageMetadata"),
    (_DCP_METADATA, "BytesStorageMetadata"),
    (_DCP_METADATA, "ChunkStorageMetadata"),
    (_DCP_METADATA, "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout by its name, as torch.load(weights_only) allows
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),  # where the checkpoint was written (DCP's storage_meta)
    ("pathlib", "WindowsPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _read_checked_metadata(path: Path):
    try:
        return _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
    except FileNotFoundError:
        raise
    except Exception as e:  # a damaged file fails in many ways: each is one line naming it
        raise ValueError(
            f"{path}: not the index of a sharded checkpoint ({type(e).__name__}: {e}); "
            "the checkpoint is damaged: resume from an earlier one"
        ) from e


@functools.cache
def _checked_reader_class():
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class _CheckedReader(FileSystemReader):
        """DCP's file reader, its index read by :class:`_MetadataUnpickler` instead of pickle.load."""

        def read_metadata(self, *args, **kwargs):
            metadata = _read_checked_metadata(Path(self.path) / DCP_METADATA)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id  # as FileSystemReader does
            return metadata

    return _CheckedReader


@functools.cache
def _weights_only_planner_class():
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    try:  # private: where DCP's own planner puts a value back in the nested state
        from torch.distributed.checkpoint._traverse import set_element
    except ImportError:
        raise ImportError(
            f"sharded checkpoints need torch.distributed.checkpoint._traverse.set_element, which torch "
            f"{torch.__version__} does not have: install the torch version gptkit's pyproject.toml names"
        ) from None

    class _WeightsOnlyPlanner(DefaultLoadPlanner):
        """DCP's load planner, reading the shards' non-tensor values (the optimizer's learning rate,
        betas, ...) with ``torch.load(weights_only=True)``: DCP's own unpickles them whole."""

        def load_bytes(self, read_item, value) -> None:
            loaded = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return _WeightsOnlyPlanner


def weights_only_planner():
    """A load planner that unpickles nothing but plain values and tensors."""
    return _weights_only_planner_class()()


def CheckedReader(directory: Path):  # noqa: N802 (a class, made on first use: DCP is a heavy import)
    """A reader of ``directory``'s shards that unpickles nothing but DCP's own index records."""
    return _checked_reader_class()(directory)
