"""Convert a checkpoint of the authors' reference VECA code into a hub folder.

    python -m corevision_hf.convert.veca REFERENCE.pt OUT_DIR [--preset base] [--num-attention-heads N] [--force]

The checkpoint is loaded with `weights_only=True` (never unpickled as code); the weights may be a bare state dict
or sit under "student" in a training dict. The config is inferred from the tensor shapes; only the number of
heads is not visible in them (`--num-attention-heads`, else `--preset`, else head dim 64 as in every preset).
The reference already uses our RoPE convention (interleaved pairs, x block then y block), so no permutation.
"""

import argparse
import re

import torch

from corevision_hf import VECA_PRESETS, VecaConfig, VecaModel
from corevision_hf.convert.common import (
    check_out_dir,
    expected_state_dict,
    load_tensor_checkpoint,
    save_converted,
    strip_wrapper_prefixes,
)


# One-to-one renames, reference -> ours; `{l}` is a layer index. The core bank, alphas and q/k/v are merged below.
RENAMES = [
    ("patch_embed.proj.", "patch_embeddings.projection."),
    ("pos_linears.{l}.", "coordinate_heads.{l}.proj."),
    ("blocks.{l}.norm_attn.", "layers.{l}.norm1."),
    ("blocks.{l}.attn.out_proj.", "layers.{l}.attention.proj."),
    ("blocks.{l}.norm_ffn.", "layers.{l}.norm2."),
    ("blocks.{l}.fc1.", "layers.{l}.mlp.fc1."),  # same layout: first half u, second half v
    ("blocks.{l}.fc2.", "layers.{l}.mlp.fc2."),
    ("final_norm.", "norm."),
    ("output_proj.", "output_projection."),
]
_RENAME_PATTERNS = [(re.compile(re.escape(ref).replace(r"\{l\}", r"(\d+)")), ours) for ref, ours in RENAMES]


def load_reference_checkpoint(path: str) -> dict[str, torch.Tensor]:
    """The reference weights at `path`: a bare state dict, or the "student" entry of a training dict."""
    checkpoint = load_tensor_checkpoint(path, "e.g. torch.save(ckpt['student'], 'w.pt')")
    if isinstance(checkpoint, dict) and isinstance(checkpoint.get("student"), dict):
        checkpoint = checkpoint["student"]
    if not isinstance(checkpoint, dict) or not all(isinstance(v, torch.Tensor) for v in checkpoint.values()):
        found = sorted(checkpoint)[:20] if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise ValueError(f"{path!r} holds no state dict of tensors, bare or under 'student'; found {found}.")
    return checkpoint


def _chunk_keys(state_dict: dict, prefix: str) -> list[str]:
    """`prefix.0`, `prefix.1`, ... in index order (numeric, so 10 follows 9); a gap is an error."""
    indices = sorted(int(m.group(1)) for k in state_dict if (m := re.fullmatch(re.escape(prefix) + r"\.(\d+)", k)))
    if indices != list(range(len(indices))):
        raise ValueError(f"{prefix}.* indices must run 0..n-1 without gaps, got {indices}.")
    return [f"{prefix}.{i}" for i in indices]


def convert_reference_state_dict(
    state_dict: dict[str, torch.Tensor], num_attention_heads: int | None = None
) -> tuple[VecaConfig, dict[str, torch.Tensor]]:
    """Reference state dict -> (inferred `VecaConfig`, `VecaModel` state dict). With M cores and L layers:
    query_token_chunks.{i} (1, 8, D), concatenated -> core_bank.cores (1, M, D);
    qcoord_chunks.{i} (1, 8, 2), raw pre-tanh -> core_bank.coordinates (M, 2), still raw;
    pos_alpha (L-1,) -> coordinate_heads.{l}.alpha (1,);
    blocks.{l}.attn.{q,k,v}_proj.weight (D, D) -> layers.{l}.attention.qkv.weight (3D, D), biases likewise;
    everything else is renamed (RENAMES). Raises ValueError on unknown, missing or mis-shaped weights."""
    state_dict = strip_wrapper_prefixes(state_dict)
    norm_keys = sorted(k for k in state_dict if k.startswith("patch_embed.norm."))
    if norm_keys:
        raise ValueError(f"The checkpoint has a patch-embedding norm ({norm_keys}); VecaModel has none, so it "
                         "cannot be converted.")

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

    for prefix, name in [("query_token_chunks", "core_bank.cores"), ("qcoord_chunks", "core_bank.coordinates")]:
        if keys := _chunk_keys(state_dict, prefix):
            put(name, torch.cat([state_dict[k] for k in keys], dim=1), f"{prefix}.*", keys)
    if "core_bank.coordinates" in ours:
        ours["core_bank.coordinates"] = ours["core_bank.coordinates"].flatten(0, 1)  # (1, M, 2) -> (M, 2)

    if "pos_alpha" in state_dict:
        for layer, alpha in enumerate(state_dict["pos_alpha"].reshape(-1)):
            put(f"coordinate_heads.{layer}.alpha", alpha.reshape(1).clone(), "pos_alpha", ["pos_alpha"])

    num_layers = 1 + max((int(m.group(1)) for k in state_dict if (m := re.match(r"blocks\.(\d+)\.", k))), default=-1)
    for layer in range(num_layers):
        for kind in ("weight", "bias"):
            parts = [f"blocks.{layer}.attn.{p}_proj.{kind}" for p in "qkv"]
            if all(p in state_dict for p in parts):
                source = f"blocks.{layer}.attn.{{q,k,v}}_proj.{kind}"
                put(f"layers.{layer}.attention.qkv.{kind}", torch.cat([state_dict[p] for p in parts]), source, parts)

    config = _infer_config(ours, num_layers, num_attention_heads)
    expected = expected_state_dict(VecaModel, config)
    missing = sorted(set(expected) - set(ours))
    unused |= {sources[name] for name in set(ours) - set(expected)}  # e.g. blocks.{l} beyond the layers found
    if unused or missing:
        raise ValueError(
            f"The checkpoint does not match a VECA model of the inferred size (hidden {config.hidden_size}, "
            f"{config.num_hidden_layers} layers, {config.num_cores} cores).\n"
            f"  unexpected reference keys: {sorted(unused) or 'none'}\n"
            f"  missing weights (our names; qkv comes from blocks.l.attn.{{q,k,v}}_proj): {missing or 'none'}"
        )
    mismatched = [
        f"{sources[name]}: {tuple(value.shape)}, but {name} needs {tuple(expected[name].shape)}"
        for name, value in ours.items()
        if value.shape != expected[name].shape
    ]
    if mismatched:
        raise ValueError("Shape mismatches:\n  " + "\n  ".join(mismatched))
    return config, ours


