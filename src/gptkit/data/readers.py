"""The old home of labelled data's readers and the dataset registry, kept for one release: import
:mod:`gptkit.data.registry` (REGISTRY, DATASETS, read_dataset), :mod:`gptkit.data.tables` (your own
files), :mod:`gptkit.data.benchmarks` (the public benchmarks' readers) or :mod:`gptkit.data.examples`.
"""

import warnings

from gptkit.data import benchmarks, examples, formats, registry, tables

warnings.warn(
    "gptkit.data.readers is deprecated: import gptkit.data.registry (REGISTRY, DATASETS, read_dataset), "
    "gptkit.data.tables (read_table, parse_columns) or gptkit.data.benchmarks (each dataset's reader)",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> object:
    """A public name of the modules this one was split into (DataError is formats')."""
    for module in (registry, tables, benchmarks, examples, formats):
        if not name.startswith("_") and hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
