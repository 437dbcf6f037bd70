"""What gptkit's tests, benchmarks and scripts share, importable without the test suite: independent
references and the files and processes they are checked on.

- :mod:`~gptkit.testing.reference_gpt1`: the original GPT-1 encoding, written plainly (the tokenizer's reference).
- :mod:`~gptkit.testing.hub_cache`: a Hugging Face Hub cache written in the Hub's own layout, for offline loading.
- :mod:`~gptkit.testing.processes`: torchrun's environment for a process group, a free port, `gptkit serve` in a subprocess.
- :mod:`~gptkit.testing.serve_schema`: tiny served models, and the server fuzzed from its OpenAPI document.
- :mod:`~gptkit.testing.adapters`: a LoRA adapter run as fine-tuning writes it, made without training.
- :mod:`~gptkit.testing.fuzz` and :mod:`~gptkit.testing.fuzz_targets`: every file gptkit reads, damaged.
- :mod:`~gptkit.testing.gpu_checks`: what only a CUDA machine can check, for ``scripts/gpu_checks.py``.
- :mod:`~gptkit.testing.scripts`: the project's scripts imported as modules.

Some of these need the ``dev`` extra (hypothesis, schemathesis, spaCy); gptkit itself imports none of them.
"""
