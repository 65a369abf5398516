"""Convert the authors' released LookWhere checkpoints into hub folders.

    python -m corevision_hf.convert.lookwhere lookwhere_dinov2.pt OUT_DIR [--num-attention-heads N] [--force]
    python -m corevision_hf.convert.lookwhere lookwhere_franca.pt OUT_DIR
    python -m corevision_hf.convert.lookwhere --from-hub dinov2 OUT_DIR   # downloads it first (lookwhere_release.py)

The checkpoint is loaded with `weights_only=True` (never unpickled as code). Its layout is
`{"selector": {"backbone": <timm ViT>, "head": {"w1.*", "w2.*"}}, "extractor": <timm ViT>}`, both ViTs in timm's
naming (position table over the patches only, the CLS position folded into `cls_token`). The config is inferred
from the tensor shapes: registers from `reg_token` (none in the Franca checkpoint: CLS alone is handed over), the
MLP from fc1 / fc2 (GELU as in DINOv2, or packed SwiGLU as in Franca). Only the number of heads is not visible in
them (`--num-attention-heads`, else hidden_size // 64, the head dim of every DINOv2 and Franca ViT). timm's fused
q/k/v matches ours, so no permutation is needed. The selector's input is downsampled without antialiasing, as the
authors' released inference code does (`selector_antialias=False`).
"""

import argparse
import math
import re
import sys

import torch

from corevision_hf.cli import HelpFormatter
from corevision_hf import LookWhereConfig, LookWhereModel
from corevision_hf.cli import run
from corevision_hf.convert.common import (
    check_finite,
    check_converted_keys,
    check_out_dir,
    load_tensor_checkpoint,
    save_converted,
    strip_wrapper_prefixes,
)
from corevision_hf.convert.lookwhere_release import (
    RELEASE_SHA256,
    RELEASES,
    REPO_ID,
    REVISION,
    UNPINNED,
    download_release,
)


# timm ViT block names -> ours, within `blocks.{l}.` / `layers.{l}.`; `.weight`/`.bias` suffixes carry over.
BLOCK_RENAMES = {
    "norm1.": "norm1.",
    "attn.qkv.": "attention.qkv.",  # fused (q; k; v) rows: split into q_proj / k_proj / v_proj by `split_qkv`
    "attn.proj.": "attention.o_proj.",
    "ls1.gamma": "layer_scale1.lambda1",
    "norm2.": "norm2.",
    "mlp.fc1.": "mlp.fc1.",
    "mlp.fc2.": "mlp.fc2.",
    "ls2.gamma": "layer_scale2.lambda1",
}
HEAD_RENAMES = {"w1.": "selector.map_head.0.", "w2.": "selector.map_head.2."}
# The extractor's own CLS and register tokens are unused by the method (it takes the selector's post-norm CLS and
# registers instead) and LookWhereExtractor has no slot for them: they are dropped if present.
UNUSED_EXTRACTOR_KEYS = ("cls_token", "reg_token")


def load_lookwhere_checkpoint(path: str) -> dict:
    """The reference checkpoint at `path`, checked to have the released nested layout of tensor state dicts."""
    checkpoint = load_tensor_checkpoint(
        path, "keeping the layout {'selector': {'backbone': ..., 'head': ...}, 'extractor': ...}"
    )
    _check_layout(checkpoint, path)
    return checkpoint


def _check_layout(checkpoint, where: str) -> None:
    def is_state_dict(value) -> bool:
        return isinstance(value, dict) and all(isinstance(v, torch.Tensor) for v in value.values())

    layout = "{'selector': {'backbone': <state dict>, 'head': <state dict>}, 'extractor': <state dict>}"
    if not isinstance(checkpoint, dict):
        raise ValueError(f"{where!r} holds a {type(checkpoint).__name__}, not the reference layout {layout}.")
    problems = []
    unexpected = sorted(str(k) for k in set(checkpoint) - {"selector", "extractor"})
    if unexpected:
        problems.append(f"unexpected top-level entries {unexpected}")
    selector = checkpoint.get("selector")
    if not isinstance(selector, dict):
        problems.append("'selector' is missing or not a dict")
    else:
        if unexpected := sorted(str(k) for k in set(selector) - {"backbone", "head"}):
            problems.append(f"unexpected 'selector' entries {unexpected}")
        for part in ("backbone", "head"):
            if not is_state_dict(selector.get(part)):
                problems.append(f"'selector'/'{part}' is missing or not a state dict of tensors")
    if not is_state_dict(checkpoint.get("extractor")):
        problems.append("'extractor' is missing or not a state dict of tensors")
    if problems:
        raise ValueError(f"{where!r} does not have the reference layout {layout}: " + "; ".join(problems) + ".")


