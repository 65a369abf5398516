"""A VECA student initialised from a pretrained ViT teacher, DINOv2 or DINOv3 (`veca_from_teacher`)."""

import difflib
import inspect
import re

import torch
from transformers import PreTrainedModel

from ..veca import VecaConfig, VecaModel
from ..veca.modeling_veca import resize_position_table
from .dinov2_teacher import refuse_missing_weights

# Teacher class -> its column in TEACHER_NAMES.
FAMILIES = {"Dinov2Model": 0, "Dinov2WithRegistersModel": 0, "DINOv3ViTModel": 1}

# VECA module -> the teacher's (DINOv2, DINOv3) module whose weight and bias it takes; {i} is a block index.
TEACHER_NAMES = {
    "embeddings.patch_embeddings.projection": ("embeddings.patch_embeddings.projection", "embeddings.patch_embeddings"),
    "encoder.layers.{i}.norm1": ("encoder.layer.{i}.norm1", "model.layer.{i}.norm1"),
    "encoder.layers.{i}.attention.q_proj": ("encoder.layer.{i}.attention.q_proj", "model.layer.{i}.attention.q_proj"),
    "encoder.layers.{i}.attention.k_proj": ("encoder.layer.{i}.attention.k_proj", "model.layer.{i}.attention.k_proj"),
    "encoder.layers.{i}.attention.v_proj": ("encoder.layer.{i}.attention.v_proj", "model.layer.{i}.attention.v_proj"),
    "encoder.layers.{i}.attention.o_proj": ("encoder.layer.{i}.attention.o_proj", "model.layer.{i}.attention.o_proj"),
    "encoder.layers.{i}.norm2": ("encoder.layer.{i}.norm2", "model.layer.{i}.norm2"),
    "encoder.layers.{i}.mlp.fc1": ("encoder.layer.{i}.mlp.fc1", "model.layer.{i}.mlp.up_proj"),
    "encoder.layers.{i}.mlp.fc2": ("encoder.layer.{i}.mlp.fc2", "model.layer.{i}.mlp.down_proj"),
    "norm": ("layernorm", "norm"),
}

# VECA has no LayerScale: the teacher's scales of the attention and MLP outputs are folded into the projections' rows.
LAYER_SCALES = {"attention.o_proj": "layer_scale1.lambda1", "mlp.fc2": "layer_scale2.lambda1"}

# With `mlp_type="swiglu"` (an override; the copy's MLP is plain by default, the teacher's exactly), the teacher's GELU
# MLP in VECA's SwiGLU (fc1 = [u ; v], silu(u) * v): u = GELU_SCALE * the teacher's fc1 and v = 1 / GELU_SCALE give
# u * sigmoid(GELU_SCALE * u), the sigmoid approximation of GELU (within 0.021 everywhere).
GELU_SCALE = 1.702

# Fields of the VecaConfig that are the teacher's shapes: an override would leave nothing to copy.
TEACHER_SHAPES = ("hidden_size", "num_attention_heads", "intermediate_size", "patch_size", "num_channels")

# The projections DINOv3 rotates (RoPE), whose rows are reordered per head for VECA's RoPE (`rope_permutation`).
ROTATED = ("attention.q_proj", "attention.k_proj")


