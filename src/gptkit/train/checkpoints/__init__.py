"""Checkpoints that resume exactly: writing and reading them (:mod:`.checkpointer`), FSDP2's sharded
form (:mod:`.sharded`) and exporting a checkpoint's model (:mod:`.export`)."""
