"""The old home of labelled data's readers and the dataset registry, kept for one release: import
:mod:`gptkit.data.registry` (REGISTRY, DATASETS, read_dataset), :mod:`gptkit.data.tables` (your own
files), :mod:`gptkit.data.benchmarks` (the public benchmarks' readers) or :mod:`gptkit.data.examples`.
"""

import warnings

from gptkit.data.benchmarks import (  # noqa: F401
    BINARY_ENTAILMENT_LABELS,
    NLI_LABELS,
    NO_GOLD_LABEL,
    QQP_LABELS,
    RACE_LEVELS,
    SCITAIL_LABELS,
    read_cola,
    read_mctest,
    read_mrpc,
    read_nli,
    read_qnli,
    read_qqp,
    read_race,
    read_rte,
    read_scitail,
    read_sst2,
    read_story_cloze,
    read_stsb,
)
from gptkit.data.examples import OPTIONAL_FIELDS, TASKS, TEXT_FIELDS, Example, Task  # noqa: F401
from gptkit.data.formats import DataError  # noqa: F401
from gptkit.data.registry import (  # noqa: F401
    DATASETS,
    REGISTRY,
    STORY_CLOZE_DEV,
    STORY_CLOZE_SEED,
    Archive,
    Dataset,
    Source,
    read_dataset,
)
from gptkit.data.tables import parse_columns, read_table  # noqa: F401

warnings.warn(
    "gptkit.data.readers is deprecated: import gptkit.data.registry (REGISTRY, DATASETS, read_dataset), "
    "gptkit.data.tables (read_table, parse_columns) or gptkit.data.benchmarks (each dataset's reader)",
    DeprecationWarning,
    stacklevel=2,
)
