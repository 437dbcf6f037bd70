"""``python -m gptkit.native``: build the native decoding kernels for this machine now (``make setup``
runs it), so that the first generation does not wait for the compiler, and say what was built and
whether gptkit decodes with it. Where it does not (no compiler, no OpenMP, no vector code for this
CPU), it says why in one line and exits 0: decoding then uses PyTorch's layouts."""

import warnings

from gptkit.native import report

if __name__ == "__main__":
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the report says it, once
        found = report()
    if found.get("library"):
        print(
            f"gptkit: native decoding kernels at {found['library']}: isa {found['isa']}, bf16 {found['bf16']}, int8 {found['int8']}, "
            f"OpenMP {found['openmp'] or 'none'}, flags {found['built_with']}, source {found['source']}"
        )
    if found["used"]:
        print(f"gptkit: decoding on a CPU uses them ({found['threads']} threads, torch.get_num_threads())")
    elif not found["enabled"]:
        print("gptkit: GPTKIT_NATIVE=0: decoding uses PyTorch's layouts")
    else:
        print(f"gptkit: decoding uses PyTorch's layouts: the native kernels were {found['unusable']}")
