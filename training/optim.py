"""The optimiser of a distillation run: AdamW, and for VECA the authors' NorMuon on its matrices.

`build_optimizer(model, name, lr, weight_decay)` splits the student's parameters as the method's authors do and returns
one `DistillOptimizer`, a torch optimiser whose parameter groups each run one algorithm:
- "normuon" (NorMuon, arXiv 2510.05491, as microsoft/dion implements it and the VECA authors configure it): Nesterov
  momentum, orthogonalised by Polar Express in bfloat16, each row rescaled by its running second moment with the
  matrix's Frobenius norm kept, a step of lr * 0.2 * sqrt(max(rows, cols)), and cautious weight decay (only where the
  step already moves a weight toward 0). A fused matrix (VECA's q / k / v) is handled as its separate blocks.
- "adamw" (torch.optim.AdamW's arithmetic). In a group marked `nested_rows` (VECA's core bank), a row whose gradient is
  exactly zero was outside this step's budget: like a parameter without a gradient (the authors' bank is stored in
  separate chunks that then get none), it keeps its weights and moments and its own step count.
"""

import math

import torch
from torch.distributed.tensor import DTensor
from torch.optim.adamw import adamw as adamw_functional  # torch.optim.AdamW's own update

# Polar Express coefficients as the VECA authors compute them (veca/polar.py: optimal_composition(l=1e-3,
# num_iters=5, safety_factor_eps=1e-2, cushion=0.02)): one (a, b, c) per iteration of X <- aX + (bA + cA^2)X, A = XX^T.
POLAR_EXPRESS_COEFFICIENTS = (
    (8.237312490495555, -23.157747414558184, 16.6805684114459),
    (4.082441999064838, -2.8930477353325887, 0.525284925697565),
    (3.9263479922546516, -2.8547468034765267, 0.5318022422894985),
    (3.2982187133085166, -2.4245419810267093, 0.48632008358844125),
    (2.32000731288981, -1.6862169729967624, 0.42068027340235153),
)
NORMUON_DEFAULTS = dict(momentum=0.95, beta2=0.95, nesterov=True, cautious_weight_decay=True)
ADAMW_DEFAULTS = dict(betas=(0.9, 0.999), eps=1e-8)


def polar_express(updates: torch.Tensor, names: list[str] | None = None) -> torch.Tensor:
    """Approximately orthogonalises each matrix of `updates` (N, rows, cols) as the VECA authors do: rounded to
    bfloat16, scaled to spectral norm below 1, then the five Polar Express iterations, in bfloat16 on a GPU and in
    float32 on a CPU (whose bfloat16 matmuls run 20-70 times slower here). Returns (N, rows, cols) in that dtype.
    `names` (the matrices' names) is unused here; a replacement with the same signature may use it."""
    x = updates.bfloat16()
    if x.device.type == "cpu":
        x = x.float()
    transposed = x.size(-2) > x.size(-1)
    if transposed:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) * 1.01 + 1e-7)
    for a, b, c in POLAR_EXPRESS_COEFFICIENTS:
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if transposed else x


