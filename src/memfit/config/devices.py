"""The GPUs ``memfit plan --device NAME`` plans for without one here: vendor figures per
GPU (dense, no sparsity), from which plan/devices.py builds their builtin profiles.
Facts only, no torch: the command line lists the names from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Datasheet:
    """Vendor figures of one GPU (dense, no sparsity) and its links."""

    label: str
    memory_gib: float
    bf16_tflops: float | None  # tensor cores, FP32 accumulate; None: no bf16 tensor cores
    fp16_tflops: float
    fp32_tflops: float  # CUDA cores: torch's default fp32 matmul precision uses no TF32
    bandwidth_gbs: float
    host_link_gbs: float  # PCIe, one direction
    interconnect_gbs: float  # NVLink per GPU, or PCIe where a GPU has none
    source: str


DATASHEETS = {
    "h100": Datasheet("NVIDIA H100 SXM 80 GB", 80, 989, 989, 67, 3350, 64, 900,
                      "H100 Tensor Core GPU datasheet (SXM5)"),
    "a100-80gb": Datasheet("NVIDIA A100 SXM 80 GB", 80, 312, 312, 19.5, 2039, 32, 600,
                           "A100 Tensor Core GPU datasheet (SXM4 80 GB)"),
    "a100-40gb": Datasheet("NVIDIA A100 SXM 40 GB", 40, 312, 312, 19.5, 1555, 32, 600,
                           "A100 Tensor Core GPU datasheet (SXM4 40 GB)"),
    "l4": Datasheet("NVIDIA L4 24 GB", 24, 121, 121, 30.3, 300, 32, 32,
                    "L4 Tensor Core GPU datasheet"),
    "a10g": Datasheet("NVIDIA A10G 24 GB (AWS G5)", 24, 70, 70, 31.2, 600, 32, 32,
                      "AWS G5 instance figures (A10G: 70 TFLOPS FP16/BF16 tensor); A10 "
                      "datasheet bandwidth"),
    "rtx-4090": Datasheet("NVIDIA GeForce RTX 4090 24 GB", 24, 165.2, 165.2, 82.6, 1008, 32,
                          32, "Ada Lovelace architecture whitepaper (FP32 accumulate)"),
    "rtx-3090": Datasheet("NVIDIA GeForce RTX 3090 24 GB", 24, 71, 71, 35.6, 936, 32, 32,
                          "Ampere GA102 whitepaper (FP32 accumulate)"),
    "t4": Datasheet("NVIDIA T4 16 GB", 16, None, 65, 8.1, 320, 16, 16,
                    "T4 Tensor Core GPU datasheet (Turing: no bf16 tensor cores)"),
}
