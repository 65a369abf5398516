"""Analytic forward FLOPs (a multiply-add counts 2), for cost tables and achieved-GFLOP/s figures.

Counted: patch embedding, projections, attention score and value products, MLPs. Not counted: norms,
activations, RoPE, softmax and other element-wise work (a few percent at most).
"""


def _grid(height: int, width: int | None, patch_size: int) -> int:
    width = height if width is None else width
    return (height // patch_size) * (width // patch_size)


def veca_flops(config, height: int, width: int | None = None, num_cores: int | None = None) -> int:
    """FLOPs of one `VecaModel` forward on one image of `height` x `width` (square if width is None)
    with `num_cores` active cores (default: the whole bank). Per layer, with L = N + C tokens:
    projections 8 L d^2, attention 4 d (C^2 + 2 N C), SwiGLU MLP 6 L d h."""
    d, h = config.hidden_size, config.intermediate_size
    num_patches = _grid(height, width, config.patch_size)
    cores = config.num_cores if num_cores is None else num_cores
    tokens = num_patches + cores
    per_layer = 8 * tokens * d * d + 4 * d * (cores * cores + 2 * num_patches * cores) + 6 * tokens * d * h
    coordinate_heads = (config.num_hidden_layers - 1) * 2 * cores * d * 2
    patch_embedding = 2 * num_patches * d * config.num_channels * config.patch_size**2
    output_projection = 2 * tokens * d * (config.output_projection_size or 0)
    return config.num_hidden_layers * per_layer + coordinate_heads + patch_embedding + output_projection


def dense_vit_flops(
    height: int,
    width: int | None = None,
    *,
    hidden_size: int,
    num_hidden_layers: int,
    intermediate_size: int,
    patch_size: int,
    num_prefix_tokens: int = 1,
    gated_mlp: bool = False,
    num_channels: int = 3,
) -> int:
    """FLOPs of a dense ViT forward (DINOv2 / DINOv3 style, every token attends to every token).
    Per layer, with L = N + prefix tokens: projections 8 L d^2, attention 4 d L^2, MLP 4 L d h (6 L d h gated)."""
    d = hidden_size
    num_patches = _grid(height, width, patch_size)
    tokens = num_patches + num_prefix_tokens
    mlp = (6 if gated_mlp else 4) * tokens * d * intermediate_size
    per_layer = 8 * tokens * d * d + 4 * d * tokens * tokens + mlp
    return num_hidden_layers * per_layer + 2 * num_patches * d * num_channels * patch_size**2
