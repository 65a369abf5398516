"""CPU inference opt-in: `optimize_for_cpu(model)` runs a model's linear layers on oneDNN with prepacked weights,
VECA's MLP over 1024-token chunks, and LookWhere's position-table resize as two matrix products.

PyTorch's default CPU GEMM re-packs the whole weight matrix on every call, a large share of the time when few rows
meet each weight (LookWhere's ~140 kept tokens, VECA's MLP chunks). A weight packed once for oneDNN removes that cost,
at the price of a second copy of every linear weight in memory. VECA's MLP in token chunks keeps its 2h-wide
activations in fewer fresh pages. A bicubic resize by matrices beats `F.interpolate` 2-3x on a CPU. All three only
pay on CPUs, so they live here, outside the hub files: the models
themselves use plain `nn.Linear`, keep one copy of the weights and run the MLP at once (`chunk_size_feed_forward` 0).

    model = AutoModel.from_pretrained(...).eval()
    optimize_for_cpu(model)          # in place; any nn.Module (a dense DINOv2 too)

Only CPU float32 inference without autograd takes the packed path; training, other devices and dtypes, tracing and
compilation run the plain `F.linear`. Parameters, state dict and `save_pretrained` are unchanged.
"""

import warnings
import weakref

import torch
import torch.nn.functional as F
from torch import nn


def onednn_prepacking_available() -> bool:
    """Whether this torch build has the oneDNN prepacked linear ops (x86 and most Arm CPU builds do)."""
    try:
        ops = torch.ops.mkldnn
        return torch.backends.mkldnn.is_available() and all(
            hasattr(ops, name) for name in ("_reorder_linear_weight", "_linear_pointwise")
        )
    except (AttributeError, RuntimeError):
        return False


_ONEDNN_PREPACKING = onednn_prepacking_available()


class WatchedParameter(nn.Parameter):
    """A weight that notes when its `.data` is handed out: an edit through `.data` (`p.data.mul_(2)`) bypasses the
    version counter that in-place updates bump, so a `PrepackedLinear` repacks after any such access."""

    @property
    def data(self) -> torch.Tensor:
        self._data_handed_out = True
        return torch.Tensor.data.__get__(self)

    @data.setter
    def data(self, value: torch.Tensor) -> None:
        torch.Tensor.data.__set__(self, value)


class PrepackedLinear(nn.Linear):
    """`nn.Linear` whose CPU float32 inference multiplies by a oneDNN weight packed once. The packed copy is rebuilt
    when the weight changes (replaced, moved, updated in place, or its `.data` handed out: `WatchedParameter`) and is
    never saved, pickled or deep-copied."""

    _packed = None  # (weight identity, packed weight); identity = (weak reference, data pointer, version)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self._prepackable(input):
            self._packed = None  # moved, trained or traced: free a stale copy
            return F.linear(input, self.weight, self.bias)
        weight = self.weight
        if type(weight) is nn.Parameter:  # the layer's own weight, or one assigned since: watch its `.data`
            weight.__class__ = WatchedParameter
        edited = weight.__dict__.pop("_data_handed_out", False)
        if edited or self._packed is None or not self._packed_for(weight):
            identity = (weakref.ref(weight), weight.data_ptr(), weight._version)
            self._packed = (identity, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None))
        return torch.ops.mkldnn._linear_pointwise(input, self._packed[1], self.bias, "none", [], "")

    def _packed_for(self, weight: torch.Tensor) -> bool:
        reference, data_ptr, version = self._packed[0]
        return reference() is weight and data_ptr == weight.data_ptr() and version == weight._version

    def _prepackable(self, input: torch.Tensor) -> bool:
        weight = self.weight
        return (
            _ONEDNN_PREPACKING
            and torch.backends.mkldnn.enabled  # the user's global switch for oneDNN
            and input.device.type == "cpu"
            and input.dtype == weight.dtype == torch.float32
            and not (torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad))
            and not weight.is_inference()  # inference tensors have no version counter to detect updates with
            and not torch.jit.is_tracing()
            and not torch.compiler.is_compiling()
        )

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_packed": None}  # a oneDNN tensor cannot be pickled or deep-copied