class DistillOptimizer(torch.optim.Optimizer):
    """NorMuon and AdamW parameter groups in one optimiser (one `step`, one state dict, as Accelerate expects).

    Group keys: "algorithm" ("normuon" or "adamw"), "names" (one per parameter: logs and `orthogonalize` use them),
    "lr", "weight_decay", optionally "frozen" (the group is skipped: training.extractor_warmup); NorMuon: "momentum",
    "beta2", "nesterov", "cautious_weight_decay" and "split_sizes" (row blocks of a fused matrix, or None); AdamW:
    "betas", "eps" and "nested_rows". `orthogonalize(updates, names)` may be replaced, e.g. to replay another
    implementation's bfloat16 results."""

    def __init__(self, groups: list[dict], lr: float):
        super().__init__(groups, dict(lr=lr, weight_decay=0.0))
        self.orthogonalize = polar_express

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group.get("frozen"):  # training.extractor_warmup: untouched, not even decayed
                continue
            if group["algorithm"] == "normuon":
                self._normuon(group)
            else:
                self._adamw(group)
        return loss

    def _adamw(self, group: dict) -> None:
        beta1, beta2 = group["betas"]
        plain = []
        for param in group["params"]:
            if param.grad is None:
                continue
            state = self.state[param]
            if not state:
                state["exp_avg"] = torch.zeros_like(param)
                state["exp_avg_sq"] = torch.zeros_like(param)
                # torch keeps a scalar step on the host (no device sync to read it); a per-row one beside its rows
                rows = (local(param).shape[-2], 1) if group["nested_rows"] else ()
                state["step"] = torch.zeros(rows, dtype=torch.float32, device=param.device if rows else "cpu")
            if group["nested_rows"]:
                self._nested_adamw(param, state, group["lr"], group["weight_decay"], beta1, beta2, group["eps"])
            else:
                plain.append((param, state))
        if plain:
            adamw_functional(
                [p for p, _ in plain], [p.grad for p, _ in plain], [s["exp_avg"] for _, s in plain],
                [s["exp_avg_sq"] for _, s in plain], [], [s["step"] for _, s in plain], amsgrad=False,
                beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
                maximize=False,
            )

    @staticmethod
    def _nested_adamw(param, state, lr, decay, beta1, beta2, eps) -> None:
        """AdamW on the rows (cores) of `param` whose gradient is not all zero, each with its own step count; the other
        rows keep weights and moments. torch.optim.AdamW's arithmetic. Under FSDP, on this process's shard."""
        if local(param).numel() == 0:  # a shard without rows
            return
        shape = (local(param).shape[-2], -1)  # (1, M, D) or (M, 2) as M rows
        weight, grad = local(param).view(shape), local(param.grad).view(shape)
        exp_avg, exp_avg_sq = local(state["exp_avg"]).view(shape), local(state["exp_avg_sq"]).view(shape)
        step = state["step"]
        active = grad.ne(0).any(-1, keepdim=True)
        step += active
        count = step.clamp(min=1)
        new_avg = exp_avg.lerp(grad, 1 - beta1)
        new_avg_sq = exp_avg_sq * beta2 + (1 - beta2) * grad * grad
        denom = new_avg_sq.sqrt() / (1 - beta2**count).sqrt() + eps
        new_weight = weight * (1 - lr * decay) - lr / (1 - beta1**count) * new_avg / denom
        weight.copy_(torch.where(active, new_weight, weight))
        exp_avg.copy_(torch.where(active, new_avg, exp_avg))
        exp_avg_sq.copy_(torch.where(active, new_avg_sq, exp_avg_sq))

    def _normuon(self, group: dict) -> None:
        mu = group["momentum"]
        blocks, names, params = [], [], []  # one entry per matrix block, in parameter order
        for param, name in zip(group["params"], group["names"]):
            if param.grad is None:
                continue
            state = self.state[param]
            if not state:
                state["momentum"] = torch.zeros_like(param)
                state["variance"] = torch.zeros_like(param[..., :1])  # per row (output neuron)
            state["momentum"].mul_(mu).add_(param.grad)
            update = state["momentum"] * mu + param.grad if group["nesterov"] else state["momentum"]
            sizes = group["split_sizes"] or [param.shape[0]]
            for index, block in enumerate(update.bfloat16().split(sizes)):
                blocks.append(block)
                names.append(name if len(sizes) == 1 else f"{name}[{index}]")
            params.append((param, sizes))
        if not blocks:
            return
        orthogonal = [None] * len(blocks)
        by_shape = {}
        for index, block in enumerate(blocks):
            by_shape.setdefault(tuple(block.shape), []).append(index)
        for indices in by_shape.values():  # same-shape blocks in one batched call
            results = self.orthogonalize(torch.stack([blocks[i] for i in indices]), [names[i] for i in indices])
            for i, result in zip(indices, results):
                orthogonal[i] = result
        position = 0
        for param, sizes in params:
            variance = self.state[param]["variance"]
            pieces = []
            for block, block_variance in zip(orthogonal[position : position + len(sizes)], variance.split(sizes)):
                pieces.append(self._normalize(block.float(), block_variance, group["beta2"]))
            position += len(sizes)
            update = torch.cat(pieces)
            lr, decay = group["lr"], group["weight_decay"]
            if group["cautious_weight_decay"]:  # decay only where the step already moves the weight toward 0
                param.sub_(param * (param * update >= 0) * (lr * decay))
            else:
                param.mul_(1 - lr * decay)
            scales = torch.cat([  # the RMS-matching step size of each block: lr * 0.2 * sqrt(max(rows, cols))
                torch.full((size, 1), lr * 0.2 * math.sqrt(max(size, param.shape[1])), device=param.device)
                for size in sizes
            ])
            param.sub_(scales * update)

    @staticmethod
    def _normalize(update: torch.Tensor, variance: torch.Tensor, beta2: float) -> torch.Tensor:
        """NorMuon's per-row normalisation of one orthogonalised block (rows, cols), updating its running mean square
        of each row (rows, 1) in place; the block's Frobenius norm is kept."""
        norm = update.norm()
        variance.lerp_(update.square().mean(-1, keepdim=True), 1 - beta2)
        normalized = update / (variance.sqrt() + 1e-8)
        return normalized * (norm / normalized.norm().clamp(min=1e-8))


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This process's part of a tensor that FSDP shards (a DTensor), or the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


# ---------------------------------------------------------------- who gets what, as each method's authors do it


def _kind(model: torch.nn.Module, name: str) -> type | None:
    """The class of the module that owns parameter `name`."""
    owner, _, _ = name.rpartition(".")
    return type(model.get_submodule(owner)) if owner else None


def modules_of(model: torch.nn.Module, class_name: str) -> list[torch.nn.Module]:
    """`model`'s modules of a class named `class_name` (by name, so that a hub copy's class, loaded with
    trust_remote_code, counts as ours; or a subclass, as FSDP2 makes of each module it shards)."""
    return [m for m in model.modules() if any(cls.__name__ == class_name for cls in type(m).__mro__)]


