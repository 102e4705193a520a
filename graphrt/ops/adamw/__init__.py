"""AdamW optimizer step over lists of tensors, one fused pass over each tensor's elements."""
from .spec import adamw_step
from .plan import AdamWStep
from .reference import adamw_step_reference, adamw_update_reference

__all__ = ["AdamWStep", "adamw_step", "adamw_step_reference", "adamw_update_reference"]
