"""``python -m gptkit.native``: build the native decoding kernels for this machine now (``make setup``
runs it), so that the first generation does not wait for the compiler. Where they cannot be built,
it says so in one line and exits 0: decoding then uses PyTorch's kernels."""

import subprocess

from gptkit.native import build

if __name__ == "__main__":
    try:
        print(f"gptkit: native decoding kernels at {build()}")
    except (RuntimeError, OSError, subprocess.SubprocessError) as error:
        print(
            f"gptkit: the native decoding kernels could not be built ({error}); decoding uses PyTorch's kernels"
        )
