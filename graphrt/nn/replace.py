"""replace_norms: swap a model's RMSNorm-like modules for graphrt.nn.RMSNorm in place."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import ContractError
from .rmsnorm import RMSNorm

# a replacement must reproduce the original on probe rows within BF16 rounding (the Hugging Face
# norms round the normalized rows to BF16 before the weight; graphrt rounds once, at the end)
PROBE_TOLERANCE = 2e-2


@dataclass
class NormReplacement:
    """What ``replace_norms`` did: ``replaced`` names the swapped modules, ``skipped`` maps each
    RMSNorm-like module it left alone to the reason."""

    replaced: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.replaced)

    def __repr__(self) -> str:
        return f"NormReplacement(replaced={len(self.replaced)}, skipped={self.skipped})"


def _is_rmsnorm_like(module: torch.nn.Module) -> bool:
    return "rmsnorm" in type(module).__name__.lower() and not isinstance(module, RMSNorm)


def _eps_of(module: torch.nn.Module) -> float | None:
    for attr in ("variance_epsilon", "eps", "epsilon"):
        value = getattr(module, attr, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _why_not(module: torch.nn.Module) -> str | None:
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.nn.Parameter) or weight.dim() != 1:
        return "no 1-D weight parameter"
    if weight.dtype not in (torch.bfloat16, torch.float32):
        return f"weight is {weight.dtype}; graphrt's RMSNorm takes a float32 or bfloat16 weight"
    if weight.device.type == "meta":
        return "weight is on the meta device"
    if _eps_of(module) is None:
        return "no eps (variance_epsilon or eps) attribute"
    if set(dict(module.named_parameters(recurse=True))) != {"weight"}:
        return "parameters other than weight"
    return None


def _probe_mismatch(original: torch.nn.Module, candidate: RMSNorm) -> str | None:
    """Compare both on random BF16 rows, at unit scale and at 1e-3 scale (where eps matters)."""
    weight = original.weight
    gen = torch.Generator(device="cpu").manual_seed(0)
    rows = torch.randn(8, weight.shape[0], generator=gen).to(weight.device, torch.bfloat16)
    with torch.no_grad():
        for scale in (1.0, 1e-3):
            x = rows * scale
            try:
                want = original(x)
            except Exception as err:  # noqa: BLE001 - a module we cannot call is not mapped
                return f"calling it on probe rows failed ({type(err).__name__}: {err})"
            if not isinstance(want, torch.Tensor) or want.shape != x.shape:
                return "its output is not one tensor of the input's shape"
            got = candidate(x)
            err = (got.float() - want.float()).abs().max().item()
            bound = PROBE_TOLERANCE * max(want.float().abs().max().item(), 1e-30)
            if not err <= bound:
                return (f"outputs differ on probe rows (max error {err:.3g} against "
                        f"{bound:.3g}); it is not y = x * rsqrt(mean(x^2) + eps) * weight")
    return None


def replace_norms(model: torch.nn.Module, *, verify: bool = True) -> NormReplacement:
    """Swap every RMSNorm-like submodule of ``model`` (class name containing ``RMSNorm`` with a
    1-D ``weight`` and ``variance_epsilon`` or ``eps``, as in the Hugging Face Llama, Mistral,
    Qwen2/3 families) for :class:`graphrt.nn.RMSNorm`, in place.

    The new module shares the original's weight Parameter (same dtype, device and object, so an
    optimizer built before the swap keeps working). With ``verify`` each candidate is first run
    against the original on random BF16 rows; one that computes something else (Gemma's
    ``x * (1 + weight)``, say) is left alone and listed in ``skipped`` with the reason.

    >>> model = transformers.LlamaForCausalLM(config).cuda().bfloat16()   # doctest: +SKIP
    >>> report = graphrt.nn.replace_norms(model)                         # doctest: +SKIP
    >>> report.replaced[:2], report.skipped                              # doctest: +SKIP
    (['model.layers.0.input_layernorm', 'model.layers.0.post_attention_layernorm'], {})
    """
    if not isinstance(model, torch.nn.Module):
        raise ContractError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    report = NormReplacement()
    done: dict[int, torch.nn.Module] = {}   # a module shared under several names is swapped once
    for name, module in list(model.named_modules(remove_duplicate=False)):
        if not _is_rmsnorm_like(module):
            continue
        if id(module) in done:
            new = done[id(module)]
        else:
            reason = _why_not(module)
            new = None
            if reason is None:
                new = RMSNorm(module.weight.shape[0], _eps_of(module),
                              device=module.weight.device, dtype=module.weight.dtype)
                new.weight = module.weight
                new.train(module.training)
                if verify:
                    reason = _probe_mismatch(module, new)
            if reason is not None:
                report.skipped[name] = reason
                done[id(module)] = None
                continue
            done[id(module)] = new
        if new is None:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        if not parent_name and not child:
            raise ContractError("model: the model itself is an RMSNorm; use graphrt.nn.RMSNorm")
        setattr(parent, child, new)
        report.replaced.append(name)
    return report
