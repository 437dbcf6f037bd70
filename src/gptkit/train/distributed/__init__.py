"""Many processes through torchrun: the process group and the DDP/FSDP2 wrapping
(:mod:`.processes`), and building a sharded model without ever holding it whole (:mod:`.meta_init`)."""