def convert_reference_state_dict(
    checkpoint_dict: dict, num_attention_heads: int | None = None
) -> tuple[LookWhereConfig, dict[str, torch.Tensor]]:
    """Reference checkpoint dict -> (inferred `LookWhereConfig`, `LookWhereModel` state dict).

    selector backbone: cls_token, reg_token, pos_embed and patch_embed.proj -> selector.embeddings.cls_token,
    .register_tokens, .position_embeddings and .patch_embeddings.projection; blocks.{l} -> selector.layers.{l}
    (BLOCK_RENAMES), norm -> selector.norm;
    selector head: w1 -> selector.map_head.0, w2 -> selector.map_head.2;
    extractor: the same names under extractor.*, its cls_token / reg_token dropped (unused by the method).
    Raises ValueError on unknown, missing or mis-shaped weights."""
    _check_layout(checkpoint_dict, "checkpoint")
    parts = {
        "selector.backbone": ("selector", strip_wrapper_prefixes(checkpoint_dict["selector"]["backbone"])),
        "selector.head": ("selector", strip_wrapper_prefixes(checkpoint_dict["selector"]["head"])),
        "extractor": ("extractor", strip_wrapper_prefixes(checkpoint_dict["extractor"])),
    }
    ours, sources, unexpected = {}, {}, []  # sources: our name -> reference name, for error messages

    for where, (prefix, state_dict) in parts.items():
        for key, value in state_dict.items():
            name = _rename(where, prefix, key)
            if name is None:
                if where == "extractor" and key in UNUSED_EXTRACTOR_KEYS:
                    continue
                unexpected.append(f"{where}.{key}")
            else:
                for part_name, part in split_qkv(name, value):
                    ours[part_name], sources[part_name] = part, f"{where}.{key}"

    config = _infer_config(ours, parts, num_attention_heads)
    if "selector.embeddings.register_tokens" not in ours and config.num_register_tokens == 0:
        ours["selector.embeddings.register_tokens"] = torch.zeros(1, 0, config.hidden_size)  # a ViT without registers
        sources["selector.embeddings.register_tokens"] = "selector.backbone.reg_token"

    check_converted_keys(
        LookWhereModel, config, ours, sources, unexpected,
        f"LookWhere checkpoint (hidden {config.hidden_size}, {config.num_hidden_layers} extractor blocks, "
        f"{config.selector_depth} selector blocks, {'SwiGLU' if config.use_swiglu_ffn else 'GELU'} MLP)",
    )
    return config, ours


def _rename(where: str, prefix: str, key: str) -> str | None:
    """Our name for reference `key` of part `where`, or None if it has no place in LookWhereModel."""
    if where == "selector.head":
        for ref, name in HEAD_RENAMES.items():
            if key.startswith(ref):
                return name + key[len(ref):]
        return None
    if where == "selector.backbone":
        if key == "cls_token":
            return "selector.embeddings.cls_token"
        if key == "reg_token":
            return "selector.embeddings.register_tokens"
    if key == "pos_embed":
        return f"{prefix}.embeddings.position_embeddings"
    if key.startswith("patch_embed.proj."):
        return f"{prefix}.embeddings.patch_embeddings.projection." + key[len("patch_embed.proj."):]
    if key.startswith("norm."):
        return f"{prefix}.{key}"
    if match := re.match(r"blocks\.(\d+)\.", key):
        rest = key[match.end():]
        for ref, name in BLOCK_RENAMES.items():
            if rest.startswith(ref):
                return f"{prefix}.layers.{match.group(1)}.{name}{rest[len(ref):]}"
    return None


