"""Convert a checkpoint of the authors' reference VECA code into a hub folder.

    python -m corevision_hf.convert.veca REFERENCE.pt OUT_DIR [--num-attention-heads N] [--preset base] [--force]

The checkpoint is loaded with `weights_only=True` (never unpickled as code). It is either what the reference
training code writes (a dict with the weights under "student" and its settings under "config") or a bare state
dict, optionally behind `student.` / `module.` / `_orig_mod.` prefixes. Sizes come from the tensor shapes; the
settings shapes cannot show (head count, RoPE zero-frequency fraction and side, trained budgets, ...) come from the
checkpoint's "config" and, without one, from the command line: a head count that cannot be known is an error, never
a guess. The reference uses our RoPE convention (interleaved pairs, x block then y block) and PyTorch's default
LayerNorm eps 1e-5, which the converted config records.
"""

import argparse
import re
import sys

import torch

from corevision_hf.cli import HelpFormatter
from corevision_hf import VECA_PRESETS, VecaConfig, VecaModel
from corevision_hf.cli import run
from corevision_hf.convert.common import (
    WRAPPER_PREFIXES,
    check_finite,
    check_converted_keys,
    check_out_dir,
    load_tensor_checkpoint,
    save_converted,
    strip_wrapper_prefixes,
)


# One-to-one renames, reference -> ours; `{l}` is a layer index. The core bank and the alphas are merged below.
RENAMES = [
    ("patch_embed.proj.", "embeddings.patch_embeddings.projection."),
    ("patch_embed.norm.", "embeddings.patch_embeddings.norm."),
    ("pos_linears.{l}.", "encoder.coordinate_heads.{l}.proj."),
    ("blocks.{l}.norm_attn.", "encoder.layers.{l}.norm1."),
    ("blocks.{l}.attn.q_proj.", "encoder.layers.{l}.attention.q_proj."),
    ("blocks.{l}.attn.k_proj.", "encoder.layers.{l}.attention.k_proj."),
    ("blocks.{l}.attn.v_proj.", "encoder.layers.{l}.attention.v_proj."),
    ("blocks.{l}.attn.out_proj.", "encoder.layers.{l}.attention.o_proj."),
    ("blocks.{l}.norm_ffn.", "encoder.layers.{l}.norm2."),
    ("blocks.{l}.fc1.", "encoder.layers.{l}.mlp.fc1."),  # same layout: first half u, second half v
    ("blocks.{l}.fc2.", "encoder.layers.{l}.mlp.fc2."),
    ("final_norm.", "norm."),
    ("output_proj.", "output_projection."),
]
_RENAME_PATTERNS = [(re.compile(re.escape(ref).replace(r"\{l\}", r"(\d+)")), ours) for ref, ours in RENAMES]

# What the reference code fixes rather than configures: base 100 RoPE, PyTorch's default LayerNorm eps.
REFERENCE_CONSTANTS = {"rope_theta": 100.0, "layer_norm_eps": 1e-5}
# Reference config entries -> our config fields, for the settings the tensor shapes cannot show.
REFERENCE_SETTINGS = {
    "num_heads": "num_attention_heads",
    "rope_p_zero_freqs": "rope_zero_fraction",
    "rope_zero_freqs_from": "rope_zero_from",
    "rope_shift_coords": "pos_embed_shift",
    "rope_rescale_coords": "pos_embed_rescale",
    "nested_budgets": "training_budgets",
    "nested_budget_weights": "training_budget_weights",
    "image_size": "image_size",
    "fps_pool_size": "core_coordinate_init_candidates",
    "fps_coord_range": "core_coordinate_init_range",
    "dropout": "hidden_dropout_prob",
}
# Reference config entries that the shapes also show: checked against them.
REFERENCE_SHAPES = {
    "hidden_dim": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_query_tokens": "num_cores",
    "patch_size": "patch_size",
    "in_channels": "num_channels",
    "patch_embed_use_ln": "patch_embedding_norm",
}
# The reference's defaults for what a bare state dict cannot say; used only when told so (see `assumed`).
REFERENCE_DEFAULTS = {"rope_zero_fraction": 0.125, "rope_zero_from": "low"}
REFERENCE_CHUNK = 8  # the reference stores the bank in chunks of 8 and trains budgets that are multiples of it


