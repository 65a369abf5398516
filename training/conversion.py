"""Converting a pretrained ViT into an elastic VECA, measured block by block (issue #67).

The copy (`corevision_hf.veca_from_teacher`) keeps what each patch token is made of and what its queries, keys, values
and MLP compute; what it breaks is the routing: a patch attends to the cores only, where the teacher's patch attended
to every token. The attention-transfer pass shows, per block, how far the copy's attention branch is from the
teacher's when both read the same input: the patches take the teacher's hidden states at that block, and the cores
run through the student (each block's cores read the teacher's patches of that block). `transfer_errors` reports,
per block, the relative error |o_VECA - o_teacher|^2 / |o_teacher|^2 of the branch at the patch positions, beside
three references: 1 (the branch zeroed), uniform attention (each patch takes the mean value of all tokens) and an
untrained per-image bound (the teacher's own tokens of that block, pooled into C spatial regions, as the cores). Stage 1
of the conversion minimises the same error. `convert` is the whole conversion (the copy, its seeded bank, stage 1,
stage 2, the table before and after each), as `python -m training.convert_veca` and benchmarks.sparse_recognition_veca
run it.

Teachers: transformers' Dinov2Model, Dinov2WithRegistersModel and DINOv3ViTModel (blocks with `norm1`, `attention`
and `layer_scale1`; the copy folds LayerScale into its `o_proj`)."""

import math
import time
from copy import deepcopy

import torch
import torch.nn.functional as F

# The stages' default peak rates (training.convert_veca's and benchmarks.sparse_recognition_veca's): stage 1's is the
# rate of experiments/veca_conversion's runs; stage 2 moves every copied weight, so at a fine-tuning rate.
STAGE1_LR, STAGE2_LR = 3e-3, 2e-5


def teacher_blocks(teacher) -> list:
    """The teacher's blocks, in order (DINOv2's `encoder.layer`, DINOv3's `model.layer`)."""
    owner = teacher.encoder if hasattr(teacher, "encoder") else teacher.model
    return list(owner.layer)


def num_prefix_tokens(teacher) -> int:
    """The teacher's tokens before its patches: CLS and registers."""
    return 1 + (getattr(teacher.config, "num_register_tokens", 0) or 0)


