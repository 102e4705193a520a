"""Values of block-scaled FP8 tensors in PyTorch, shared by the ops' references: codes times one
scale per block of ``block`` elements along a dim, the scales E8M0 bytes (2^(s - 127), byte 255
the NaN scale) or FP32 values."""
from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
E8M0_NAN = 255


def scale_values(scales: torch.Tensor) -> torch.Tensor:
    """FP32 values of ``scales``: E8M0 bytes (uint8) as 2^(s - 127), NaN for 255; FP32 as given."""
    if scales.dtype != torch.uint8:
        return scales.float()
    factor = torch.pow(2.0, scales.double() - 127).float()
    return torch.where(scales == E8M0_NAN, float("nan"), factor)


def dequantize_blocks(codes: torch.Tensor, scales: torch.Tensor, dim: int,
                      block: int) -> torch.Tensor:
    """FP32 values of FP8 ``codes``: each times the scale of its block of ``block`` along
    ``dim`` (blocks counted from index 0; a last partial block has a scale too). E4M3's NaN codes
    stay NaN in their own place."""
    per_element = scale_values(scales).repeat_interleave(block, dim=dim)
    return codes.float() * per_element.narrow(dim, 0, codes.shape[dim])