def parameters_of(model: torch.nn.Module, class_name: str) -> set[int]:
    """The ids of the parameters held by `model`'s modules of class `class_name` (`modules_of`), under whatever prefix
    a wrapper such as PEFT's adds."""
    return {id(p) for m in modules_of(model, class_name) for p in m.parameters()}


def veca_groups(model, matrices: str, weight_decay: float) -> list[dict]:
    """The VECA authors' split (veca/optim.py): the weights of the Linear layers go to `matrices` ("normuon" or
    "adamw"), except the coordinate heads' and the last layer's MLP output; everything else to AdamW. Every parameter is
    decayed, as the authors do. Parameters are told apart by the modules that hold them, not by their names."""
    bank, heads = parameters_of(model, "VecaCoreBank"), parameters_of(model, "VecaCoordinateHead")
    last_layer = modules_of(model, "VecaLayer")[-1]
    last_fc2 = {id(p) for p in last_layer.mlp.fc2.parameters()}
    matrix, rest, nested = [], [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if id(param) in bank:
            nested.append((name, param))
        elif (_kind(model, name) is torch.nn.Linear and name.endswith(".weight")
              and id(param) not in last_fc2 | heads):
            matrix.append((name, param))
        else:
            rest.append((name, param))
    options = dict(NORMUON_DEFAULTS) if matrices == "normuon" else dict(ADAMW_DEFAULTS, nested_rows=False)
    return [
        group(matrix, matrices, weight_decay, **options, split_sizes=None),
        group(rest, "adamw", weight_decay, **ADAMW_DEFAULTS, nested_rows=False),
        group(nested, "adamw", weight_decay, **ADAMW_DEFAULTS, nested_rows=True),
    ]


def lookwhere_groups(model, weight_decay: float) -> list[dict]:
    """The LookWhere authors' AdamW (optax.adamw with a mask): only kernels are decayed, i.e. the weights of Linear and
    Conv2d layers; position embeddings, CLS / register tokens, norms, layer scales and biases are not."""
    decayed, kept = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            kernel = _kind(model, name) in (torch.nn.Linear, torch.nn.Conv2d) and name.endswith(".weight")
            (decayed if kernel else kept).append((name, param))
    return [
        group(decayed, "adamw", weight_decay, **ADAMW_DEFAULTS, nested_rows=False),
        group(kept, "adamw", 0.0, **ADAMW_DEFAULTS, nested_rows=False),
    ]


def group(named: list[tuple[str, torch.nn.Parameter]], algorithm: str, weight_decay: float, **options) -> dict:
    return {"params": [p for _, p in named], "names": [n for n, _ in named], "algorithm": algorithm,
            "weight_decay": weight_decay, **options}


def check_optimizer(model_type: str, name: str) -> None:
    """Raises ValueError for NorMuon on another model than VECA: which matrices it takes is the VECA authors' rule,
    and LookWhere's authors train with AdamW."""
    if name == "normuon" and model_type != "veca":
        raise ValueError(
            f"--optimizer normuon: the NorMuon split (which matrices it takes) is the VECA authors'; {model_type} "
            "trains with AdamW (its authors'). Use --optimizer adamw."
        )


def build_optimizer(model, name: str, lr: float, weight_decay: float) -> DistillOptimizer:
    """The optimiser `name` ("adamw" or "normuon") for a student, split as its method's authors do: VECA
    (`veca_groups`), LookWhere (`lookwhere_groups`); any other model one AdamW group, all decayed."""
    model_type = model.config.model_type
    check_optimizer(model_type, name)
    if model_type == "veca":
        groups = veca_groups(model, name, weight_decay)
        if name == "normuon" and not any(g["params"] for g in groups if g["algorithm"] == "normuon"):
            raise ValueError("--optimizer normuon: this VECA has no trainable Linear weights for NorMuon; use adamw.")
    elif model_type == "lookwhere":
        groups = lookwhere_groups(model, weight_decay)
    else:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        groups = [group(named, "adamw", weight_decay, **ADAMW_DEFAULTS, nested_rows=False)]
    return DistillOptimizer([g for g in groups if g["params"]], lr)


def describe(optimizer: DistillOptimizer) -> str:
    """One line naming each algorithm's share of the parameters, e.g. for the run's log."""
    counts = {}
    for group in optimizer.param_groups:
        tensors, elements = counts.get(group["algorithm"], (0, 0))
        counts[group["algorithm"]] = (tensors + len(group["params"]), elements + sum(p.numel() for p in group["params"]))
    total = sum(elements for _, elements in counts.values())
    return "optimizer: " + ", ".join(
        f"{'NorMuon' if algorithm == 'normuon' else 'AdamW'} {elements:,} parameters in {tensors} tensors "
        f"({elements / total:.1%})" for algorithm, (tensors, elements) in counts.items()
    )
