"""Compile every graphrt Triton kernel for sm_90a on this machine (no GPU needed): catches
kernels that the interpreter accepts but the compiler rejects, and reports registers, spills,
shared memory and the global-memory instructions per kernel (are loads 16 bytes wide, are they
async copies?), with ptxas from Triton's package. The variants come from each kernel module's
``compile_cases()``, the modules from the op registry."""
import collections
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

from graphrt.kernel_utils import LAUNCH_OPTIONS
from graphrt.ops.registry import kernel_modules

TARGET = GPUTarget("cuda", 90, 32)
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def _triton_ptxas() -> str | None:
    """The ptxas Triton itself runs for sm_90 (3.9 takes its newer ptxas-blackwell there and
    writes PTX that the legacy one cannot read)."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        return get_ptxas(TARGET.arch).path
    except Exception:
        return None


def check(name, fn, signature, constexprs, num_warps=4, maxnreg=None, gluon=False,
          divisible=()):
    attrs = {(i,): [["tt.divisibility", 16]] for i, (arg, t) in enumerate(signature.items())
             if t.startswith("*") or arg in divisible}
    source = GluonASTSource if gluon else triton.compiler.ASTSource
    src = source(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    try:
        k = triton.compile(src, target=TARGET, options={"num_warps": num_warps, "maxnreg": maxnreg,
                                                        **LAUNCH_OPTIONS})
    except Exception as err:  # report and go on
        print(f"FAIL {name}: {type(err).__name__}: {str(err).splitlines()[0][:200]}")
        return False
    ptx = k.asm["ptx"]
    memory = collections.Counter(re.findall(r"(ld\.global[\w.]*|st\.global[\w.]*|cp\.async\.c[ag]\w*)",
                                            ptx))
    assembled, report = assemble(ptx)
    if assembled is None:   # no ptxas here reads this PTX version: the PTX itself compiled
        print(f"ok   {name}: PTX only ({report}); {k.metadata.shared} B shared; {dict(memory)}")
        return True
    if not assembled:
        print(f"FAIL {name}: ptxas: {report}")
        return False
    regs = re.findall(r"Used (\d+) registers", report)
    spills = re.findall(r"(\d+) bytes spill stores", report)
    print(f"ok   {name}: {regs[0] if regs else '?'} registers, {spills[0] if spills else '?'} B "
          f"spilled, {k.metadata.shared} B shared; {dict(memory)}")
    return True


def assemble(ptx: str):
    """(True, ptxas's report) once a ptxas assembles ``ptx`` for sm_90a; (False, its error) when
    one rejects it for a reason other than its PTX version; (None, why) when every ptxas found
    (Triton's own, then the CUDA toolkit's) is older than the PTX. The .ptx file is removed."""
    candidates = [p for p in (_triton_ptxas(), PTXAS, shutil.which("ptxas"),
                              "/usr/local/cuda/bin/ptxas")
                  if p and os.path.exists(p)]
    too_old = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        for exe in dict.fromkeys(os.path.realpath(p) for p in candidates):
            res = subprocess.run([exe, "-v", "--gpu-name", "sm_90a", path, "-o", os.devnull],
                                 capture_output=True, text=True)
            if res.returncode == 0:
                return True, res.stderr
            if "Unsupported .version" not in res.stderr:
                return False, res.stderr.strip().splitlines()[0] if res.stderr.strip() else f"rc {res.returncode}"
            too_old.append(re.search(r"current version is '([\d.]+)'", res.stderr))
    version = re.search(r"^\.version ([\d.]+)", ptx, re.M)
    have = ", ".join(m.group(1) for m in too_old if m) or "none"
    return None, (f"PTX ISA {version.group(1) if version else '?'}; the ptxas found here read up "
                  f"to {have}")


def main():
    ok = True
    for module in kernel_modules():
        for case in importlib.import_module(module).compile_cases():
            if case.skip:
                print(f"skip {case.name}: {case.skip}")
                continue
            ok &= check(case.name, case.kernel, case.signature, case.constexprs, case.num_warps,
                        case.maxnreg, case.gluon, case.divisible)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
