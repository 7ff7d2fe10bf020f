"""The precisions bertbench trains and measures in, and the dtype each one runs the matmuls in (the one list: the
runners' --precision, TrainConfig, the benches' --precisions)."""

import torch

PRECISIONS = ("fp32", "fp16", "bf16")
PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
