"""Converting a pretrained ViT into an elastic VECA, measured block by block (issue #67).

The copy (`corevision_hf.veca_from_teacher`) keeps what each patch token is made of and what its queries, keys, values
and MLP compute; what it breaks is the routing: a patch attends to the cores only, where the teacher's patch attended
to every token. The attention-transfer pass shows, per block, how far the copy's attention branch is from the
teacher's when both read the same input: the patches take the teacher's hidden states at that block, and the cores
run through the student (each block's cores read the teacher's patches of that block). `transfer_errors` reports,
per block, the relative error |o_VECA - o_teacher|^2 / |o_teacher|^2 of the branch at the patch positions, beside
three references: 1 (the branch zeroed), uniform attention (each patch takes the mean value of all tokens) and an
untrained per-image bound (the teacher's own tokens of that block, pooled into C spatial regions, as the cores). Stage 1
of the conversion (`training.convert_veca`) minimises the same error.

Teachers: transformers' Dinov2Model, Dinov2WithRegistersModel and DINOv3ViTModel (blocks with `norm1`, `attention`
and `layer_scale1`; the copy folds LayerScale into its `o_proj`)."""

import math

import torch
import torch.nn.functional as F


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
