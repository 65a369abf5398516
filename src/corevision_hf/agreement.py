"""Cost and agreement with a dense teacher, per budget: the measurements `python -m corevision_hf.compare` prints
and `python -m evaluation.evaluate_budgets` records (latency and memory through `corevision_hf.measure`).

A teacher is any transformers ViT with the layout that covers DINOv2 and DINOv3: CLS = token 0, patches = the last
Hp * Wp tokens. It sees the image resized so that its patch grid equals the model's (`teacher_input`).
"""

import torch
import torch.nn.functional as F

from .finite import check_output_finite
from .flops import dense_vit_flops, lookwhere_flops, veca_flops
from .tokens import patch_tokens


# ---------------------------------------------------------------- the teacher


def teacher_patch_size(teacher: torch.nn.Module) -> int:
    patch = teacher.config.patch_size
    return patch[0] if isinstance(patch, (tuple, list)) else patch


def teacher_input(pixel_values: torch.Tensor, teacher_patch: int, student_patch: int) -> torch.Tensor:
    """The image the teacher sees so that its patch grid equals the student's: resized by teacher / student patch
    (bicubic), unchanged when the patch sizes agree."""
    if teacher_patch == student_patch:
        return pixel_values
    height, width = (s // student_patch * teacher_patch for s in pixel_values.shape[-2:])
    return F.interpolate(pixel_values, size=(height, width), mode="bicubic", align_corners=False, antialias=True)


@torch.no_grad()
def teacher_targets(
    teacher, pixel_values: torch.Tensor, grid: tuple[int, int], check_finite: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """CLS (B, D) and patch tokens (B, Hp * Wp, D) of the teacher's final (normalised) output; a ValueError when its
    tokens do not fill the grid, or with `check_finite` when it holds NaN or infinity (a read on the host: a training
    loop leaves that to its guard on the loss, which reads on logging steps only)."""
    output = teacher(pixel_values)
    if check_finite:
        check_output_finite(output.last_hidden_state, f"The teacher {type(teacher).__name__}'s output")
    num_prefix = 1 + (getattr(teacher.config, "num_register_tokens", 0) or 0)
    return output.last_hidden_state[:, 0].float(), patch_tokens(output, grid, num_prefix).float()


# ---------------------------------------------------------------- cost


def model_flops(config, resolution: int, budget_name: str, budget) -> int:
    """Analytic FLOPs of one VECA or LookWhere forward on a `resolution` x `resolution` image at this budget."""
    if config.model_type == "veca":
        return veca_flops(config, resolution, num_cores=budget)
    return lookwhere_flops(config, resolution, **{budget_name: budget})


def teacher_flops(teacher, height: int, width: int) -> int:
    """Dense-ViT FLOPs of the teacher: DINOv3 names its MLP width, DINOv2 gives a ratio (SwiGLU: 2/3 of it,
    rounded up to a multiple of 8, as DINOv2 builds it)."""
    teacher_config = teacher.config
    gated = bool(getattr(teacher_config, "use_gated_mlp", False) or getattr(teacher_config, "use_swiglu_ffn", False))
    mlp_width = getattr(teacher_config, "intermediate_size", None)
    if mlp_width is None:
        mlp_width = int(teacher_config.hidden_size * teacher_config.mlp_ratio)
        if gated:
            mlp_width = (mlp_width * 2 // 3 + 7) // 8 * 8
    return dense_vit_flops(
        height,
        width,
        hidden_size=teacher_config.hidden_size,
        num_hidden_layers=teacher_config.num_hidden_layers,
        intermediate_size=mlp_width,
        patch_size=teacher_patch_size(teacher),
        num_prefix_tokens=1 + getattr(teacher_config, "num_register_tokens", 0),
        gated_mlp=gated,
    )


def cost_entry(flops: int, latency: dict, batch_size: int) -> dict:
    """One budget's cost at one size: GFLOPs, the median latency and its IQR (`corevision_hf.measure.spread_ms`),
    throughput, and room for the peak memory."""
    return {
        "gflops": flops / 1e9,
        "latency_ms": latency["latency_ms"],
        "latency_iqr_ms": latency["latency_iqr_ms"],
        "latency_runs": latency["runs"],
        "throughput_images_per_s": 1e3 * batch_size / latency["latency_ms"],
        "peak_memory_mib": None,
    }


# ---------------------------------------------------------------- agreement


@torch.inference_mode()
def features(model, images: torch.Tensor, budget: dict, batch_size: int, device: str, dtype) -> tuple:
    """Pooled output (N, D) and patch tokens (N, Hp * Wp, D) of a frozen model, in float32 on the CPU; a ValueError
    when the model's output holds NaN or infinity."""
    grid = (images.shape[-2] // model.config.patch_size, images.shape[-1] // model.config.patch_size)
    pooled, patches = [], []
    for start in range(0, len(images), batch_size):
        output = model(images[start : start + batch_size].to(device, dtype), **budget)
        check_output_finite(output.last_hidden_state, f"{type(model).__name__}'s output at {budget or 'its budget'}")
        pooled.append(output.pooler_output.float().cpu())
        patches.append(patch_tokens(output, grid).float().cpu())
    return torch.cat(pooled), torch.cat(patches)


def per_image_agreement(
    pooled: torch.Tensor, patches: torch.Tensor, targets: tuple, centre: tuple | None = None
) -> dict[str, torch.Tensor]:
    """Each image's agreement with the teacher: {"cls_cosine": (N,), "patch_cosine": (N,)}, the patch cosine averaged
    over the patches.

    With `centre` = (mean CLS token (D,), mean patch token (D,)) of the teacher over the training crops, also the
    measures the mean token cannot win, the centre subtracted from both sides:
    - "cls_centred_cosine", "patch_centred_cosine": cosine of (student - centre) and (teacher - centre); a predictor
      that outputs the centre scores 0 (a zero vector's cosine is 0);
    - "patch_r2": 1 - SSE / SST over the image's patches and dimensions, SST the teacher's squared distance to the
      centre (R^2 with the variance-weighted average over dimensions); the centre scores exactly 0, the teacher 1;
    - "cls_sse", "cls_sst", "patch_sse", "patch_sst": the sums behind R^2, to pool over images (`r_squared`): CLS R^2
      exists for a set of images only, 1 - sum(cls_sse) / sum(cls_sst).
    """
    teacher_cls, teacher_patches = targets
    result = {
        "cls_cosine": F.cosine_similarity(pooled, teacher_cls, dim=-1),
        "patch_cosine": F.cosine_similarity(patches, teacher_patches, dim=-1).mean(-1),
    }
    if centre is None:
        return result
    cls_centre, patch_centre = (c.to(pooled.device, pooled.dtype) for c in centre)
    student_cls, student_patches = pooled - cls_centre, patches - patch_centre
    target_cls, target_patches = teacher_cls - cls_centre, teacher_patches - patch_centre
    result["cls_centred_cosine"] = F.cosine_similarity(student_cls, target_cls, dim=-1)
    result["patch_centred_cosine"] = F.cosine_similarity(student_patches, target_patches, dim=-1).mean(-1)
    result["cls_sse"] = (pooled - teacher_cls).square().sum(-1)
    result["cls_sst"] = target_cls.square().sum(-1)
    result["patch_sse"] = (patches - teacher_patches).square().sum((-2, -1))
    result["patch_sst"] = target_patches.square().sum((-2, -1))
    result["patch_r2"] = r_squared(result["patch_sse"], result["patch_sst"])
    return result


def r_squared(sse: torch.Tensor, sst: torch.Tensor) -> torch.Tensor:
    """1 - sse / sst, elementwise (0 where sst is 0: a teacher at the centre leaves nothing to explain)."""
    return torch.where(sst > 0, 1 - sse / sst.clamp_min(torch.finfo(sst.dtype).tiny), torch.zeros_like(sst))


CENTRED_MEASURES = ("cls_centred_cosine", "patch_centred_cosine", "patch_r2")


def agreement(pooled: torch.Tensor, patches: torch.Tensor, targets: tuple, centre: tuple | None = None) -> dict:
    """Mean CLS and patch cosine to the teacher over the images, their standard deviation over the images (`_std`)
    and the standard error of the mean, std / sqrt(images) (`_se`); a patch cosine per image is its mean over
    patches; both spreads are None with a single image. With `centre` (see `per_image_agreement`) also the centred
    cosines and patch R^2 with their spreads, and "cls_r2" over the set of images (no spread)."""
    result = {}
    values = per_image_agreement(pooled, patches, targets, centre)
    for name in ("cls_cosine", "patch_cosine", *(CENTRED_MEASURES if centre is not None else ())):
        result[name] = values[name].mean().item()
        std = values[name].std().item() if len(values[name]) > 1 else None
        result[name + "_std"] = std
        result[name + "_se"] = None if std is None else std / len(values[name]) ** 0.5
    if centre is not None:
        result["cls_r2"] = r_squared(values["cls_sse"].sum(), values["cls_sst"].sum()).item()
    return result