def resize_position_table_by_matrices(table: torch.Tensor, grid: tuple[int, int], antialias: bool) -> torch.Tensor:
    """LookWhere's `resize_position_table` (DINOv2's bicubic resize of a (1, G * G, D) table to (1, Hp * Wp, D)) as
    two small matrix products with the per-axis weights: equal to `F.interpolate` within 2e-6, and 2-3x faster on a
    CPU (and in onnxruntime, so the ONNX exporter uses it too)."""
    side = int(table.shape[1] ** 0.5)
    if (side, side) == tuple(grid):
        return table
    rows = bicubic_weights(side, grid[0], antialias, table.device)  # (Hp, G)
    cols = bicubic_weights(side, grid[1], antialias, table.device)  # (Wp, G)
    dim = table.shape[-1]
    resized_rows = (rows @ table.float().reshape(side, side * dim)).reshape(grid[0], side, dim)
    return torch.matmul(cols, resized_rows).reshape(1, grid[0] * grid[1], dim).to(table.dtype)


def bicubic_weights(source: int, target: int, antialias: bool, device: torch.device) -> torch.Tensor:
    """(target, source) weights of a bicubic resize along one axis, from `source` to `target` cells: resizing the
    identity along that axis gives them (the other axis keeps its size, where the weights are the identity)."""
    identity = torch.eye(source, device=device)[None, None]
    resized = F.interpolate(identity, size=(target, source), mode="bicubic", align_corners=False, antialias=antialias)
    return resized[0, 0]


class MatrixPositionResize:
    """Mixed into a LookWhere extractor embeddings' class by `optimize_for_cpu`: its position table resized by matrices."""

    def resize_positions(self, grid: tuple[int, int]) -> torch.Tensor:
        return resize_position_table_by_matrices(self.position_embeddings, grid, self.antialias)


_MATRIX_RESIZE_CLASSES: dict[type, type] = {}


def with_matrix_resize(cls: type) -> type:
    """`cls` (a LookWhere extractor embeddings class, ours or a hub copy's) with `MatrixPositionResize` first: made once
    each."""
    if cls not in _MATRIX_RESIZE_CLASSES:
        _MATRIX_RESIZE_CLASSES[cls] = type(cls.__name__, (MatrixPositionResize, cls), {"__module__": cls.__module__})
    return _MATRIX_RESIZE_CLASSES[cls]


# Tokens per MLP chunk in a block that chunks (`chunk_size_feed_forward`, VECA's layers) and was left unchunked.
CPU_MLP_CHUNK = 1024


def optimize_for_cpu(model: nn.Module) -> nn.Module:
    """Switches every plain `nn.Linear` in `model` to `PrepackedLinear`, in place (same parameters, same state dict),
    and runs the MLP of every block that can chunk it (VECA's) over `CPU_MLP_CHUNK`-token chunks. Returns `model`. A
    torch build without oneDNN's prepacked ops keeps plain linear layers, with one warning."""
    for module in model.modules():
        if getattr(module, "chunk_size_feed_forward", None) == 0 and hasattr(module, "mlp"):
            module.chunk_size_feed_forward = CPU_MLP_CHUNK
            module._chunked_for_cpu = True
        if hasattr(module, "resize_positions") and not isinstance(module, MatrixPositionResize):
            module.__class__ = with_matrix_resize(type(module))
    if not _ONEDNN_PREPACKING:
        warnings.warn("This torch build has no oneDNN prepacked linear ops: optimize_for_cpu left the model as it is.")
        return model
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = PrepackedLinear
    return model


def restore_default_linear(model: nn.Module) -> nn.Module:
    """Undoes `optimize_for_cpu`: every `PrepackedLinear` becomes a plain `nn.Linear` again and frees its packed copy,
    and the MLPs it chunked run at once again.
    Returns `model`."""
    for module in model.modules():
        if module.__dict__.pop("_chunked_for_cpu", False):
            module.chunk_size_feed_forward = 0
        if isinstance(module, MatrixPositionResize):
            module.__class__ = type(module).__bases__[1]
        if type(module) is PrepackedLinear:
            module.__dict__.pop("_packed", None)
            module.__class__ = nn.Linear
            if type(module.weight) is WatchedParameter:
                module.weight.__dict__.pop("_data_handed_out", None)
                module.weight.__class__ = nn.Parameter
    return model


__all__ = ["PrepackedLinear", "onednn_prepacking_available", "optimize_for_cpu", "restore_default_linear"]
