"""Model FLOPs from the config, and the peak they are compared against (MFU).

MFU counts the model's FLOPs, not the hardware's: a recompute model does its forward twice but is credited once, as
in the PaLM paper's definition, so recompute shows up as lower MFU, which is the trade it makes. Only matmuls are
counted (embeddings, softmax, LayerNorm and GELU are a few percent); training is 3x the forward (the backward
computes gradients of both the inputs and the weights).
"""

from __future__ import annotations

import torch

from bertbench.model.config import BertConfig

# Dense (no 2:4 sparsity) peak TFLOP/s of the data-center GPUs BERT is trained on, from the vendors' data sheets.
# fp32 is the plain CUDA-core figure: PyTorch does not use TF32 for fp32 matmuls unless told to.
# Longest name first: "H100 PCIe" before "H100", "A100" before "A10", "L40S" before "L4".
GPU_PEAK_TFLOPS = {
    "H100 PCIe": {"fp32": 51.2, "bf16": 756.0, "fp16": 756.0},
    "H100": {"fp32": 66.9, "bf16": 989.4, "fp16": 989.4},  # SXM and NVL
    "H200": {"fp32": 66.9, "bf16": 989.4, "fp16": 989.4},
    "GH200": {"fp32": 66.9, "bf16": 989.4, "fp16": 989.4},
    "B200": {"fp32": 80.0, "bf16": 2250.0, "fp16": 2250.0},
    "A100": {"fp32": 19.5, "bf16": 312.0, "fp16": 312.0},
    "L40S": {"fp32": 91.6, "bf16": 362.1, "fp16": 362.1},
    "A10": {"fp32": 31.2, "bf16": 125.0, "fp16": 125.0},
    "L4": {"fp32": 30.3, "bf16": 121.0, "fp16": 121.0},
    "V100": {"fp32": 15.7, "bf16": None, "fp16": 125.0},
}


def gpu_peak_flops(device_name: str, precision: str) -> float | None:
    """Peak FLOP/s of a GPU by the name torch reports ("NVIDIA H100 80GB HBM3"), None when not in the table."""
    for key in sorted(GPU_PEAK_TFLOPS, key=len, reverse=True):
        if key in device_name:
            peak = GPU_PEAK_TFLOPS[key][precision]
            return None if peak is None else peak * 1e12
    return None


def attention_forward_flops(config: BertConfig, seq: int) -> int:
    """Matmul FLOPs of one sequence's attention scores (Q K^T) and mix (P V) in all layers: the part that grows
    with the square of the length."""
    return config.num_hidden_layers * 2 * 2 * seq * seq * config.hidden_size


def encoder_forward_flops(config: BertConfig, seq: int) -> int:
    """Matmul FLOPs of one sequence through the encoder: projections, attention scores and mix, feed-forward."""
    h, ffn = config.hidden_size, config.intermediate_size
    dense = config.num_hidden_layers * 2 * seq * (4 * h * h + 2 * h * ffn)
    return dense + attention_forward_flops(config, seq)


def forward_flops(config: BertConfig, kind: str, seq: int, masked_positions: int = 0) -> int:
    """Matmul FLOPs of one sequence's forward, heads included. pretraining: pooler + NSP, and the MLM transform and
    vocab projection on `masked_positions` positions only; finetuning: pooler and a 2-way classifier."""
    h = config.hidden_size
    pooler = 2 * h * h
    if kind == "pretraining":
        heads = pooler + 2 * h * 2 + 2 * masked_positions * (h * h + h * config.vocab_size)
    else:
        heads = pooler + 2 * h * 2
    return encoder_forward_flops(config, seq) + heads


def train_flops(config: BertConfig, kind: str, seq: int, masked_positions: int = 0) -> int:
    """Model FLOPs of one sequence's training step: forward + backward = 3 x forward."""
    return 3 * forward_flops(config, kind, seq, masked_positions)


def peak_flops(device: torch.device, precision: str, measured_matmul: float | None = None) -> tuple[float, str]:
    """(peak FLOP/s, where it comes from): a GPU's data-sheet figure, else the measured matmul FLOP/s."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = gpu_peak_flops(name, precision)
        if peak is not None:
            return peak, f"{name} data sheet, {precision} dense"
    if measured_matmul is None:
        raise ValueError("no data-sheet peak for this device: pass the measured matmul FLOP/s")
    return measured_matmul, f"measured {precision} matmul on {device.type}"
