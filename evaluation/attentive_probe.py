"""The attentive probe: today's standard frozen-feature reader of a token set (V-JEPA's and DINOv2's dense protocols
read tokens, not one pooled vector). A few learned queries cross-attend to the frozen tokens and a linear head reads
what they pooled.

One query's key projection is folded into a learned key vector (q . W_k t = (W_k^T q) . t) and the value projection
into the linear head, so the probe is `heads` key vectors of width D and one (heads * D, classes) linear head: the
same function class as multi-head attention pooling followed by a linear classifier, at a cost linear in the tokens.
The keys start at zero, so every query starts as the mean of the tokens: the probe starts where a linear probe on
the mean token stands and learns where to look.
"""

import math

import torch
import torch.nn.functional as F


class AttentivePooling(torch.nn.Module):
    """Tokens (B, T, D), standardised with the training set's per-feature mean and one scale, pooled by `heads`
    learned queries (softmax over the tokens, masked where `mask` (B, T) is False), then a linear head: (B, classes).
    A set whose mask keeps no token is refused (a ValueError): pooling nothing has no answer, where softmax would give
    NaN logits and argmax class 0."""

    def __init__(self, mean: torch.Tensor, scale: torch.Tensor, num_classes: int, heads: int):
        super().__init__()
        dim = mean.numel()
        self.register_buffer("mean", mean.reshape(dim))
        self.register_buffer("scale", scale.reshape(()))
        self.keys = torch.nn.Parameter(torch.zeros(heads, dim))
        self.head = torch.nn.Linear(heads * dim, num_classes)
        torch.nn.init.zeros_(self.head.weight), torch.nn.init.zeros_(self.head.bias)

    def pool(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, heads, T) attention weights of each query over the tokens."""
        return self.weights(self.standardised(tokens), mask)

    def weights(self, standardised: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        scores = (standardised @ self.keys.T).transpose(1, 2) / math.sqrt(self.keys.shape[1])
        if mask is not None:
            check_mask(mask, standardised.shape[:2])
            scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
        return scores.softmax(-1)

    def standardised(self, tokens: torch.Tensor) -> torch.Tensor:
        return (tokens.float() - self.mean) / self.scale

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.read(self.standardised(tokens), mask)

    def read(self, standardised: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, classes) of tokens already standardised (what the fit feeds, converted once)."""
        return self.head(torch.bmm(self.weights(standardised, mask), standardised).flatten(1))


def check_mask(mask: torch.Tensor, shape: tuple) -> None:
    """A ValueError unless `mask` is a boolean (B, T) of `shape` that keeps at least one token of every set."""
    if mask.dtype != torch.bool or tuple(mask.shape) != tuple(shape):
        raise ValueError(f"mask must be a boolean tensor of the tokens' (B, T) = {tuple(shape)}, got {mask.dtype} of "
                         f"{tuple(mask.shape)}.")
    if not (kept := mask.any(-1)).all():
        empty = (~kept).nonzero().flatten().tolist()
        more = f" and {len(empty) - 1} more" if len(empty) > 1 else ""
        raise ValueError(f"mask keeps no token of set {empty[0]}{more}: an attentive probe pools at least one token of "
                         "each set; keep one, or leave the set out.")


def check_tokens(tokens: torch.Tensor, what: str = "tokens") -> None:
    """A ValueError unless `tokens` is (N, T, D) with N, T, D >= 1 and every value finite."""
    if tokens.dim() != 3 or 0 in tokens.shape:
        raise ValueError(f"{what} must be (N, T, D) token sets with N, T and D at least 1, got shape "
                         f"{tuple(tokens.shape)}.")
    finite = torch.cat([torch.isfinite(part).flatten(1).all(1) for part in tokens.split(64)])  # a chunk at a time
    if not finite.all():
        bad = (~finite).nonzero().flatten().tolist()
        raise ValueError(f"{what} hold NaN or infinite values in {len(bad)} of {len(tokens)} sets (the first: set "
                         f"{bad[0]}): a probe would read NaN and always answer class 0. Repair or leave out those "
                         "sets.")


