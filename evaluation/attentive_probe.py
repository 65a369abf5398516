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
    learned queries (softmax over the tokens, masked where `mask` (B, T) is False), then a linear head: (B, classes)."""

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
            scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
        return scores.softmax(-1)

    def standardised(self, tokens: torch.Tensor) -> torch.Tensor:
        return (tokens.float() - self.mean) / self.scale

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.read(self.standardised(tokens), mask)

    def read(self, standardised: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, classes) of tokens already standardised (what the fit feeds, converted once)."""
        return self.head(torch.bmm(self.weights(standardised, mask), standardised).flatten(1))


def fit_attentive_classifier(tokens: torch.Tensor, labels: torch.Tensor, num_classes: int, *,
                             weight_decay: float = 1e-3, heads: int = 4, steps: int = 200, lr: float = 3e-2,
                             batch_size: int = 64, seed: int = 0) -> AttentivePooling:
    """An attentive probe fitted on frozen tokens (N, T, D) for labels (N,): AdamW on shuffled mini-batches (order
    from `seed`), cosine learning rate, `weight_decay` on the head and the keys. The same inputs give the same bits.
    Returns the probe in eval mode, its parameters frozen."""
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
    """(N,) predicted classes of token sets (N, T, D), a batch at a time (the tokens may be float16)."""
    return torch.cat([probe(part).argmax(-1) for part in tokens.split(batch_size)])
