"""The precisions bertbench trains and measures in, and the dtype each one runs the matmuls in (the one list: the
runners' --precision, TrainConfig, the benches' --precisions). No torch at import: `bertbench report` reads these
names and never runs a model."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PRECISIONS = ("fp32", "fp16", "bf16")


@functools.cache  # asked on every training step (autocast's dtype)
def precision_dtype(precision: str) -> torch.dtype:
    """The dtype `precision`'s matmuls run in."""
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