def check_fit_arguments(tokens: torch.Tensor, labels: torch.Tensor, num_classes: int, **settings) -> None:
    """A ValueError naming the first input of `fit_attentive_classifier` it cannot fit on, and how to fix it."""
    check_tokens(tokens)
    if labels.dim() != 1 or len(labels) != len(tokens) or labels.is_floating_point() or labels.dtype == torch.bool:
        raise ValueError(f"labels must be (N,) whole numbers, one per token set ({len(tokens)}), got {labels.dtype} of "
                         f"{tuple(labels.shape)}.")
    if not (isinstance(num_classes, int) and num_classes >= 1) or labels.min() < 0 or labels.max() >= num_classes:
        raise ValueError(f"labels must lie in 0..num_classes - 1 = {num_classes - 1}, got {labels.min().item()} to "
                         f"{labels.max().item()}.")
    for name in ("heads", "steps", "batch_size"):
        if not isinstance(settings[name], int) or settings[name] < 1:
            raise ValueError(f"{name} must be a whole number, 1 or more, got {settings[name]!r} (steps 0 would leave "
                             "the probe untrained, heads or batch_size 0 would read nothing).")
    if not (math.isfinite(settings["lr"]) and settings["lr"] > 0):
        raise ValueError(f"lr must be a finite number above 0, got {settings['lr']!r}.")
    if not (math.isfinite(settings["weight_decay"]) and settings["weight_decay"] >= 0):
        raise ValueError(f"weight_decay must be a finite number, 0 or more, got {settings['weight_decay']!r}.")


def fit_attentive_classifier(tokens: torch.Tensor, labels: torch.Tensor, num_classes: int, *,
                             weight_decay: float = 1e-3, heads: int = 4, steps: int = 200, lr: float = 3e-2,
                             batch_size: int = 64, seed: int = 0) -> AttentivePooling:
    """An attentive probe fitted on frozen tokens (N, T, D) for labels (N,): AdamW on shuffled mini-batches (order
    from `seed`), cosine learning rate, `weight_decay` on the head and the keys. The same inputs give the same bits.
    Returns the probe in eval mode, its parameters frozen. A ValueError, before any step, for inputs it cannot fit on:
    no token set, a NaN or infinite token, labels outside 0..num_classes - 1, and heads, steps or batch_size below 1."""
    check_fit_arguments(tokens, labels, num_classes, weight_decay=weight_decay, heads=heads, steps=steps, lr=lr,
                        batch_size=batch_size)
    flat = tokens.reshape(-1, tokens.shape[-1]).float()
    variance, mean = torch.var_mean(flat, dim=0, correction=0)
    scale = variance.mean().sqrt().clamp_min(1e-6)  # the root-mean-square spread of the features: one scale for all
    probe = AttentivePooling(mean, scale, num_classes, heads)
    inputs = probe.standardised(tokens)  # float32 once: a float16 batch converted every step costs more than the step
    optimizer = torch.optim.AdamW(probe.parameters(), lr=lr, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)
    order, cursor = torch.randperm(len(labels), generator=generator), 0
    for step in range(steps):
        if cursor >= len(order):
            order, cursor = torch.randperm(len(labels), generator=generator), 0
        rows = order[cursor : cursor + batch_size]
        cursor += batch_size
        for group in optimizer.param_groups:
            group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        loss = F.cross_entropy(probe.read(inputs[rows]), labels[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return probe.eval().requires_grad_(False)


@torch.inference_mode()
def predict_tokens(probe: AttentivePooling, tokens: torch.Tensor, batch_size: int = 64) -> torch.Tensor:
    """(N,) predicted classes of token sets (N, T, D), a batch at a time (the tokens may be float16). A ValueError for
    a NaN or infinite token (its set would be answered class 0) or a batch_size below 1."""
    check_tokens(tokens)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number, 1 or more, got {batch_size!r}.")
    return torch.cat([probe(part).argmax(-1) for part in tokens.split(batch_size)])
