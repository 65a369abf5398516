"""Distillation losses. Each returns the total loss and the named quantities it is made of, for logging under names
that say what they hold (a cosine similarity as `*_cosine`, a mean squared error as `*_mse`, a KL as `*_kl`)."""

import torch
import torch.nn.functional as F


def veca_loss(
    student_cls: torch.Tensor,
    student_patches: torch.Tensor,
    teacher_cls: torch.Tensor,
    teacher_patches: torch.Tensor,
    dense_weight: float = 1.0,
    mse_weight: float = 1.0,
) -> tuple[torch.Tensor, dict]:
    """(1 - cos) on CLS (B, D) + dense_weight * [(1 - cos) + mse_weight * MSE] on patches (B, N, D). Terms: the mean
    CLS and patch cosine similarities (1 is perfect agreement) and the patch MSE."""
    cls_cosine = F.cosine_similarity(student_cls.float(), teacher_cls, dim=-1).mean()
    patch_cosine = F.cosine_similarity(student_patches.float(), teacher_patches, dim=-1).mean()
    patch_mse = F.mse_loss(student_patches.float(), teacher_patches)
    total = (1 - cls_cosine) + dense_weight * ((1 - patch_cosine) + mse_weight * patch_mse)
    return total, {"cls_cosine": cls_cosine, "patch_cosine": patch_cosine, "patch_mse": patch_mse}


def lookwhere_loss(
    student_cls: torch.Tensor,
    student_dense: torch.Tensor,
    selector_map: torch.Tensor,
    teacher_cls: torch.Tensor,
    teacher_patches: torch.Tensor,
    teacher_map: torch.Tensor,
    cls_weight: float = 1.0,
    patch_weight: float = 1.0,
    map_weight: float = 0.1,
) -> tuple[torch.Tensor, dict]:
    """What-where distillation: MSE on CLS (B, D), MSE on the filled dense patches (B, N, D), and
    KL(softmax(teacher map) || softmax(selector map)) summed over the N patches, averaged over images."""
    cls_mse = F.mse_loss(student_cls.float(), teacher_cls)
    patch_mse = F.mse_loss(student_dense.float(), teacher_patches)
    map_kl = F.kl_div(
        F.log_softmax(selector_map.float(), dim=-1), F.log_softmax(teacher_map, dim=-1), log_target=True,
        reduction="batchmean",
    )
    total = cls_weight * cls_mse + patch_weight * patch_mse + map_weight * map_kl
    return total, {"cls_mse": cls_mse, "patch_mse": patch_mse, "map_kl": map_kl}