def load_reference_checkpoint(path: str) -> tuple[dict[str, torch.Tensor], dict | None]:
    """The reference weights at `path` and the reference config stored with them (None for a bare state dict)."""
    checkpoint = load_tensor_checkpoint(path, "e.g. torch.save({'student': ckpt['student'], 'config': ckpt['config']})")
    reference_config = None
    if isinstance(checkpoint, dict) and isinstance(checkpoint.get("student"), dict):
        reference_config = checkpoint.get("config")
        checkpoint = checkpoint["student"]
        if reference_config is not None and not isinstance(reference_config, dict):
            raise ValueError(f"{path!r} has a 'config' entry that is a {type(reference_config).__name__}, not a dict.")
    if not isinstance(checkpoint, dict) or not checkpoint or not all(
        isinstance(v, torch.Tensor) for v in checkpoint.values()
    ):
        found = sorted(map(str, checkpoint))[:8] if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise ValueError(
            f"{path!r} is not a VECA reference checkpoint: it holds no state dict of tensors, bare or under "
            f"'student' (found {found})."
        )
    return checkpoint, reference_config


def _chunk_keys(state_dict: dict, prefix: str) -> list[str]:
    """`prefix.0`, `prefix.1`, ... in index order (numeric, so 10 follows 9); a gap is an error."""
    indices = sorted(int(m.group(1)) for k in state_dict if (m := re.fullmatch(re.escape(prefix) + r"\.(\d+)", k)))
    if indices != list(range(len(indices))):
        raise ValueError(f"{prefix}.* indices must run 0..n-1 without gaps, got {indices}.")
    return [f"{prefix}.{i}" for i in indices]


def reference_settings(reference_config: dict | None, **given) -> tuple[dict, dict, list[str]]:
    """Our config fields stated by the reference config, the sizes it states (checked against the shapes later) and
    notes on what was taken from elsewhere. `given` are the caller's values (None = not given); a value that
    contradicts the checkpoint's config is an error, one the checkpoint cannot state is needed or assumed."""
    given = {name: value for name, value in given.items() if value is not None}
    settings, sizes, notes = dict(REFERENCE_CONSTANTS), {}, []
    if reference_config is not None:
        for ref_name, name in REFERENCE_SETTINGS.items():
            if ref_name in reference_config and reference_config[ref_name] is not None:
                value = reference_config[ref_name]
                settings[name] = list(value) if isinstance(value, (tuple, list)) else value
        settings["attention_dropout"] = settings.get("hidden_dropout_prob", 0.0)
        for ref_name, name in REFERENCE_SHAPES.items():
            if ref_name in reference_config:
                sizes[name] = reference_config[ref_name]
        if "mlp_ratio" in reference_config and "hidden_dim" in reference_config:
            sizes["intermediate_size"] = int(reference_config["hidden_dim"] * reference_config["mlp_ratio"])
        sizes["output_projection_size"] = reference_config.get("distill_output_dim")
        if reference_config.get("rope_jitter_coords") is not None:
            notes.append("rope_jitter_coords (a training-time per-axis rescale) has no counterpart and was dropped")
        chunk = reference_config.get("nested_chunk_size", REFERENCE_CHUNK)
        if chunk != REFERENCE_CHUNK:
            notes.append(f"the bank was stored in chunks of {chunk}")
    for name, value in given.items():
        if name in settings and settings[name] != value:
            raise ValueError(
                f"The checkpoint's config gives {name}={settings[name]!r}, but {value!r} was asked for; drop the "
                "option (the checkpoint's own value is used)."
            )
        settings[name] = value
    if "num_attention_heads" not in settings:
        raise ValueError(
            "The checkpoint has no 'config' entry, and the number of attention heads cannot be read from tensor "
            "shapes; pass --num-attention-heads (e.g. 12 for VECA-B, 6 for VECA-S) or --preset."
        )
    for name, value in REFERENCE_DEFAULTS.items():
        if name not in settings:
            settings[name] = value
            notes.append(f"{name}={value!r} assumed (the reference default; the checkpoint does not say)")
    return settings, sizes, notes