def split_qkv(name: str, value: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """A fused `attention.qkv` tensor, (q; k; v) rows -> its q_proj / k_proj / v_proj thirds; any other as it is."""
    if ".attention.qkv." not in name:
        return [(name, value)]
    return [(name.replace(".qkv.", f".{p}_proj."), chunk) for p, chunk in zip("qkv", value.chunk(3))]


def _depth(state_dict: dict) -> int:
    return 1 + max((int(m.group(1)) for k in state_dict if (m := re.match(r"blocks\.(\d+)\.", k))), default=-1)


def _grid_side(table: torch.Tensor, source: str) -> int:
    rows = table.shape[1] if table.ndim == 3 else -1
    side = math.isqrt(rows) if rows > 0 else 0
    if table.ndim != 3 or side * side != rows:
        raise ValueError(
            f"{source} has shape {tuple(table.shape)}; expected (1, G * G, D), a square grid of patch positions "
            "without a CLS slot."
        )
    return side


def _infer_config(ours: dict, parts: dict, num_attention_heads: int | None) -> LookWhereConfig:
    """Sizes from shapes: conv weight (D, C, p, p), fc1 weight (h, D), pos_embed (1, G * G, D), reg_token (1, R, D),
    head w1 weight (r * D, D), w2 weight (m * m, r * D)."""
    needed = {
        "extractor.embeddings.patch_embeddings.projection.weight": "extractor.patch_embed.proj.weight",
        "extractor.embeddings.position_embeddings": "extractor.pos_embed",
        "selector.embeddings.position_embeddings": "selector.backbone.pos_embed",
        "extractor.layers.0.mlp.fc1.weight": "extractor.blocks.0.mlp.fc1.weight",
        "selector.map_head.0.weight": "selector.head.w1.weight",
        "selector.map_head.2.weight": "selector.head.w2.weight",
    }
    absent = [ref for name, ref in needed.items() if name not in ours]
    if absent:
        raise ValueError(f"This is not a LookWhere reference checkpoint: it has no {', '.join(absent)}.")
    conv = ours["extractor.embeddings.patch_embeddings.projection.weight"]
    if conv.ndim != 4 or conv.shape[2] != conv.shape[3]:
        raise ValueError(f"extractor.patch_embed.proj.weight has shape {tuple(conv.shape)}; expected (D, C, p, p).")
    hidden_size, num_channels, patch_size, _ = conv.shape
    if num_attention_heads is None:
        if hidden_size % 64:
            raise ValueError(f"hidden_size {hidden_size} is not a multiple of DINOv2's head dim 64; "
                             "pass --num-attention-heads.")
        num_attention_heads = hidden_size // 64
    map_hidden = ours["selector.map_head.0.weight"].shape[0]
    if map_hidden % hidden_size:
        raise ValueError(f"selector.head.w1.weight has {map_hidden} output features, not a multiple of the "
                         f"hidden size {hidden_size}.")
    registers = ours.get("selector.embeddings.register_tokens")
    fc1_rows, fc2_columns = _mlp_widths(ours, hidden_size)
    config = LookWhereConfig(
        hidden_size=hidden_size,
        num_hidden_layers=_depth(parts["extractor"][1]),
        num_attention_heads=num_attention_heads,
        intermediate_size=fc2_columns,
        use_swiglu_ffn=fc1_rows == 2 * fc2_columns,
        patch_size=patch_size,
        num_channels=num_channels,
        num_register_tokens=0 if registers is None or registers.ndim != 3 else registers.shape[1],
        qkv_bias="extractor.layers.0.attention.q_proj.bias" in ours,
        image_size=_grid_side(ours["extractor.embeddings.position_embeddings"], "extractor.pos_embed") * patch_size,
        selector_depth=_depth(parts["selector.backbone"][1]),
        selector_image_size=patch_size
        * _grid_side(ours["selector.embeddings.position_embeddings"], "selector.backbone.pos_embed"),
        map_head_ratio=map_hidden // hidden_size,
        # What the released inference code computes (timm's DINOv2 blocks and F.interpolate), which its training
        # differed from (training.distill_lookwhere's recipe sets those values): exact GELU, LayerNorm epsilon 1e-6, no
        # antialiasing for the selector's input, its map or the position table.
        hidden_act="gelu",
        map_head_act="gelu",
        layer_norm_eps=1e-6,
        selector_antialias=False,
        selector_map_antialias=False,
        interpolate_antialias=False,
    )
    _check_map_cells(ours["selector.map_head.2.weight"].shape[0], config)
    return config


def _mlp_widths(ours: dict, hidden_size: int) -> tuple[int, int]:
    """(fc1's output rows, fc2's input columns) of the first block: equal for a plain MLP, fc1 twice fc2 for a packed
    SwiGLU; a ValueError for any other MLP."""
    fc1_rows = ours["extractor.layers.0.mlp.fc1.weight"].shape[0]
    fc2 = ours.get("extractor.layers.0.mlp.fc2.weight")
    fc2_columns = fc2.shape[1] if fc2 is not None and fc2.ndim == 2 else fc1_rows
    if fc1_rows not in (fc2_columns, 2 * fc2_columns):
        raise ValueError(
            f"This is not a supported LookWhere checkpoint: its MLP maps {hidden_size} -> {fc1_rows} -> "
            f"{fc2_columns} -> {hidden_size}, neither a plain MLP (equal widths) nor a packed SwiGLU (fc1 twice fc2)."
        )
    return fc1_rows, fc2_columns


def _check_map_cells(cells: int, config: LookWhereConfig) -> None:
    """A ValueError unless the map head's `cells` outputs per selector patch are the config's map_upsampling**2."""
    m = config.map_upsampling
    if cells != m * m:
        raise ValueError(
            f"selector.head.w2.weight has {cells} output features, but a {config.selector_grid_size}x"
            f"{config.selector_grid_size} selector grid and a {config.grid_size}x{config.grid_size} extractor grid "
            f"need map_upsampling**2 = ceil({config.grid_size}/{config.selector_grid_size})**2 = {m * m}."
        )


def convert(
    checkpoint: str, out_dir: str, num_attention_heads: int | None = None, force: bool = False
) -> LookWhereModel:
    """Converts `checkpoint` and saves the hub folder `out_dir` (other files already in it are left alone)."""
    check_out_dir(out_dir, force, checkpoint)
    reference = load_lookwhere_checkpoint(checkpoint)
    check_finite(reference, checkpoint)
    config, state_dict = convert_reference_state_dict(reference, num_attention_heads)
    return save_converted(LookWhereModel, config, state_dict, out_dir)


def main(argv: list[str] | None = None) -> int:
    """The command line: a bad input ends in one line on stderr and exit status 2."""
    argv = sys.argv[1:] if argv is None else argv
    from_hub = any(arg.split("=")[0] == "--from-hub" for arg in argv)  # the released weights, downloaded first
    return run(convert_release if from_hub else convert_command, argv)


def convert_command(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        formatter_class=HelpFormatter,
        description="Convert the reference LookWhere checkpoint into a hub folder.",
        epilog="Or: --from-hub {dinov2,franca} OUT_DIR downloads the authors' released file and converts it (its "
               "sha256 and revision unpinned: --from-hub dinov2 --help says what that means).",
    )
    parser.add_argument("checkpoint", help="reference .pt file, e.g. lookwhere_dinov2.pt")
    parser.add_argument("out_dir", help="folder to write the hub model into")
    parser.add_argument("--num-attention-heads", type=int, help="heads (default: hidden_size // 64)")
    parser.add_argument("--force", action="store_true", help="write into OUT_DIR even if it is not empty")
    args = parser.parse_args(argv)
    model = convert(args.checkpoint, args.out_dir, args.num_attention_heads, args.force)
    c = model.config
    heads = "" if args.num_attention_heads else " (head dim 64 assumed, as in DINOv2 and Franca)"
    print(f"Wrote {args.out_dir}: LookWhere hidden {c.hidden_size}, {c.num_attention_heads} heads{heads}, extractor "
          f"{c.num_hidden_layers} blocks at {c.image_size} px, selector {c.selector_depth} blocks at "
          f"{c.selector_image_size} px, {c.num_register_tokens} registers, "
          f"{'SwiGLU' if c.use_swiglu_ffn else 'GELU'} MLP, patch {c.patch_size}.")


def convert_release(argv: list[str]) -> None:
    """`--from-hub RELEASE OUT_DIR`: downloads the released file (`lookwhere_release.download_release`), converts it."""
    parser = argparse.ArgumentParser(
        formatter_class=HelpFormatter,
        prog="python -m corevision_hf.convert.lookwhere --from-hub",
        description=f"Download the authors' released LookWhere weights from the hub repo {REPO_ID} and convert them.",
        epilog=UNPINNED if not RELEASE_SHA256 else None,
    )
    parser.add_argument("--from-hub", required=True, metavar="RELEASE", help=f"one of {sorted(RELEASES)}")
    parser.add_argument("out_dir", help="folder to write the hub model into")
    parser.add_argument("--force", action="store_true", help="write into OUT_DIR even if it is not empty")
    args = parser.parse_args(argv)
    check_out_dir(args.out_dir, args.force)  # before a download of hundreds of MB
    path, note = download_release(args.from_hub)
    convert(path, args.out_dir, force=args.force)
    print(f"Wrote {args.out_dir} from {REPO_ID}/{RELEASES[args.from_hub]} (revision {REVISION}; {note}). Next:")
    for line in usage_lines(args.out_dir, args.from_hub):
        print("  " + line)


def usage_lines(out_dir: str, name: str) -> list[str]:
    """What to run next: load, evaluate, publish."""
    evaluation = f"{out_dir.rstrip('/')}-evaluation"
    return [
        f"load:     AutoModel.from_pretrained({out_dir!r}, trust_remote_code=True)",
        f"evaluate: python -m evaluation.evaluate_budgets {out_dir} --budgets 0.05 0.1 0.2 --resolutions 518 1036 "
        f"--output-dir {evaluation}",
        f"publish:  python -m publishing.publish {out_dir} --evaluation {evaluation}/evaluation.json "
        f"--repo-id your-name/lookwhere-{name} --dry-run   # then without --dry-run",
    ]


if __name__ == "__main__":
    sys.exit(main())
