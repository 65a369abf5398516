"""LookWhere's warm-up (`--freeze-extractor-steps N`, `--extractor-warmup-steps W`; not the authors', whose N is 0):
for the first N optimisation steps only the selector trains (its blocks, prefix tokens and map head: every parameter
outside the extractor), then the extractor's learning rate ramps up linearly from 0 over W steps, times the run's
schedule, and follows the schedule after that.

"The extractor" is every parameter of the model's `LookWhereExtractor`: its patch embedding, position table, blocks and
final norm, all copies of the teacher at the start. Its parameters get optimiser groups of their own (marked
"extractor"); during a frozen step those groups are marked "frozen": the optimiser skips them (no weight decay, no
moments, no step count: the weights stay bit-identical) and their gradients are dropped before clipping, so the
clipped and logged gradient norm is the selector's alone. On one process (no DDP or FSDP wrapper, whose gradient
synchronisation expects every parameter's gradient) the extractor's weights also stop requiring gradients then,
which saves their weight-gradient computation; a run on several processes takes the same steps."""

import torch

from .optim import DistillOptimizer


def extractor_lr_scale(step: int, freeze_steps: int, warmup_steps: int) -> float:
    """The extractor's multiplier of the scheduled learning rate at optimisation step `step` (0-based): 0 for the
    first `freeze_steps` steps, then (step - freeze_steps + 1) / warmup_steps up to 1 (1 / W on its first step)."""
    if step < freeze_steps:
        return 0.0
    return min(1.0, (step - freeze_steps + 1) / max(1, warmup_steps))


def extractor_names(model: torch.nn.Module) -> set[str]:
    """The names of the parameters of every LookWhereExtractor inside `model`."""
    from corevision_hf.lookwhere.modeling_lookwhere import LookWhereExtractor

    prefixes = [name + "." for name, module in model.named_modules() if isinstance(module, LookWhereExtractor)]
    return {name for name, _ in model.named_parameters() if any(name.startswith(p) for p in prefixes)}


def split_extractor_groups(optimizer: DistillOptimizer, model: torch.nn.Module) -> DistillOptimizer:
    """The same optimiser (no state yet) with each parameter group split in two: the rest, and the extractor's
    parameters in a group marked "extractor". A ValueError when `model` has no extractor."""
    names = extractor_names(model)
    if not names:
        raise ValueError(f"--freeze-extractor-steps / --extractor-warmup-steps: the {model.config.model_type} student "
                         "has no LookWhere extractor to freeze or ramp; leave them out.")
    groups = []
    for group in optimizer.param_groups:
        for extractor in (False, True):
            kept = [(n, p) for n, p in zip(group["names"], group["params"]) if (n in names) == extractor]
            if kept:
                groups.append({**group, "params": [p for _, p in kept], "names": [n for n, _ in kept],
                               "extractor": extractor, "frozen": False})
    return DistillOptimizer(groups, optimizer.defaults["lr"])


class ExtractorWarmup:
    """Sets the extractor's groups of a (prepared) optimiser for each step: `apply(optimizer, step, lr)` before the
    step, `drop_frozen_gradients(optimizer)` after its last backward. `single_process`: toggle requires_grad too."""

    def __init__(self, freeze_steps: int, warmup_steps: int, single_process: bool):
        self.freeze_steps, self.warmup_steps, self.single_process = freeze_steps, warmup_steps, single_process

    @classmethod
    def from_args(cls, args, single_process: bool) -> "ExtractorWarmup | None":
        """From run_args.freeze_extractor_steps (default 0: none) and extractor_warmup_steps (default: warmup_steps);
        None when nothing is frozen and no ramp was asked for (a ramp alone starts at step 0)."""
        freeze = getattr(args, "freeze_extractor_steps", 0) or 0
        warmup = getattr(args, "extractor_warmup_steps", None)
        if freeze < 0 or (warmup is not None and warmup < 0):
            raise ValueError(f"--freeze-extractor-steps {freeze} and --extractor-warmup-steps {warmup} must be >= 0.")
        if freeze == 0 and not warmup:
            return None
        return cls(freeze, args.warmup_steps if warmup is None else warmup, single_process)

    def apply(self, optimizer, step: int, lr: float) -> None:
        """Every group's learning rate at `step` (the extractor's scaled), and which groups are frozen."""
        scale = extractor_lr_scale(step, self.freeze_steps, self.warmup_steps)
        frozen = step < self.freeze_steps
        for group in optimizer.param_groups:
            group["lr"] = lr * scale if group["extractor"] else lr
            group["frozen"] = group["extractor"] and frozen
            if self.single_process and group["extractor"]:
                for param in group["params"]:
                    param.requires_grad_(not frozen)

    @staticmethod
    def drop_frozen_gradients(optimizer) -> None:
        for group in optimizer.param_groups:
            if group["frozen"]:
                for param in group["params"]:
                    param.grad = None