def convert_reference_state_dict(
    state_dict: dict[str, torch.Tensor],
    num_attention_heads: int | None = None,
    reference_config: dict | None = None,
    **settings,
) -> tuple[VecaConfig, dict[str, torch.Tensor]]:
    """Reference state dict (and the reference config saved with it, if any) -> (`VecaConfig`, `VecaModel` state
    dict). `settings` are config fields the caller states (e.g. `rope_zero_fraction`). With M cores and L layers:
    query_token_chunks.{i} (1, 8, D), concatenated -> embeddings.core_bank.cores (1, M, D);
    qcoord_chunks.{i} (1, 8, 2), raw pre-tanh -> embeddings.core_bank.coordinates (M, 2), still raw;
    pos_alpha (L-1,) -> encoder.coordinate_heads.{l}.alpha (1,);
    everything else is renamed (RENAMES). Raises ValueError on unknown, missing or mis-shaped weights."""
    settings, stated_sizes, _ = reference_settings(
        reference_config, num_attention_heads=num_attention_heads, **settings
    )
    state_dict = strip_wrapper_prefixes(state_dict, ("student.",) + WRAPPER_PREFIXES)
    ours, sources, unused = {}, {}, set(state_dict)  # sources: our name -> reference name, for error messages

    def put(name, value, source, used):
        ours[name], sources[name] = value, source
        unused.difference_update(used)

    for key, value in state_dict.items():
        for pattern, replacement in _RENAME_PATTERNS:
            if match := pattern.match(key):
                prefix = replacement.replace("{l}", match.group(1)) if match.groups() else replacement
                put(prefix + key[match.end():], value, key, [key])
                break

    bank = "embeddings.core_bank."
    for prefix, name in [("query_token_chunks", bank + "cores"), ("qcoord_chunks", bank + "coordinates")]:
        if keys := _chunk_keys(state_dict, prefix):
            put(name, torch.cat([state_dict[k] for k in keys], dim=1), f"{prefix}.*", keys)
    if bank + "coordinates" in ours:
        ours[bank + "coordinates"] = ours[bank + "coordinates"].flatten(0, 1)  # (1, M, 2) -> (M, 2)

    if "pos_alpha" in state_dict:
        for layer, alpha in enumerate(state_dict["pos_alpha"].reshape(-1)):
            put(f"encoder.coordinate_heads.{layer}.alpha", alpha.reshape(1).clone(), "pos_alpha", ["pos_alpha"])

    num_layers = 1 + max((int(m.group(1)) for k in state_dict if (m := re.match(r"blocks\.(\d+)\.", k))), default=-1)

    config = _infer_config(ours, num_layers, settings, stated_sizes)
    check_converted_keys(
        VecaModel, config, ours, sources, sorted(unused),
        f"VECA reference checkpoint (hidden {config.hidden_size}, {config.num_hidden_layers} layers, "
        f"{config.num_cores} cores)",
    )
    return config, ours


def _infer_config(ours: dict, num_layers: int, settings: dict, stated_sizes: dict) -> VecaConfig:
    """Sizes from shapes: conv weight (D, C, p, p), cores (1, M, D), fc2 weight (D, h), output_proj (D', D); the
    sizes the reference config states must agree with them."""
    needed = {"embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
              "embeddings.core_bank.cores": "query_token_chunks.*",
              "encoder.layers.0.mlp.fc2.weight": "blocks.0.fc2.weight"}
    absent = [ref for name, ref in needed.items() if name not in ours]
    if absent:
        raise ValueError(f"This is not a VECA reference checkpoint: it has no {', '.join(absent)}.")
    conv = ours["embeddings.patch_embeddings.projection.weight"]
    if conv.ndim != 4 or conv.shape[2] != conv.shape[3] or ours["embeddings.core_bank.cores"].ndim != 3:
        raise ValueError("This is not a VECA reference checkpoint: patch_embed.proj.weight or the core bank has an "
                         "unexpected number of dimensions.")
    hidden_size, num_channels, patch_size, _ = conv.shape
    output_projection = ours.get("output_projection.weight")
    sizes = dict(
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        intermediate_size=ours["encoder.layers.0.mlp.fc2.weight"].shape[1],
        patch_size=patch_size,
        num_channels=num_channels,
        num_cores=ours["embeddings.core_bank.cores"].shape[1],
        patch_embedding_norm="embeddings.patch_embeddings.norm.weight" in ours,
        output_projection_size=None if output_projection is None else output_projection.shape[0],
    )
    if stated_sizes.get("output_projection_size") == hidden_size:
        stated_sizes = {**stated_sizes, "output_projection_size": None}  # the reference's Identity projection
    disagree = [f"{name} {stated_sizes[name]} (config) vs {value} (weights)"
                for name, value in sizes.items() if name in stated_sizes and stated_sizes[name] != value]
    if disagree:
        raise ValueError("The checkpoint's config and weights disagree: " + ", ".join(disagree) + ".")
    if "training_budgets" not in settings:  # a bare state dict: the reference trains multiples of its chunk
        budgets = list(range(REFERENCE_CHUNK, sizes["num_cores"] + 1, REFERENCE_CHUNK)) or [sizes["num_cores"]]
        settings = {**settings, "training_budgets": budgets, "training_budget_weights": [1.0] * len(budgets)}
    return VecaConfig(**sizes, qkv_bias="encoder.layers.0.attention.q_proj.bias" in ours, **settings)


