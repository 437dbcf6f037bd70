"""What only a CUDA machine can check, run by ``scripts/gpu_checks.py`` (see its help).

- :mod:`~.requirements`: the torch features and packages the checks need, looked at first.
- :mod:`~.common`: settings, the synthetic corpus and the BPE trained on it, torchrun.
- :mod:`~.memory`: `gptkit estimate`'s device peak against ``torch.cuda.max_memory_allocated``.
- :mod:`~.training`: selective checkpointing with dropout, bf16 and fp16 training, host syncs.
- :mod:`~.fsdp`: FSDP2 with offload and meta initialisation, its DCP checkpoint resumed on CPUs.
- :mod:`~.decoding`: decoding and serving throughput, beside transformers'.
- :mod:`~.runner`: each check in a process of its own, under its timeout; :mod:`~.workers`: torchrun's.
"""
