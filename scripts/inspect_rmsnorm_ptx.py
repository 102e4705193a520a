"""Compile the RMSNorm kernels for sm_90a here (no GPU needed) and report registers, spills,
shared memory and the global-memory instructions: are loads 16 bytes wide, are they async copies?"""
import collections
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from graphrt.ops.rmsnorm import kernels as K
target = GPUTarget("cuda", 90, 32)
def compile_bwd(H, rows, warps, stages):
    bh = triton.next_power_of_2(H)
    sig = {"G":"*bf16","X":"*bf16","W":"*fp32","RSTD":"*fp32","G_RES":"*bf16","DX":"*bf16","PARTIAL":"*fp32","n_rows":"i32","stride_g":"i32","stride_x":"i32","stride_gres":"i32","stride_dx":"i32",
         "HIDDEN":"constexpr","BLOCK_H":"constexpr","BLOCK_ROWS":"constexpr","HAS_G_RESIDUAL":"constexpr","NUM_STAGES":"constexpr"}
    consts={"HIDDEN":H,"BLOCK_H":bh,"BLOCK_ROWS":rows,"HAS_G_RESIDUAL":False,"NUM_STAGES":stages}
    src = triton.compiler.ASTSource(fn=K._rmsnorm_bwd_rows_kernel, signature=sig, constexprs=consts, attrs={(i,): [["tt.divisibility", 16]] for i in range(7)})
    return triton.compile(src, target=target, options={"num_warps":warps})
def compile_fwd(H, rows, warps, stages):
    bh = triton.next_power_of_2(H)
    sig = {"X":"*bf16","RES":"*bf16","W":"*fp32","Y":"*bf16","RSTD":"*fp32","H_NEW":"*bf16","n_rows":"i32","stride_x":"i32","stride_res":"i32","stride_y":"i32","stride_h":"i32","eps":"fp32",
         "HIDDEN":"constexpr","BLOCK_H":"constexpr","BLOCK_ROWS":"constexpr","HAS_RESIDUAL":"constexpr","NUM_STAGES":"constexpr"}
    consts={"HIDDEN":H,"BLOCK_H":bh,"BLOCK_ROWS":rows,"HAS_RESIDUAL":False,"NUM_STAGES":stages}
    src = triton.compiler.ASTSource(fn=K._rmsnorm_fwd_rows_kernel, signature=sig, constexprs=consts, attrs={(i,): [["tt.divisibility", 16]] for i in range(6)})
    return triton.compile(src, target=target, options={"num_warps":warps})
for name, fn, args in [("bwd", compile_bwd, (5120,1,16,1)), ("bwd", compile_bwd, (5120,1,16,3)), ("fwd", compile_fwd, (4096,1,8,3))]:
    k = fn(*args)
    ttgir = k.asm["ttgir"]
    f = tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False); f.write(k.asm["ptx"]); f.close()
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    r = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", f.name, "-o", "/dev/null"], capture_output=True, text=True)
    print(name, args, re.findall(r"Used \d+ registers|\d+ bytes spill stores", r.stderr), "smem", k.metadata.shared,
          collections.Counter(re.findall(r"(ld\.global[\w.]*|st\.global[\w.]*|cp\.async\.c[ag][\w.]*)", k.asm["ptx"])))