def convert(
    checkpoint: str,
    out_dir: str,
    preset: str | None = None,
    num_attention_heads: int | None = None,
    patch_size: int | None = None,
    force: bool = False,
    **settings,
) -> tuple[VecaModel, list[str]]:
    """Converts `checkpoint` and saves the hub folder `out_dir`; `preset` and `patch_size` are checked against the
    weights. Returns the model and notes on what was not read from the checkpoint."""
    check_out_dir(out_dir, force, checkpoint)
    wanted = dict(VECA_PRESETS[preset]) if preset else {}
    preset_heads = wanted.pop("num_attention_heads", None)
    if patch_size:
        wanted["patch_size"] = patch_size
    state_dict, reference_config = load_reference_checkpoint(checkpoint)
    check_finite(state_dict, checkpoint)
    if num_attention_heads is None and (reference_config is None or "num_heads" not in reference_config):
        num_attention_heads = preset_heads
    _, _, notes = reference_settings(reference_config, num_attention_heads=num_attention_heads, **settings)
    config, state_dict = convert_reference_state_dict(state_dict, num_attention_heads, reference_config, **settings)
    wrong = [f"{k} is {getattr(config, k)}, not {v}" for k, v in wanted.items() if getattr(config, k) != v]
    if wrong:
        raise ValueError(f"The weights do not match the requested size: {', '.join(wrong)}.")
    return save_converted(VecaModel, config, state_dict, out_dir), notes


def main(argv: list[str] | None = None) -> int:
    """The command line: a bad input ends in one line on stderr and exit status 2."""
    return run(convert_command, argv)


def convert_command(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Convert a reference VECA checkpoint into a hub folder.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("checkpoint", help="reference .pt file: a training dict ('student' + 'config') or state dict")
    parser.add_argument("out_dir", help="folder to write the hub model into (new or empty)")
    parser.add_argument("--num-attention-heads", type=int,
                        help="heads; needed when the checkpoint has no 'config' (else the preset's)")
    parser.add_argument("--preset", choices=sorted(VECA_PRESETS), help="reference size; checked against the weights")
    parser.add_argument("--patch-size", type=int, help="expected patch size; checked against the weights")
    parser.add_argument("--rope-zero-fraction", type=float,
                        help="fraction of RoPE frequencies zeroed, for a checkpoint without 'config' (reference: 0.125)")
    parser.add_argument("--rope-zero-from", choices=["low", "high"],
                        help="which frequencies are zeroed, for a checkpoint without 'config' (reference: low)")
    parser.add_argument("--force", action="store_true", help="write into OUT_DIR even if it is not empty")
    args = parser.parse_args(argv)
    model, notes = convert(
        args.checkpoint, args.out_dir, args.preset, args.num_attention_heads, args.patch_size, args.force,
        rope_zero_fraction=args.rope_zero_fraction, rope_zero_from=args.rope_zero_from,
    )
    c = model.config
    print(f"Wrote {args.out_dir}: VECA hidden {c.hidden_size}, {c.num_hidden_layers} layers, "
          f"{c.num_attention_heads} heads, {c.num_cores} cores (trained budgets {c.training_budgets}), patch "
          f"{c.patch_size}, RoPE zeroes {c.rope_zero_fraction:g} ({c.rope_zero_from}), LayerNorm eps "
          f"{c.layer_norm_eps:g}{', patch-embedding norm' if c.patch_embedding_norm else ''}"
          f"{f', output projection to {c.output_projection_size}' if c.output_projection_size else ''}.")
    for note in notes:
        print(f"note: {note}")


if __name__ == "__main__":
    sys.exit(main())
