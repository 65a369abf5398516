"""A LookWhere student initialised from its DINOv2 teacher, as the method prescribes (`lookwhere_from_teacher`)."""

import torch
from transformers import PreTrainedModel

from ..lookwhere import LookWhereConfig, LookWhereModel
from ..lookwhere.modeling_lookwhere import resize_position_table


def lookwhere_from_teacher(teacher: PreTrainedModel, **config_overrides) -> LookWhereModel:
    """A LookWhere student to distil, initialised from a transformers `Dinov2WithRegistersModel` or `Dinov2Model` as
    the method prescribes: the extractor is a copy of the teacher, the selector its first `selector_depth` blocks (with
    the position table resized to the selector's grid); the map head starts random. Its selector map is resized with
    antialiasing (`selector_map_antialias=True`, the authors' JAX training numerics), so that every cell of the map
    head's fine map gets a gradient at any training size; `config_overrides` (any LookWhereConfig field) win."""
    teacher_config = teacher.config
    if getattr(teacher_config, "use_swiglu_ffn", False):
        raise ValueError("lookwhere_from_teacher supports DINOv2 teachers with a plain MLP (use_swiglu_ffn=False).")
    refuse_missing_weights(teacher)
    teacher_state = {k.removeprefix(teacher.base_model_prefix + "."): v for k, v in teacher.state_dict().items()}
    if "embeddings.position_embeddings" not in teacher_state:
        raise ValueError(
            f"lookwhere_from_teacher expects a transformers Dinov2Model or Dinov2WithRegistersModel, got {type(teacher).__name__}."
        )
    positions = teacher_state["embeddings.position_embeddings"]  # (1, 1 + G * G, D): CLS slot first
    config = student_config(teacher_config, int((positions.shape[1] - 1) ** 0.5), config_overrides)
    model = LookWhereModel(config)
    missing, unexpected = model.load_state_dict(student_state(teacher_state, config), strict=False)
    if unexpected or any(not name.startswith("selector.map_head.") for name in missing):
        raise ValueError(f"Teacher weights did not map cleanly: missing {missing}, unexpected {unexpected}.")
    return model.to(next(teacher.parameters()).dtype)


def student_config(teacher_config, grid_size: int, config_overrides: dict) -> LookWhereConfig:
    """The student's config: the teacher's architecture at its training grid (`grid_size` patches per side), the
    default selector grid, antialiasing as the teacher's and the authors' training; `config_overrides` win."""
    return LookWhereConfig(
        **{
            "hidden_size": teacher_config.hidden_size,
            "num_hidden_layers": teacher_config.num_hidden_layers,
            "num_attention_heads": teacher_config.num_attention_heads,
            "intermediate_size": int(teacher_config.hidden_size * teacher_config.mlp_ratio),
            "hidden_act": teacher_config.hidden_act,
            "patch_size": teacher_config.patch_size,
            "num_channels": teacher_config.num_channels,
            "num_register_tokens": getattr(teacher_config, "num_register_tokens", 0),
            "layerscale_value": teacher_config.layerscale_value,
            "layer_norm_eps": teacher_config.layer_norm_eps,
            "qkv_bias": teacher_config.qkv_bias,
            "image_size": grid_size * teacher_config.patch_size,
            # the default selector grid (11 x 11 patches, 154 px at patch 14) at the teacher's patch size
            "selector_image_size": LookWhereConfig().selector_grid_size * teacher_config.patch_size,
            # transformers resizes DINOv2-with-registers position tables with antialiasing, DINOv2's without
            "interpolate_antialias": teacher_config.model_type == "dinov2_with_registers",
            # without it, a shrink (e.g. 40 x 40 to 8 x 8) reads only the centre cells of the map head's fine map
            "selector_map_antialias": True,
            **config_overrides,
        }
    )


def teacher_block(teacher_state: dict, prefix: str, layer: int) -> dict:
    """The teacher's block `layer` under the student's names, each prefixed with `prefix`."""
    t = f"encoder.layer.{layer}."
    weights = {
        name: teacher_state[t + name]
        for name in ("norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias", "mlp.fc1.weight",
                     "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias")
    }
    weights["layer_scale1.lambda1"] = teacher_state[t + "layer_scale1.lambda1"]
    weights["layer_scale2.lambda1"] = teacher_state[t + "layer_scale2.lambda1"]
    for name in (f"{projection}_proj.{part}" for projection in "qkvo" for part in ("weight", "bias")):
        if t + "attention." + name in teacher_state:  # q / k / v biases only with qkv_bias
            weights["attention." + name] = teacher_state[t + "attention." + name]
    return {f"{prefix}.{name}": value for name, value in weights.items()}


def student_state(teacher_state: dict, config: LookWhereConfig) -> dict:
    """The student's weights from the teacher's (the map head aside): the extractor a copy of the teacher, the
    selector its first `selector_depth` blocks, with the position table resized to the selector's grid."""
    positions = teacher_state["embeddings.position_embeddings"]
    state = {}
    for part in ("selector", "extractor"):
        for name in ("weight", "bias"):
            state[f"{part}.embeddings.patch_embeddings.projection.{name}"] = teacher_state[
                f"embeddings.patch_embeddings.projection.{name}"]
            state[f"{part}.norm.{name}"] = teacher_state[f"layernorm.{name}"]
    for layer in range(config.num_hidden_layers):
        state.update(teacher_block(teacher_state, f"extractor.layers.{layer}", layer))
    for layer in range(config.selector_depth):
        state.update(teacher_block(teacher_state, f"selector.layers.{layer}", layer))
    patch_positions = positions[:, 1:]
    state["extractor.embeddings.position_embeddings"] = patch_positions
    g = config.selector_grid_size
    selector = {
        "position_embeddings": resize_position_table(patch_positions, (g, g), config.interpolate_antialias),
        "cls_token": teacher_state["embeddings.cls_token"] + positions[:, :1],
        "register_tokens": teacher_state.get("embeddings.register_tokens", torch.zeros(1, 0, config.hidden_size)),
    }
    state.update({f"selector.embeddings.{name}": value for name, value in selector.items()})
    if config.extractor_prefix == "extractor":  # the extractor's own global tokens: the teacher's
        state["extractor.embeddings.prefix_tokens"] = torch.cat([selector["cls_token"], selector["register_tokens"]], 1)
    return state


def refuse_missing_weights(teacher: PreTrainedModel) -> None:
    """Raises ValueError when `teacher` was loaded from a checkpoint that lacks some of its weights."""
    # from_pretrained marks what it loaded; unmarked tensors of a loaded teacher were missing and are random.
    loaded = {name: getattr(p, "_is_hf_initialized", False) for name, p in teacher.named_parameters()}
    if any(loaded.values()) and not all(loaded.values()):
        missing = sorted(name for name, was_loaded in loaded.items() if not was_loaded)
        raise ValueError(
            f"The teacher's checkpoint lacks {missing} (randomly initialised by from_pretrained); load the "
            "checkpoint with the class it was saved from (e.g. Dinov2Model for a DINOv2 checkpoint without registers)."
        )


__all__ = ["lookwhere_from_teacher"]
