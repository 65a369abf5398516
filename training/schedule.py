"""Learning-rate schedule and the per-step draws (core budget, k, resolution) that every process must agree on."""

import math

import torch


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_ratio: float, start_ratio: float = 0.0) -> float:
    """Multiplier of the peak learning rate at optimisation step `step` (0 = the first update): linear warm-up from
    start_ratio at step 0 to 1 at `warmup_steps`, then cosine down to min_ratio at `total_steps`, as both methods'
    authors schedule it (VECA: LambdaLR from lr_min; LookWhere: optax's warmup_cosine_decay_schedule). A function of the
    step alone, so the same for any number of processes and any gradient accumulation."""
    if step < warmup_steps:
        return start_ratio + (1 - start_ratio) * step / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def draw(choices: list, weights: list, seed: int, step: int):
    """One of `choices` drawn with `weights`, a function of (seed, step) alone: identical on every process of a
    distributed run without any communication, and again after a resume."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    index = torch.multinomial(torch.tensor(weights, dtype=torch.float), 1, generator=generator).item()
    return choices[index]


def draw_int(low: int, high: int, seed: int, step: int) -> int:
    """A uniform integer in [low, high], a function of (seed, step) alone."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step + 7)
    return int(torch.randint(low, high + 1, (1,), generator=generator).item())


def draw_uniform(low: float, high: float, seed: int, step: int) -> float:
    """A uniform float in [low, high], a function of (seed, step) alone."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step + 11)
    return low + (high - low) * torch.rand(1, generator=generator, dtype=torch.float64).item()


def reseed_for_step(seed: int, step: int, process_index: int, micro_batch: int = 0) -> None:
    """Seeds torch's global RNG from (seed, step, process, micro-batch) before each micro-batch, so that the model's
    own randomness (coordinate augmentation, dropout) does not depend on what else drew from it (DataLoader iterators
    do): a resumed run then repeats an uninterrupted one exactly."""
    torch.manual_seed((((seed * 1_000_003 + step) * 4096 + process_index) * 256 + micro_batch) % 2**63)