def _infer_config(ours: dict, num_layers: int, num_attention_heads: int | None) -> VecaConfig:
    """Sizes from shapes: conv weight (D, C, p, p), cores (1, M, D), fc2 weight (D, h), output_proj (D', D)."""
    needed = {"patch_embeddings.projection.weight": "patch_embed.proj.weight",
              "core_bank.cores": "query_token_chunks.*", "layers.0.mlp.fc2.weight": "blocks.0.fc2.weight"}
    absent = [ref for name, ref in needed.items() if name not in ours]
    if absent:
        raise ValueError(f"Not a VECA reference checkpoint: {absent} missing (needed to infer the model size).")
    hidden_size, num_channels, patch_size, _ = ours["patch_embeddings.projection.weight"].shape
    if num_attention_heads is None:
        if hidden_size % 64:
            raise ValueError(f"hidden_size {hidden_size} is not a multiple of the reference head dim 64; "
                             "pass --num-attention-heads.")
        num_attention_heads = hidden_size // 64
    output_projection = ours.get("output_projection.weight")
    return VecaConfig(
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_attention_heads,
        intermediate_size=ours["layers.0.mlp.fc2.weight"].shape[1],
        patch_size=patch_size,
        num_channels=num_channels,
        num_cores=ours["core_bank.cores"].shape[1],
        qkv_bias="layers.0.attention.qkv.bias" in ours,
        output_projection_size=None if output_projection is None else output_projection.shape[0],
    )


def convert(checkpoint: str, out_dir: str, preset: str | None = None, num_attention_heads: int | None = None,
            patch_size: int | None = None, force: bool = False) -> VecaModel:
    """Converts `checkpoint` and saves the hub folder `out_dir`; `preset` and `patch_size` are checked."""
    check_out_dir(out_dir, force)
    wanted = dict(VECA_PRESETS[preset]) if preset else {}
    preset_heads = wanted.pop("num_attention_heads", None)
    num_attention_heads = num_attention_heads or preset_heads
    if patch_size:
        wanted["patch_size"] = patch_size
    config, state_dict = convert_reference_state_dict(load_reference_checkpoint(checkpoint), num_attention_heads)
    wrong = [f"{k} is {getattr(config, k)}, not {v}" for k, v in wanted.items() if getattr(config, k) != v]
    if wrong:
        raise ValueError(f"The weights do not match the requested size: {', '.join(wrong)}.")
    return save_converted(VecaModel, config, state_dict, out_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Convert a reference VECA checkpoint into a hub folder.")
    parser.add_argument("checkpoint", help="reference .pt file: a state dict, bare or under 'student'")
    parser.add_argument("out_dir", help="folder to write the hub model into")
    parser.add_argument("--preset", choices=sorted(VECA_PRESETS), help="reference size; checked against the weights")
    parser.add_argument("--num-attention-heads", type=int, help="heads (default: the preset's, else hidden_size // 64)")
    parser.add_argument("--patch-size", type=int, help="expected patch size; checked against the weights")
    parser.add_argument("--force", action="store_true", help="write into OUT_DIR even if it is not empty")
    args = parser.parse_args(argv)
    try:
        model = convert(
            args.checkpoint, args.out_dir, args.preset, args.num_attention_heads, args.patch_size, args.force
        )
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"error: {error}") from None
    c = model.config
    print(f"Wrote {args.out_dir}: VECA hidden {c.hidden_size}, {c.num_hidden_layers} layers, "
          f"{c.num_attention_heads} heads, {c.num_cores} cores, patch {c.patch_size}.")


if __name__ == "__main__":
    main()