@torch.no_grad()
def teacher_targets(teacher, pixel_values: torch.Tensor) -> dict:
    """One teacher forward, recorded per block: "inputs", the hidden states entering each block (L + 1 tensors of
    (B, P + N, D): the last is the last block's output, before the final norm); "branches", each block's attention
    branch output after LayerScale at the patch positions (L tensors of (B, N, D)); "final", the final normalised
    tokens (B, P + N, D)."""
    branches, hooks = [], []
    prefix = num_prefix_tokens(teacher)
    for block in teacher_blocks(teacher):
        hooks.append(block.layer_scale1.register_forward_hook(
            lambda module, args, output: branches.append(output[:, prefix:].float())))
    try:
        output = teacher(pixel_values=pixel_values, output_hidden_states=True)
    finally:
        for hook in hooks:
            hook.remove()
    patch = teacher.config.patch_size
    return {"inputs": [state.float() for state in output.hidden_states], "branches": branches,
            "final": output.last_hidden_state.float(),
            "grid": (pixel_values.shape[2] // patch, pixel_values.shape[3] // patch)}


def region_grid(num_regions: int) -> tuple[int, int]:
    """(rows, columns) with rows * columns = `num_regions`, as near square as it factors (8 -> 2 x 4, 64 -> 8 x 8)."""
    rows = max(r for r in range(1, math.isqrt(num_regions) + 1) if num_regions % r == 0)
    return rows, num_regions // rows


def pooled_regions(patches: torch.Tensor, grid: tuple[int, int], num_regions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, N, D) patch tokens on a (Hp, Wp) grid -> their means over `num_regions` spatial regions (B, C, D) and the
    regions' centres (C, 2) in (x, y) order in (-1, 1)."""
    rows, columns = region_grid(num_regions)
    maps = patches.transpose(1, 2).unflatten(-1, grid)  # (B, D, Hp, Wp)
    pooled = F.adaptive_avg_pool2d(maps, (rows, columns)).flatten(2).transpose(1, 2)
    ys = (torch.arange(rows, dtype=torch.float32) + 0.5) / rows * 2 - 1
    xs = (torch.arange(columns, dtype=torch.float32) + 0.5) / columns * 2 - 1
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
    return pooled, torch.stack([grid_x, grid_y], dim=-1).flatten(0, 1)


def branch_error(ours: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
    """|ours - theirs|^2 / |theirs|^2 over the whole batch, a 0-d float32 tensor."""
    return (ours.float() - theirs).square().sum() / theirs.square().sum()


def transfer_pass(student, targets: dict, num_cores: int, pooled_cores: bool = False) -> list[torch.Tensor]:
    """The student's attention branch at the patch positions, per block, (B, N, D) each, when the patches read the
    teacher's hidden states of that block (`targets["inputs"]`, from `teacher_targets`) and the cores run through the
    student: its first `num_cores` cores of the bank, moved by its coordinate heads, updated by each block from the
    teacher's patches. With `pooled_cores`, each block's cores are instead the teacher's own tokens of that block
    pooled into `num_cores` regions, at the regions' centres (the untrained per-image bound)."""
    embeddings, encoder = student.embeddings, student.encoder
    patches_in = targets["inputs"]
    batch_size, num_patches = patches_in[0].shape[0], targets["branches"][0].shape[1]
    grid = targets["grid"]
    cores, coordinates = embeddings.core_bank(batch_size, num_cores)
    patch_rotations = encoder.rotary_embedding(grid).expand(batch_size, -1, -1)
    outputs = []
    for index, layer in enumerate(encoder.layers):
        patches = patches_in[index][:, -num_patches:]
        if pooled_cores:
            cores, centres = pooled_regions(patches, grid, num_cores)
            coordinates = torch.atanh(centres.clamp(-0.999, 0.999)).expand(batch_size, -1, -1)
        elif index > 0:
            coordinates = encoder.coordinate_heads[index - 1](coordinates, cores)
        rotations = torch.cat([encoder.rotary_embedding.rotations(torch.tanh(coordinates)), patch_rotations], dim=1)
        hidden = torch.cat([cores.to(patches.dtype), patches], dim=1)
        branch, _ = layer.attention(layer.norm1(hidden), num_cores, rotations)
        outputs.append(branch[:, num_cores:])
        if not pooled_cores:  # the cores go on through the block: attention, then the MLP, on the cores alone
            cores = hidden[:, :num_cores] + branch[:, :num_cores]
            cores = cores + layer.mlp(layer.norm2(cores))
    return outputs


def uniform_branches(student, targets: dict) -> list[torch.Tensor]:
    """Each block's attention branch at the patch positions had every patch attended to all the teacher's tokens
    alike (the mean value), through the copy's value and output projections (the teacher's, LayerScale folded in)."""
    num_patches = targets["branches"][0].shape[1]
    outputs = []
    for layer, hidden in zip(student.encoder.layers, targets["inputs"]):
        attention = layer.attention
        mean_value = attention.v_proj(layer.norm1(hidden)).mean(dim=1, keepdim=True)
        outputs.append(attention.o_proj(mean_value).expand(-1, num_patches, -1))
    return outputs


@torch.no_grad()
def transfer_errors(student, targets: dict, budgets: list[int]) -> dict:
    """The per-block table: for each budget C, the student's relative branch error per block and the per-image bound
    at C; the uniform-attention reference per block (1 is the branch zeroed). Lists of floats, one per block."""
    was_training = student.training
    student.eval()
    try:
        theirs = targets["branches"]
        table = {"uniform": [branch_error(o, t).item() for o, t in zip(uniform_branches(student, targets), theirs)]}
        for budget in budgets:
            ours = transfer_pass(student, targets, budget)
            bound = transfer_pass(student, targets, budget, pooled_cores=True)
            table[f"student_c{budget}"] = [branch_error(o, t).item() for o, t in zip(ours, theirs)]
            table[f"pooled_bound_c{budget}"] = [branch_error(o, t).item() for o, t in zip(bound, theirs)]
    finally:
        student.train(was_training)
    return table


def format_table(table: dict) -> str:
    """The per-block table as text: a row per block, a column per entry of `table`, and their means."""
    names = list(table)
    depth = len(table[names[0]])
    lines = ["block  " + "  ".join(f"{name:>16s}" for name in names)]
    for block in range(depth):
        lines.append(f"{block:5d}  " + "  ".join(f"{table[name][block]:16.3f}" for name in names))
    lines.append(" mean  " + "  ".join(f"{sum(table[name]) / depth:16.3f}" for name in names))
    return "\n".join(lines)


@torch.no_grad()
def kmeans(points: torch.Tensor, count: int, iterations: int = 20, seed: int = 0) -> torch.Tensor:
    """`count` centroids (count, D) of `points` (N, D) by Lloyd's iterations from k-means++ seeds; an empty cluster
    keeps its centroid."""
    generator = torch.Generator().manual_seed(seed)
    centroids = points[torch.randint(len(points), (1,), generator=generator)]
    while len(centroids) < count:  # k-means++: each next seed drawn by its squared distance to the nearest one
        distance = torch.cdist(points, centroids).min(dim=1).values.square()
        centroids = torch.cat([centroids, points[torch.multinomial(distance / distance.sum(), 1, generator=generator)]])
    for _ in range(iterations):
        nearest = torch.cdist(points, centroids).argmin(dim=1)
        sums = torch.zeros_like(centroids).index_add_(0, nearest, points)
        counts = torch.bincount(nearest, minlength=count)[:, None]
        centroids = torch.where(counts > 0, sums / counts.clamp(min=1), centroids)
    return centroids


@torch.no_grad()
def nested_order(points: torch.Tensor, candidates: torch.Tensor, chosen: torch.Tensor) -> list[int]:
    """The order of `candidates` (K, D) that makes each prefix a good bank beside the `chosen` tokens (P, D): each next
    candidate is the one that lowers the points' (N, D) mean squared distance to their nearest token the most."""
    nearest = (torch.cdist(points, chosen).min(dim=1).values.square() if len(chosen)
               else torch.full((len(points),), float("inf")))
    to_candidates = torch.cdist(points, candidates).square()  # (N, K)
    order, left = [], list(range(len(candidates)))
    while left:
        errors = torch.minimum(nearest[:, None], to_candidates[:, left]).mean(dim=0)
        best = left.pop(int(errors.argmin()))
        order.append(best)
        nearest = torch.minimum(nearest, to_candidates[:, best])
    return order


@torch.no_grad()
def seed_core_bank(student, teacher, pixel_batches, max_tokens: int = 20000, seed: int = 0) -> dict:
    """The student's bank seeded from the teacher's own tokens: core 0 the teacher's CLS (its position added, as its
    first block reads it), then its registers, then centroids of its first block's patch tokens over the images of
    `pixel_batches` (k-means), in the order that makes each prefix a good bank (`nested_order`); each centroid at the
    mean position of its patches. Returns what was seeded, for the record."""
    embeddings = teacher.embeddings
    prefix, bank = num_prefix_tokens(teacher), student.embeddings.core_bank
    tokens, positions = [], []
    for pixel_values in pixel_batches:
        hidden = embeddings(pixel_values.to(next(teacher.parameters()).dtype)).float()  # (B, P + N, D)
        patches = hidden[:, prefix:]
        grid = (pixel_values.shape[2] // teacher.config.patch_size, pixel_values.shape[3] // teacher.config.patch_size)
        ys = (torch.arange(grid[0]) + 0.5) / grid[0] * 2 - 1
        xs = (torch.arange(grid[1]) + 0.5) / grid[1] * 2 - 1
        centres = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), dim=-1).flatten(0, 1)  # (N, 2) in (x, y)
        tokens.append(patches.flatten(0, 1))
        positions.append(centres.repeat(len(pixel_values), 1))
        global_tokens = hidden[0, :prefix]  # CLS (+ its position) and registers: the same for every image
    tokens, positions = torch.cat(tokens), torch.cat(positions)
    keep = torch.randperm(len(tokens), generator=torch.Generator().manual_seed(seed))[:max_tokens]
    tokens, positions = tokens[keep], positions[keep]
    num_cores = bank.cores.shape[1]
    fixed = global_tokens[:num_cores]
    count = num_cores - len(fixed)
    centroids = kmeans(tokens, count, seed=seed) if count else tokens[:0]
    order = nested_order(tokens, centroids, fixed)
    centroids = centroids[order]
    members = torch.cdist(tokens, centroids).argmin(dim=1) if count else torch.zeros(0, dtype=torch.long)
    where = torch.stack([positions[members == i].mean(dim=0) if (members == i).any() else torch.zeros(2)
                         for i in range(count)]) if count else torch.zeros(0, 2)
    coordinates = torch.cat([torch.zeros(len(fixed), 2), where]).clamp(-0.95, 0.95)
    bank.cores.copy_(torch.cat([fixed, centroids])[None].to(bank.cores.dtype))
    bank.coordinates.copy_(torch.atanh(coordinates).to(bank.coordinates.dtype))
    return {"from_teacher_tokens": len(fixed), "centroids": count, "tokens_clustered": len(tokens)}


def end_to_end_loss(student, targets: dict, pixel_values: torch.Tensor, num_cores: int) -> torch.Tensor:
    """Stage 2's loss: the student alone, its patch tokens after every block against the teacher's (relative MSE,
    `branch_error`'s), their mean, plus the final features' (the normalised patch tokens and core 0 against the
    teacher's CLS)."""
    output = student(pixel_values, num_cores=num_cores, output_hidden_states=True, return_dict=True)
    num_patches = targets["branches"][0].shape[1]
    blocks = [branch_error(ours[:, -num_patches:], theirs[:, -num_patches:])
              for ours, theirs in zip(output.hidden_states[1:], targets["inputs"][1:])]
    final = targets["final"]
    return (sum(blocks) / len(blocks) + branch_error(output.patch_tokens, final[:, -num_patches:])
            + branch_error(output.pooler_output, final[:, 0]))


def transfer_loss(student, targets: dict, num_cores: int) -> torch.Tensor:
    """Stage 1's loss: the mean over blocks of the attention branch's relative error (`transfer_pass`)."""
    outputs = transfer_pass(student, targets, num_cores)
    return sum(branch_error(ours, theirs) for ours, theirs in zip(outputs, targets["branches"])) / len(outputs)


def train_stage(student, teacher, loss_of, parameters: list, images, steps: int, lr: float, seed: int,
                log=print, name: str = "stage", after_step=None) -> list[float]:
    """`steps` AdamW steps (no weight decay; warm-up over a tenth, then cosine to a tenth) of `loss_of(student,
    targets, pixel_values, num_cores)` on `images(step)` (a function of the step: the step's pixel values), a core
    budget per step drawn from the config's training budgets as nested dropout draws it; `after_step(steps done)` after
    each. Returns the losses."""
    from .schedule import draw, warmup_cosine

    config = student.config
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=0.0)
    student.train()
    losses = []
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr * warmup_cosine(step, max(1, steps // 10), steps, 0.1)
        pixel_values = images(step)
        targets = teacher_targets(teacher, pixel_values)
        num_cores = draw(config.training_budgets, config.training_budget_weights, seed, step)
        loss = loss_of(student, targets, pixel_values, num_cores)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step % max(1, steps // 10) == 0 or step == steps - 1:
            log(f"{name} step {step + 1}/{steps}: loss {losses[-1]:.4f} at C = {num_cores}")
        if after_step is not None:
            student.eval()
            after_step(step + 1)
            student.train()
    student.eval()
    return losses


def attention_transfer(student, teacher, images, steps: int, lr: float, seed: int = 0, log=print) -> list[float]:
    """Stage 1: everything copied from the teacher frozen; the bank and the coordinate heads learn each block's
    attention branch (`transfer_loss`). Returns the losses."""
    student.requires_grad_(False)
    parameters = [*student.embeddings.core_bank.parameters(), *student.encoder.coordinate_heads.parameters()]
    for parameter in parameters:
        parameter.requires_grad_(True)
    try:
        return train_stage(student, teacher, lambda model, targets, _, cores: transfer_loss(model, targets, cores),
                           parameters, images, steps, lr, seed, log, "stage 1")
    finally:
        student.requires_grad_(True)


def end_to_end(student, teacher, images, steps: int, lr: float, seed: int = 0, lora_rank: int | None = None,
               log=print, after_step=None):
    """Stage 2: the student alone against the teacher's every block and final features (`end_to_end_loss`), all its
    weights trained, or with `lora_rank` LoRA adapters of that rank on q / k / v / o beside the bank and coordinate
    heads (merged into the weights afterwards). `after_step(steps done, snapshot)`, where `snapshot()` gives a copy of
    the student as it is then (adapters merged). Returns (the student, the losses)."""
    model = student
    if lora_rank:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(student, LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank,
                                                   target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
        for parameter in [*student.embeddings.core_bank.parameters(), *student.encoder.coordinate_heads.parameters()]:
            parameter.requires_grad_(True)
    parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]

    def snapshot():
        copy = deepcopy(model)
        return copy.merge_and_unload() if lora_rank else copy

    hook = None if after_step is None else (lambda done: after_step(done, snapshot))
    losses = train_stage(model, teacher, end_to_end_loss, parameters, images, steps, lr, seed, log, "stage 2", hook)
    if lora_rank:
        student = model.merge_and_unload()
        student.requires_grad_(True)
    return student, losses


@torch.no_grad()
def final_cosines(student, teacher, pixel_values: torch.Tensor, num_cores: int) -> dict:
    """The student's final features against the teacher's: the mean cosine of the patch tokens, the same after both
    sides' mean patch token over the images is removed (a constant predictor scores 0 there), and core 0 against the
    teacher's CLS."""
    ours = student(pixel_values, num_cores=num_cores).last_hidden_state
    theirs = teacher(pixel_values=pixel_values).last_hidden_state.float()
    num_patches = ours.shape[1] - num_cores
    mine, their = ours[:, -num_patches:], theirs[:, -num_patches:]
    centred = F.cosine_similarity(mine - mine.mean(dim=(0, 1)), their - their.mean(dim=(0, 1)), dim=-1)
    return {"patch_cosine": F.cosine_similarity(mine, their, dim=-1).mean().item(),
            "centred_patch_cosine": centred.mean().item(),
            "cls_cosine": F.cosine_similarity(ours[:, 0], theirs[:, 0], dim=-1).mean().item()}


def table_record(student, teacher, targets: dict, pixel_values: torch.Tensor, budgets: list[int], log) -> dict:
    """The per-block table at `budgets` and the final features' cosines at the whole bank, printed and returned."""
    bank = student.config.num_cores
    table = transfer_errors(student, targets, budgets)
    cosines = final_cosines(student.eval(), teacher, pixel_values, bank)
    log(format_table(table))
    log("final features at C = {}: patch cosine {patch_cosine:.3f}, centred {centred_patch_cosine:.3f}, core 0 / CLS "
        "{cls_cosine:.3f}".format(bank, **cosines))
    return {"transfer_error": table, "final_cosines": cosines}


def convert(teacher, train, val: torch.Tensor, args, log=print, *, budgets: list[int] | None = None,
            table_budgets: list[int] | None = None, after_step=None) -> tuple:
    """The conversion of `teacher` on the normalised images `train` (N, 3, S, S), or anything whose `len()` counts
    them and whose `[rows]` (a LongTensor) gives their pixels (evaluation.canvases' Pixels), measured on `val`
    (M, 3, S, S), with the settings of `args` (training.convert_veca's: num_cores, batch_size, the stages' steps and
    rates, lora_rank, seed). `budgets`: the copy's nested-dropout budgets (None: VecaConfig's schedule for its bank);
    `table_budgets`: the table's (None: 8, or the bank if smaller, and the whole bank). `after_step(stage, steps,
    snapshot)`, `snapshot()` giving a plain VecaModel copy of the student as it is then: ("start", 0) once the bank is
    seeded, ("stage1", its steps) at its end, ("stage2", steps done) after each of its steps; its time counts in the
    record's. Returns (the student, the record: the seeding, each stage's table, cosines, losses and time, the whole
    time)."""
    from corevision_hf import veca_from_teacher

    start = time.perf_counter()
    torch.manual_seed(args.seed)
    count, size = len(train), args.batch_size
    hook = after_step or (lambda stage, steps, snapshot: None)

    def batch(step: int) -> torch.Tensor:  # a function of the step alone: the same run twice gives the same bits
        order = torch.randperm(count, generator=torch.Generator().manual_seed(args.seed + step // count))
        first = (step * size) % count
        return train[order[torch.arange(first, first + size) % count]]

    student = veca_from_teacher(teacher, num_cores=args.num_cores, image_size=val.shape[-1],
                                training_budgets=budgets).float()
    seeding = (train[torch.arange(first, min(first + size, count))] for first in range(0, count, size))
    record = {"seeded": seed_core_bank(student, teacher, seeding, seed=args.seed), "stages": {}}
    table_budgets = table_budgets or sorted({min(8, args.num_cores), args.num_cores})
    val_targets = teacher_targets(teacher, val)
    log("the copy, its bank seeded from the teacher:")
    record["stages"]["start"] = table_record(student, teacher, val_targets, val, table_budgets, log)
    hook("start", 0, lambda: deepcopy(student))
    for name, steps in (("stage1", args.stage1_steps), ("stage2", args.stage2_steps)):
        if not steps:
            continue
        began = time.perf_counter()
        if name == "stage1":
            losses = attention_transfer(student, teacher, batch, steps, args.stage1_lr, args.seed, log)
            hook("stage1", steps, lambda: deepcopy(student))
        else:
            student, losses = end_to_end(student, teacher, batch, steps, args.stage2_lr, args.seed,
                                         args.lora_rank or None, log,
                                         lambda done, snapshot: hook("stage2", done, snapshot))
        log(f"after {name} ({time.perf_counter() - began:.0f} s):")
        record["stages"][name] = {"losses": losses, "time_s": time.perf_counter() - began,
                                  **table_record(student, teacher, val_targets, val, table_budgets, log)}
    record["conversion_time_s"] = time.perf_counter() - start
    return student, record