def veca_from_teacher(teacher: PreTrainedModel, **config_overrides) -> VecaModel:
    """A VECA student to distil, initialised from a transformers `Dinov2Model`, `Dinov2WithRegistersModel` or
    `DINOv3ViTModel` (plain MLP): the teacher's width, depth, heads, MLP (plain, with its activation), patch size and
    norm epsilon; its patch embedding, norms, attention projections and MLP copied by `TEACHER_NAMES` (LayerScale folded
    into the output projections). Positions as the teacher's: DINOv2's learned table (its CLS slot dropped) is the
    student's `position_embedding_grid` table; DINOv3's RoPE base is the student's, no frequency zeroed, and the q / k
    rows of each head are reordered (`rope_permutation`) so that VECA's RoPE gives DINOv3's rotated q . k. The core bank
    and coordinate heads are new; the teacher's CLS and register tokens have no place in VECA (cores).
    `config_overrides` (VecaConfig fields other than `TEACHER_SHAPES`; fewer `num_hidden_layers` copies the first
    blocks; `mlp_type="swiglu"` maps the MLP as `GELU_SCALE` says) win. The config's `init_from_teacher` records the
    teacher and the parameters copied, new and left out. Returns the model in the teacher's dtype."""
    family = FAMILIES.get(type(teacher).__name__)
    if family is None:
        raise ValueError(f"veca_from_teacher supports transformers {', '.join(FAMILIES)} teachers, got "
                         f"{type(teacher).__name__}.")
    teacher_config = teacher.config
    if getattr(teacher_config, "use_swiglu_ffn", False) or getattr(teacher_config, "use_gated_mlp", False):
        raise ValueError("veca_from_teacher supports teachers with a plain GELU MLP, not SwiGLU / gated ones "
                         "(use_swiglu_ffn / use_gated_mlp); start from scratch or from a smaller DINO.")
    refuse_missing_weights(teacher)
    check_overrides(config_overrides)
    meta = next((name for name, tensor in teacher.state_dict().items() if tensor.is_meta), None)
    if meta is not None:
        raise ValueError(f"The teacher's weights are on the meta device ({meta}, ...): it was built without them (e.g. "
                         "under init_empty_weights); load it with from_pretrained on a real device (cpu, cuda) first.")
    teacher_state = {name: tensor.float() for name, tensor in teacher.state_dict().items()}  # folded in float32
    config = student_config(teacher_config, teacher_state, family, config_overrides)
    if config.mlp_type == "swiglu" and not str(teacher_config.hidden_act).startswith("gelu"):
        raise ValueError(f"veca_from_teacher maps a GELU MLP into VECA's SwiGLU; this teacher's is "
                         f"{teacher_config.hidden_act!r}: keep mlp_type='plain'.")
    model = VecaModel(config)
    state, copied, used = teacher_weights(teacher_state, family, model.state_dict(), config,
                                          min(config.num_hidden_layers, teacher_config.num_hidden_layers))
    used.update(teacher_positions(teacher_state, config, state, copied))
    model.load_state_dict(state)
    config.init_from_teacher = {
        "teacher": teacher_config._name_or_path or type(teacher).__name__,
        "model_type": teacher_config.model_type,
        "copied": layer_patterns(copied),
        "new": layer_patterns(name for name, _ in model.named_parameters() if name not in copied),
        "left_out": layer_patterns(name for name in teacher_state if name not in used),
    }
    return model.to(next(teacher.parameters()).dtype)


def student_config(teacher_config, teacher_state: dict, family: int, config_overrides: dict) -> VecaConfig:
    """The student's config: the teacher's shapes, its MLP (plain, its activation) and its positions (DINOv2: its
    table's grid and resize; DINOv3: its RoPE base, no frequency zeroed), then `config_overrides`."""
    teacher_size = teacher_config.image_size  # DINOv2's and DINOv3's configs hold an int (a pair in some others)
    image_size = config_overrides.get("image_size", teacher_size if isinstance(teacher_size, int) else teacher_size[0])
    check_image_size(image_size, teacher_config.patch_size, "image_size" in config_overrides)
    mlp_out = TEACHER_NAMES["encoder.layers.{i}.mlp.fc2"][family].format(i=0)
    fields = {
        "hidden_size": teacher_config.hidden_size,
        "num_hidden_layers": teacher_config.num_hidden_layers,
        "num_attention_heads": teacher_config.num_attention_heads,
        "intermediate_size": teacher_state[mlp_out + ".weight"].shape[1],  # DINOv2's is width * mlp_ratio
        "mlp_type": "plain",
        "hidden_act": teacher_config.hidden_act,
        "patch_size": teacher_config.patch_size,
        "num_channels": teacher_config.num_channels,
        "image_size": image_size,
        "layer_norm_eps": teacher_config.layer_norm_eps,
    }
    if family == 1:  # DINOv3's RoPE has VECA's periods and patch centres, and zeroes no frequency
        fields.update(rope_theta=teacher_config.rope_theta, rope_zero_fraction=0.0)
    else:  # (1, 1 + G * G, D): the CLS slot first; transformers resizes DINOv2-with-registers tables with antialiasing
        table_size = teacher_state["embeddings.position_embeddings"].shape[1] - 1
        fields.update(position_embedding_grid=int(table_size**0.5),
                      position_embedding_antialias=teacher_config.model_type == "dinov2_with_registers")
    return VecaConfig(**{**fields, **config_overrides})


def rope_permutation(head_dim: int) -> torch.Tensor:
    """(head_dim,) indices: the i-th is the DINOv3 head dimension that VECA's dimension i takes. DINOv3 rotates
    dimension j with j + head_dim / 2 (rotate-half), y frequencies in j < head_dim / 4, x frequencies next; VECA
    rotates (2p, 2p + 1), x frequencies in p < head_dim / 4, y next; both as (real, imaginary) per frequency."""
    half, quarter = head_dim // 2, head_dim // 4
    first = (torch.arange(half) + quarter) % half  # VECA's pair p is DINOv3's pair (p + head_dim / 4) mod head_dim / 2
    return torch.stack([first, first + half], dim=1).flatten()


def teacher_positions(teacher_state: dict, config: VecaConfig, state: dict, copied: list) -> list[str]:
    """DINOv2's learned patch positions (its CLS slot dropped) into `state` as the student's table, resized to the
    config's grid if it is another; returns the teacher names used (none for a teacher or student without a table)."""
    positions = teacher_state.get("embeddings.position_embeddings")
    if positions is None or not config.position_embedding_grid:
        return []
    grid = (config.position_embedding_grid,) * 2
    state["embeddings.position_embeddings"] = resize_position_table(positions[:, 1:], grid,
                                                                    config.position_embedding_antialias)
    copied.append("embeddings.position_embeddings")
    return ["embeddings.position_embeddings"]


