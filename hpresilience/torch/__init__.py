"""Training-side library: tiered torch.distributed.checkpoint storage and the preemption notice.

Needs the optional extra `hpresilience[torch]`; nothing else in the package imports torch.
"""
