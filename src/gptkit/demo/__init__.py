"""`make demo`: the paper's whole recipe, small enough for a laptop CPU, and its one claim shown.

1. Train a GPT-1-style BPE vocabulary (ftfy + spaCy + ``</w>``) on public-domain books and the
   unlabelled text of the two tasks' training splits (no labels; nothing of the reported splits).
2. Prepare token shards and pre-train a small GPT (L1) for its share of the time left: the first
   updates are timed and the schedule is planned for as many as fit. Precision follows the
   hardware: bf16 autocast where it is native, fp32 elsewhere (bf16 on an AVX2-only CPU would take
   hours). The blocks are GPT-2's pre-LN layout: in a few hundred updates GPT-1's post-LN blocks
   barely leave the unigram plateau. The recipe is :data:`gptkit.train.recipes.RECIPES`' ``minutes``.
3. Fine-tune on SST-2 (classification) and Story Cloze (multiple choice), from the pre-trained
   weights and from random weights of the same shape, seed by seed, the two sides of a seed paired
   in everything but the transformer's weights (:mod:`gptkit.demo.compare`). The runs are planned
   for statistical power (:mod:`gptkit.demo.plan`): several small runs rather than two long ones,
   at the size whose seeds, as many as the time holds, make the threshold easiest to clear. Each
   task's difference comes with the suite's seed-aware standard error and the threshold its
   number of seeds sets (:func:`gptkit.data.metrics.seed_paired_difference`).
4. Sample a few lines from the pre-trained model at the setting the creativity sweep recommends,
   the sweep running until the budget's last seconds.

The whole demo keeps to one wall-clock budget (``--time-budget``, counted from ``--budget-start``:
``make demo`` passes the time it started, so its set-up counts). The vocabulary and the shards take
what they take; pre-training and fine-tuning then share what is left, each stage sized from the
time left when it starts, so a slower CPU pays in updates and seeds, never in time.

With ``--init NAME`` (``gptkit demo --init openai-gpt``) steps 1 and 2 are OpenAI's own: the published
weights and their vocabulary are the paper's pre-training, done. Step 3 fine-tunes them beside the
same shape from random weights with the paper's fine-tuning settings (lr 6.25e-5, λ = 0.5, warm-up
0.2%, linear decay, dropout 0.1) at batch 8, for what the budget holds; step 4 samples from them.
"""

from gptkit.demo.compare import SIDES, Sides, compare_sides, compare_task
from gptkit.demo.plan import Deadline, RunSize, choose_size, expected_margin, plan_time
from gptkit.demo.report import difference_sentence, headline, verdict
from gptkit.demo.run import DemoConfig, run_demo
from gptkit.demo.tasks import DEMO_TASKS, constant_answer, demo_corpus, majority_share

__all__ = [
    "DEMO_TASKS",
    "SIDES",
    "Deadline",
    "DemoConfig",
    "RunSize",
    "Sides",
    "choose_size",
    "compare_sides",
    "compare_task",
    "constant_answer",
    "demo_corpus",
    "difference_sentence",
    "expected_margin",
    "headline",
    "majority_share",
    "plan_time",
    "run_demo",
    "verdict",
]