def check_overrides(config_overrides: dict) -> None:
    """Raises one ValueError for override keys that are the teacher's shapes or no VecaConfig field (a misspelling
    would otherwise become a stray config attribute), naming them, a close field and the fields it takes."""
    fixed = [name for name in TEACHER_SHAPES if name in config_overrides]
    if fixed:
        raise ValueError(f"veca_from_teacher takes {fixed} from the teacher: drop them from the overrides.")
    fields = [name for name in inspect.signature(VecaConfig.__init__).parameters
              if name not in ("self", "kwargs", *TEACHER_SHAPES)]
    unknown = [name for name in config_overrides if name not in fields]
    if unknown:
        close = {name: difflib.get_close_matches(name, fields, n=1) for name in unknown}
        named = ", ".join(f"{name!r}" + (f" (did you mean {close[name][0]!r}?)" if close[name] else "")
                          for name in unknown)
        raise ValueError(f"veca_from_teacher got override(s) that are no VecaConfig field: {named}. It takes "
                         f"{', '.join(fields)}.")


def check_image_size(image_size, patch_size: int, overridden: bool) -> None:
    """Raises ValueError unless `image_size` is a positive multiple of the teacher's `patch_size`."""
    if isinstance(image_size, int) and not isinstance(image_size, bool) and image_size > 0 \
            and image_size % patch_size == 0:
        return
    number = isinstance(image_size, (int, float)) and not isinstance(image_size, bool)
    near = patch_size * max(1, round(image_size / patch_size)) if number else 16 * patch_size
    source = "the override image_size" if overridden else "the teacher's image_size"
    raise ValueError(f"{source} is {image_size!r}: VECA needs a positive multiple of the teacher's patch size "
                     f"{patch_size}; pass image_size={near} (or another multiple of {patch_size}).")


def teacher_weights(
    teacher_state: dict, family: int, student_state: dict, config: VecaConfig, depth: int
) -> tuple[dict, list, set]:
    """The student's state dict with the teacher's tensors in place for the first `depth` blocks; returns it, the
    student names copied and the teacher names used."""
    state, copied, used = dict(student_state), [], set()
    head_dim, swiglu = config.hidden_size // config.num_attention_heads, config.mlp_type == "swiglu"
    for student_module, teacher_modules in TEACHER_NAMES.items():
        for i in range(depth) if "{i}" in student_module else [None]:
            target, source = student_module.format(i=i), teacher_modules[family].format(i=i)
            scale_name = next((s for m, s in LAYER_SCALES.items() if target.endswith(m)), None)
            scale = teacher_state[source.rsplit(".", 2)[0] + "." + scale_name] if scale_name else None
            for part in ("weight", "bias"):
                value = teacher_state.get(source + "." + part)
                if value is None and swiglu and target.endswith("mlp.fc1") and part == "bias":  # v's bias is needed
                    value = teacher_state[source + ".weight"].new_zeros(teacher_state[source + ".weight"].shape[0])
                elif value is None:  # e.g. DINOv3's k_proj has no bias: VECA's stays 0
                    continue
                if scale is not None:
                    value = value * (scale[:, None] if part == "weight" else scale)
                if family == 1 and target.endswith(ROTATED):  # DINOv3's rotate-half pairs -> VECA's (even, odd)
                    value = value.unflatten(0, (-1, head_dim))[:, rope_permutation(head_dim)].flatten(0, 1)
                if swiglu and target.endswith("mlp.fc1"):  # [u ; v]: u = GELU_SCALE x the teacher's, v = 1 / GELU_SCALE
                    gate = torch.zeros_like(value) if part == "weight" else torch.full_like(value, 1 / GELU_SCALE)
                    value = torch.cat([GELU_SCALE * value, gate])
                if value.shape != state[target + "." + part].shape:
                    raise ValueError(f"Teacher weight {source}.{part} {tuple(value.shape)} does not fit VECA's "
                                     f"{target}.{part} {tuple(state[target + '.' + part].shape)}.")
                state[target + "." + part] = value
                copied.append(target + "." + part)
                if source + "." + part in teacher_state:
                    used.add(source + "." + part)
            if scale is not None:
                used.add(source.rsplit(".", 2)[0] + "." + scale_name)
    return state, copied, used


def layer_patterns(names) -> list[str]:
    """Parameter names with block indices as "*", each once, in order: encoder.layers.*.norm1.weight."""
    return list(dict.fromkeys(re.sub(r"\.\d+\.", ".*.", name) for name in names))


__all__ = ["veca_from_teacher"]
