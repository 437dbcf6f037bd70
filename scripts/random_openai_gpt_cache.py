"""A Hugging Face cache holding ``openai-community/openai-gpt`` with random weights, for timing.

``gptkit demo --init openai-gpt`` runs as long on random weights of GPT-1's exact shape as on the
published ones (the time does not depend on the weights' values), so its time can be measured where
the Hub cannot be reached. This writes transformers' ``OpenAIGPTLMHeadModel`` at GPT-1's shape (12
blocks, 768 wide, 12 heads, 512 positions, 40,478 tokens), with random weights, and GPT-1's real
vocabulary under the Hub's file names, into ``HF_HOME/hub`` in the Hub's cache layout::

    python scripts/random_openai_gpt_cache.py /tmp/hf_home --data ../shared/data
    HF_HOME=/tmp/hf_home HF_HUB_OFFLINE=1 make demo INIT=openai-gpt

Accuracy from such a cache means nothing: the published weights are what the demo is for.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from gptkit.testing.hub_cache import publish


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("hf_home", type=Path, help="The HF_HOME to write (its hub/ folder).")
    parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="Holds gpt1_bpe/.")
    args = parser.parse_args()
    import torch
    import transformers

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        transformers.OpenAIGPTLMHeadModel(transformers.OpenAIGPTConfig()).save_pretrained(folder)
        shutil.copyfile(args.data / "gpt1_bpe" / "encoder_bpe_40000.json", folder / "vocab.json")
        shutil.copyfile(args.data / "gpt1_bpe" / "vocab_40000.bpe", folder / "merges.txt")
        commit = publish(args.hf_home, "openai-community/openai-gpt", folder)
    print(f"{args.hf_home}/hub: openai-community/openai-gpt at {commit} (random weights of GPT-1's shape)")


if __name__ == "__main__":
    main()
