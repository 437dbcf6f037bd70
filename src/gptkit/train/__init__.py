"""Training, in rooms: the loop and its runs here, the rest by what it is about.

- here: the settings (:mod:`.config`), the one training loop (:mod:`.loop`) with its optimizers
  (:mod:`.optim`), number formats (:mod:`.precision`), time budget (:mod:`.budget`), metrics log
  (:mod:`.metrics_log`) and run directory (:mod:`.rundir`); the run setup both stages share
  (:mod:`.run`), pre-training (:mod:`.pretrain`) and its named recipes (:mod:`.recipes`);
- :mod:`.finetune`: fine-tuning on a task, discriminative or generative;
- :mod:`.distributed`: many processes through torchrun (DDP, FSDP2, meta initialisation);
- :mod:`.checkpoints`: checkpoints that resume exactly, whole or sharded, and their export;
- :mod:`.memory`: what a run needs per device, activation checkpointing, the CPU allocator.
"""
