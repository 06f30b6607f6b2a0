"""A worker's process under the strategies: process group (``dist``), device, precision,
model wrappers, seeding, and the one tap on ``torch.distributed``'s calls (``collective_taps``:
the hang explainer and the collective-wait clock listen to it). Nothing is imported here: each
module is imported where it is used.
"""
