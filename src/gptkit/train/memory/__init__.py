"""Memory: what a run needs per device, estimated on fake tensors (:mod:`.estimate`,
:mod:`.simulation`, with PyTorch's private APIs in :mod:`.torch_internals` and CUDA autocast's
rules in :mod:`.cuda_autocast`), activation checkpointing (:mod:`.activation_checkpointing`) and
the CPU allocator's settings (:mod:`.allocator`)."""
