"""Dense peak FLOP/s of common accelerators, and model FLOPs utilization (MFU) from them.

MFU = achieved model FLOP/s / (peak FLOP/s of one device x devices), where the achieved figure is
tokens/s x FLOPs per token (forward and backward) — PaLM's definition (Chowdhery et al. 2022,
appendix B), the headline figure of torchtitan. The peaks are *dense* tensor-core figures (no
2:4 sparsity), per device, from the vendors' datasheets:

- NVIDIA A100: "NVIDIA A100 Tensor Core GPU" datasheet (2021): BF16/FP16 312, TF32 156,
  FP32 19.5 TF.
- NVIDIA H100 SXM / PCIe / NVL: "NVIDIA H100 Tensor Core GPU" datasheet (2023), the sparse
  figures halved: BF16 989.4 / 756 / 835.5, TF32 494.7 / 378 / 417.5, FP32 67 / 51 / 60 TF.
- NVIDIA H200 SXM / NVL: "NVIDIA H200 Tensor Core GPU" datasheet (2024): BF16 989.4 / 835.5,
  TF32 494.7 / 417.5, FP32 67 / 60 TF.
- NVIDIA L4: "NVIDIA L4 Tensor Core GPU" datasheet: BF16 121, TF32 60, FP32 30.3 TF.
- NVIDIA L40S: "NVIDIA L40S" datasheet: BF16 362.05, TF32 183, FP32 91.6 TF.
- NVIDIA A10 (A10G, AWS's variant, is given the A10's figures): "NVIDIA A10 Tensor Core GPU"
  datasheet: BF16 125, TF32 62.5, FP32 31.2 TF.
- NVIDIA V100 SXM2 / PCIe: "NVIDIA Tesla V100" datasheet: FP16 125 / 112, FP32 15.7 / 14 TF; no
  BF16 and no TF32 (float32 runs at the FP32 rate).
- NVIDIA RTX 4090: "NVIDIA Ada GPU Architecture" whitepaper, appendix A: FP16/BF16 tensor with
  FP32 accumulate 165.2, TF32 82.6, FP32 82.6 TF.
- NVIDIA RTX 3090: "NVIDIA Ampere GA102 GPU Architecture" whitepaper, table 9: FP16/BF16 tensor
  with FP32 accumulate 71, TF32 35.6, FP32 35.6 TF.
- AMD Instinct MI250X / MI250: AMD datasheets: FP16/BF16 383 / 362.1, FP32 matrix 95.7 / 90.5 TF.
- AMD Instinct MI300X: AMD datasheet: BF16/FP16 1307.4, TF32 653.7, FP32 163.4 TF.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

T = 1e12


@dataclass(frozen=True, kw_only=True)
class Peak:
    """One device's dense peak FLOP/s by number format (None: the device has no such units)."""

    name: str
    """How multigpu names the device in messages."""
    bf16: float | None
    """bfloat16 tensor-core FLOP/s."""
    fp16: float
    """float16 tensor-core FLOP/s."""
    tf32: float | None
    """TensorFloat-32 FLOP/s (float32 matmuls when torch allows TF32)."""
    fp32: float
    """float32 FLOP/s (matrix units where the device has them, e.g. AMD's)."""


def _p(name: str, bf16: float | None, tf32: float | None, fp32: float, fp16: float = 0) -> Peak:
    return Peak(name=name, bf16=bf16 * T if bf16 else None, fp16=(fp16 or bf16 or 0) * T,
                tf32=tf32 * T if tf32 else None, fp32=fp32 * T)  # fmt: skip


PEAKS: tuple[tuple[str, Peak], ...] = (
    # (a regular expression searched in torch.cuda.get_device_name(), case-insensitive; the
    # first that matches wins, so the more specific names come first)
    (r"H100.*PCIe", _p("H100 PCIe", 756, 378, 51)),
    (r"H100.*NVL", _p("H100 NVL", 835.5, 417.5, 60)),
    (r"H100", _p("H100 SXM", 989.4, 494.7, 67)),
    (r"H200.*NVL", _p("H200 NVL", 835.5, 417.5, 60)),
    (r"H200", _p("H200 SXM", 989.4, 494.7, 67)),
    (r"A100", _p("A100", 312, 156, 19.5)),
    (r"L40S", _p("L40S", 362.05, 183, 91.6)),
    (r"\bL4\b", _p("L4", 121, 60, 30.3)),
    (r"\bA10G?\b", _p("A10", 125, 62.5, 31.2)),
    (r"V100.*PCI", _p("V100 PCIe", None, None, 14, fp16=112)),
    (r"V100", _p("V100 SXM2", None, None, 15.7, fp16=125)),
    (r"RTX 4090", _p("RTX 4090", 165.2, 82.6, 82.6)),
    (r"RTX 3090", _p("RTX 3090", 71, 35.6, 35.6)),
    (r"MI250X", _p("MI250X", 383, None, 95.7)),
    (r"MI250", _p("MI250", 362.1, None, 90.5)),
    (r"MI300X", _p("MI300X", 1307.4, 653.7, 163.4)),
)
"""Device-name patterns and their peaks (sources in the module doc)."""

FORMATS: Mapping[str, str] = {"bf16-mixed": "bf16", "16-mixed": "fp16", "32": "fp32"}
"""The number format of a precision's matmuls (``"32"``: TF32 where torch allows it)."""


def find_peak(device_name: str) -> Peak | None:
    """The peaks of the device ``torch.cuda.get_device_name`` names, or None when unknown.

    Example:
        >>> find_peak("NVIDIA H100 80GB HBM3").name, find_peak("NVIDIA A100-SXM4-80GB").name
        ('H100 SXM', 'A100')
        >>> find_peak("NVIDIA A10G").name, find_peak("Quadro P400") is None
        ('A10', True)
    """
    for pattern, peak in PEAKS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return peak
    return None


def peak_flops(peak: Peak, precision: str, *, tf32_allowed: bool) -> float:
    """``peak``'s FLOP/s for the matmuls of ``precision`` (``"32"`` with ``tf32_allowed``: TF32).

    A format the device lacks falls back to the one it runs in: bf16 on a V100 is emulated in
    float32 (its FP32 rate), TF32 without tensor cores for it is FP32.
    """
    fmt = FORMATS.get(precision, "fp32")
    if fmt == "fp32" and tf32_allowed and peak.tf32 is not None:
        return peak.tf32
    if fmt == "bf16":
        return peak.bf16 if peak.bf16 is not None else peak.fp32
    if fmt == "fp16":
        return peak.fp16 or peak.fp32
    return peak.fp32


def flops_per_token(
    parameters: int,
    *,
    layers: int | None = None,
    width: int | None = None,
    seq_len: int | None = None,
) -> float:
    """A training step's FLOPs per token: 6 per parameter (forward 2, backward 4), plus the
    attention scores' 12 x layers x width x sequence length when all three are known (PaLM's
    estimate; nanoGPT's ``estimate_mfu``).

    Example:
        >>> flops_per_token(1_000_000)
        6000000.0
        >>> flops_per_token(1_000_000, layers=4, width=128, seq_len=64)
        6393216.0
    """
    attention = 12 * layers * width * seq_len if layers and width and seq_len else 0
    return 6.0 * parameters + attention


def mfu(tokens_per_second: float, per_token: float, peak: float, devices: int) -> float:
    """Model FLOPs utilization: achieved FLOP/s over ``devices`` x ``peak``.

    Example:
        >>> round(mfu(10_000, 6e9, 312e12, 2), 4)  # 10k tokens/s of a 1B model on two A100s
        0.0962
    """
    return tokens_per_second * per_token / (peak * devices)
