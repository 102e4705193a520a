"""Small RMSNorm run for compute-sanitizer (memcheck, racecheck) on the device machine."""
import torch

import graphrt

torch.manual_seed(0)
for rows, hidden in [(3, 8), (37, 136), (5, 9000)]:
    x = torch.randn(rows, hidden, dtype=torch.bfloat16, device="cuda")
    res = torch.randn_like(x)
    w = torch.randn(hidden, device="cuda")
    y, rstd, h = graphrt.ops.rmsnorm_forward(x, w, residual=res)
    dx, dw = graphrt.ops.rmsnorm_backward(torch.randn_like(x), h, w, rstd, g_residual=torch.randn_like(x))
torch.cuda.synchronize()
print("sanitize run done")
