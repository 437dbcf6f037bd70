"""The processes torchrun starts for the GPU checks: ``python -m torch.distributed.run ... -m
gptkit.testing.gpu_checks.workers KIND ARGS``.

- ``pretrain DATA OUT DEVICE BATCH STAND_IN [resume]``: :mod:`~.fsdp`'s run, on each process.
- ``offload-peak DEVICE OFFLOAD RESULT``: :mod:`~.memory`'s FSDP2 update; rank 0 writes the peak.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    kind, args = argv[0], argv[1:]
    if kind == "pretrain":
        from gptkit.testing.gpu_checks.fsdp import pretrain, pretrain_config

        data, out, device, batch, stand_in = args[:5]
        config = pretrain_config(
            Path(data),
            Path(out),
            device,
            int(batch),
            resume=args[5:] == ["resume"],
            stand_in=stand_in == "True",
        )
        pretrain(config)
    elif kind == "offload-peak":
        from gptkit.testing.gpu_checks.memory import offload_peak

        offload_peak(args[0], args[1] == "on", Path(args[2]))
    else:
        raise SystemExit(f"unknown worker {kind!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
