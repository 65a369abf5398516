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


def lookwhere_flops(config, height: int, width: int | None = None, k: int | None = None, k_ratio: float | None = None) -> int:
    """FLOPs of one `LookWhereModel` forward: the selector (a `selector_depth`-block ViT on the low-resolution copy,
    plus its map head) and the extractor (a full-depth ViT on 1 + registers + k tokens). The dense fill is not
    counted (a few MFLOPs)."""
    num_patches = _grid(height, width, config.patch_size)
    if k is None:
        k = max(1, int((config.k_ratio if k_ratio is None else k_ratio) * num_patches))
    vit = dict(
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        patch_size=config.patch_size,
        num_prefix_tokens=1 + config.num_register_tokens,
        num_channels=config.num_channels,
    )
    selector = dense_vit_flops(config.selector_image_size, num_hidden_layers=config.selector_depth, **vit)
    selector_patches = (config.selector_image_size // config.patch_size) ** 2
    d, r, m = config.hidden_size, config.map_head_ratio, config.map_upsampling
    map_head = 2 * selector_patches * (d * r * d + r * d * m * m)
    # The extractor embeds only its k patches: a dense ViT over k "patches" costs exactly that.
    tokens = k + 1 + config.num_register_tokens
    d, h = config.hidden_size, config.intermediate_size
    per_layer = 8 * tokens * d * d + 4 * d * tokens * tokens + 4 * tokens * d * h
    extractor = config.num_hidden_layers * per_layer + 2 * k * d * config.num_channels * config.patch_size**2
    return selector + map_head + extractor
