"""Facts about accelerators that several decisions share, each defined once with its reason."""

from __future__ import annotations

import re

from flightdeck.inventory import GpuInfo

# bf16 kernels and FlashAttention-2 need Ampere (compute capability 8.0) or newer (X001, X004); the
# claim also uses it to keep such jobs off older GPUs.
AMPERE_CAPABILITY = 8.0
# Consumer cards (GeForce, TITAN, RTX 20xx-50xx) have peer-to-peer disabled in the driver: NCCL's P2P
# transport hangs on them unless it is turned off (E005).
CONSUMER_GPU = re.compile(r"GeForce|TITAN|RTX\s?[2-5]0\d0", re.IGNORECASE)


def is_consumer(gpu: GpuInfo) -> bool:
    return bool(CONSUMER_GPU.search(gpu.name))
