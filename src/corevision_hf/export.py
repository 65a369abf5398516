"""ONNX export of VECA and LookWhere with dynamic batch, height and width.

    python -m corevision_hf.export MODEL_DIR OUT.onnx [--num-cores K | --k-ratio R | --k K | --elastic [INPUT]]
                                   [--dtype fp32|fp16]

The graph takes `pixel_values` (batch, channels, height, width), any multiples of the patch size, and returns
`last_hidden_state` and `pooler_output` as the PyTorch model does. The budget is fixed per graph (VECA's number of
cores, LookWhere's k_ratio, k then following the image size inside the graph, or a fixed k), or, with `--elastic`, a
second input of the graph: `num_cores` (int64 scalar) for VECA, `k_ratio` (float64 scalar), `k` (int64 scalar) or
`k_mass` (float64 scalar: each image keeps the fewest patches whose selector mass reaches it) for LookWhere;
onnxruntime refuses a budget out of range. After writing, the graph is run with onnxruntime (when installed) against
PyTorch at two resolutions and batch sizes (an elastic graph at several budgets).

TorchScript-based `torch.onnx.export` (dynamo=False): it keeps height and width symbolic through both models'
shape arithmetic. What only a graph needs lives here, not in the modeling files: ONNX has no complex numbers, so
while tracing, VECA's rotary multiply is swapped for its cos/sin form on the angles (`onnx_rotary`) and LookWhere's
position table is resized by matrix products (`onnx_position_resize`); LookWhere's graph computes k from the symbolic
image size (`LookWhereGraph`) and keeps at least `num_fill_neighbors` patches (the fill's neighbour count is fixed); an elastic VECA graph slices its core bank by its
`num_cores` input (`cores_from_input`).

`--force` replaces only a graph this package wrote and nobody changed since: the graph carries that mark in its own
metadata (`GRAPH_MARK`, the sha256 of the rest of the file), so nothing is written beside it.
"""

import argparse
import contextlib
import hashlib
import os
import sys
import tempfile
import warnings

import torch
from torch import nn

from .atomic import follow_umask
from .cli import HelpFormatter
from .cli import reading_weights, run
from .cpu import resize_position_table_by_matrices
from .lookwhere import LookWhereConfig, LookWhereModel
from .loading import load_checked
from .lookwhere.budget_lookwhere import RATIO_TOLERANCE
from .outputs import check_file_output, refuse_overlap
from .veca import VecaConfig, VecaModel


OPSET = 18  # Resize with antialias (LookWhere's selector input and position table) needs opset 18
DTYPES = {"fp32": torch.float32, "fp16": torch.float16}
# An elastic graph's budget input and its dtype, whatever the graph's dtype: k_ratio in float64, so that k (the
# model's kept_for_ratio: floor(k_ratio * patches), exact for decimal ratios) rounds as the model's Python float does.
BUDGET_INPUTS = {"num_cores": torch.int64, "k": torch.int64, "k_ratio": torch.float64, "k_mass": torch.float64}
# The metadata entry that says this package wrote a graph: the sha256 of the graph without it.
GRAPH_MARK = "corevision_hf.sha256"


class ExportError(ValueError):
    """A model, option or path the exporter cannot use; the message says what to change."""


def _resize_antialias(mode: str, cubic_coefficient: float):
    """ONNX symbolic for torch's antialiased interpolation (`antialias=True`), which the TorchScript exporter lacks:
    a Resize with antialias=1 and the same filter (torch's antialiased bicubic uses a = -0.5; weights outside the
    image are dropped and renormalised, i.e. exclude_outside=1)."""

    def symbolic(g, input, output_size, align_corners, scale_factors):
        shape = g.op("Shape", input)
        starts, ends = g.op("Constant", value_t=torch.tensor([0])), g.op("Constant", value_t=torch.tensor([2]))
        batch_and_channels = g.op("Slice", shape, starts, ends)
        sizes = g.op("Concat", batch_and_channels, g.op("Cast", output_size, to_i=7), axis_i=0)  # 7: int64
        empty = g.op("Constant", value_t=torch.tensor([], dtype=torch.float32))
        return g.op(
            "Resize", input, empty, empty, sizes, mode_s=mode, antialias_i=1, cubic_coeff_a_f=cubic_coefficient,
            coordinate_transformation_mode_s="half_pixel", exclude_outside_i=1,
        )

    return symbolic


def register_symbolics() -> None:
    torch.onnx.register_custom_op_symbolic("aten::_upsample_bilinear2d_aa", _resize_antialias("linear", -0.75), OPSET)
    torch.onnx.register_custom_op_symbolic("aten::_upsample_bicubic2d_aa", _resize_antialias("cubic", -0.5), OPSET)


def apply_rotary_real(qk: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """VECA's `apply_rotary` in real arithmetic, for graphs (ONNX has no complex type): each (even, odd) pair
    (a, b) of (B, L, 2, H, head_dim) becomes (a cos - b sin, a sin + b cos) for its (B, L, head_dim / 2) angle."""
    pairs = qk.float().unflatten(-1, (-1, 2))
    cos, sin = (f(angles)[:, :, None, None, :] for f in (torch.cos, torch.sin))
    real, imag = pairs.unbind(-1)
    return torch.stack([real * cos - imag * sin, real * sin + imag * cos], dim=-1).flatten(-2).to(qk.dtype)


@contextlib.contextmanager
def onnx_rotary(model: nn.Module):
    """While tracing a VECA, its modeling module (ours or a hub copy) passes rotation angles instead of complex
    rotations, and rotates with `apply_rotary_real`."""
    module = sys.modules[type(model).__module__]
    rotary = module.VecaRotaryEmbedding
    original_apply, original_rotations = module.apply_rotary, rotary.rotations
    module.apply_rotary, rotary.rotations = apply_rotary_real, rotary.angles
    try:
        yield
    finally:
        module.apply_rotary, rotary.rotations = original_apply, original_rotations


@contextlib.contextmanager
def onnx_position_resize(model: nn.Module):
    """While tracing a LookWhere, its modeling module (ours or a hub copy) resizes the position table by two matrix
    products (`corevision_hf.cpu.resize_position_table_by_matrices`): a fraction of a bicubic Resize's cost in
    onnxruntime."""
    module = sys.modules[type(model).__module__]
    original = module.resize_position_table
    module.resize_position_table = resize_position_table_by_matrices
    try:
        yield
    finally:
        module.resize_position_table = original


@contextlib.contextmanager
def cores_from_input(model: nn.Module, num_cores: torch.Tensor):
    """While tracing an elastic graph, the VECA's active cores are the graph's `num_cores` input (a 0-d tensor)
    instead of a Python int, so that every slice of the bank and the tokens by it stays symbolic."""
    module = sys.modules[type(model).__module__]
    original = module.cores_to_keep
    module.cores_to_keep = lambda *args, **kwargs: num_cores
    try:
        yield
    finally:
        module.cores_to_keep = original


class BudgetCheck(nn.Module):
    """A budget, unchanged, where `within` holds (a 0-d bool), else a Gather of index 1 from one element, which
    onnxruntime refuses. A graph cannot raise a message: `finish_graph` names that node `message`, and
    onnxruntime's error quotes the name."""

    def __init__(self, message: str):
        super().__init__()
        self.message = message

    def forward(self, budget: torch.Tensor, within: torch.Tensor) -> torch.Tensor:
        return budget.reshape(1).index_select(0, 1 - within.long().reshape(1)).reshape(())


class ScalarBudget(nn.Module):
    """The graph's budget input, unchanged, through a reshape to a scalar: onnxruntime does not check the shape of a
    0-d input, and refuses this reshape for any other (`finish_graph` names the node `message`)."""

    def __init__(self, name: str, example: str):
        super().__init__()
        self.message = f"{name} must be one number for the whole batch: a 0-d array such as np.array({example})"

    def forward(self, budget: torch.Tensor) -> torch.Tensor:
        return budget.reshape(())


def finish_graph(path: str, messages: dict[str, str]) -> None:
    """Names the nodes of the graph at `path` that refuse a budget ({node name: message}: `BudgetCheck`'s out of range,
    `ScalarBudget`'s of another shape), and marks the graph as this package's (`GRAPH_MARK`)."""
    import onnx

    graph = onnx.load(path)
    for name, message in messages.items():
        (node,) = (node for node in graph.graph.node if node.name == name)
        node.name = message
    graph.metadata_props.add(key=GRAPH_MARK, value=unmarked_digest(graph))
    onnx.save(graph, path)


def graph_is_ours(path: str) -> bool:
    """Whether the file at `path` is an ONNX graph this package wrote, unchanged since: its mark matches the rest."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        graph = onnx.load(path, load_external_data=False)
    except (OSError, ValueError, DecodeError):  # not an ONNX file: the user's
        return False
    marks = [entry for entry in graph.metadata_props if entry.key == GRAPH_MARK]
    return len(marks) == 1 and marks[0].value == unmarked_digest(graph)


def unmarked_digest(graph) -> str:
    """The sha256 of an ONNX ModelProto serialised without its `GRAPH_MARK` entry (removed from `graph`)."""
    for index in reversed(range(len(graph.metadata_props))):
        if graph.metadata_props[index].key == GRAPH_MARK:
            del graph.metadata_props[index]
    return hashlib.sha256(graph.SerializeToString(deterministic=True)).hexdigest()


def require_patch_multiples(pixel_values: torch.Tensor, patch: int) -> torch.Tensor:
    """`pixel_values`, unchanged, through a reshape into whole patches: a graph cannot raise the model's ValueError,
    but onnxruntime refuses this reshape for a height or width that is not a multiple of the patch size."""
    batch, channels, height, width = pixel_values.shape
    return pixel_values.reshape(batch, channels, height // patch, patch, width // patch, patch).reshape(pixel_values.shape)


class VecaGraph(nn.Module):
    """VECA at a fixed number of cores, or (`num_cores` None) at the graph's `num_cores` input, 1..bank:
    pixel_values [, num_cores] -> (last_hidden_state, pooler_output)."""

    def __init__(self, model: nn.Module, num_cores: int | None):
        super().__init__()
        self.model, self.num_cores = model, num_cores
        if num_cores is None:
            self.budget_check = BudgetCheck(f"num_cores must lie in 1..{model.config.num_cores}")
            self.budget_shape = ScalarBudget("num_cores", "8")

    def forward(self, pixel_values: torch.Tensor, num_cores: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        pixel_values = require_patch_multiples(pixel_values, self.model.config.patch_size)
        if self.num_cores is not None:
            outputs = self.model(pixel_values, num_cores=self.num_cores)
        else:
            num_cores = self.budget_shape(num_cores)
            num_cores = self.budget_check(num_cores, (num_cores >= 1) & (num_cores <= self.model.config.num_cores))
            with cores_from_input(self.model, num_cores):
                outputs = self.model(pixel_values)
        return outputs.last_hidden_state, outputs.pooler_output


class LookWhereGraph(nn.Module):
    """LookWhere at a fixed k or k_ratio, or at the graph's `k`, `k_ratio` or `k_mass` input (`budget` {"k": None},
    {"k_ratio": None} or {"k_mass": None}), with the dense fill; a graph refuses a k or k_ratio that keeps fewer than
    num_fill_neighbors patches (or, as an input, more than all of them), and a k_mass outside (0, 1]. With k_mass, the
    batch keeps its largest count, at least num_fill_neighbors slots, the unused ones -1 and weightless, as the model:
    pixel_values [, budget] -> (last_hidden_state, pooler_output). The model's forward, step by step, except that k is
    a tensor computed from the symbolic image size, so that with a k_ratio it follows the image inside the graph (the
    model computes k in Python, which tracing would fix)."""

    def __init__(self, model: nn.Module, budget: dict):
        super().__init__()
        ((self.name, self.value),) = budget.items()
        self.model = model
        if self.value is None or self.name == "k_ratio":  # a fixed k was checked at export (`budget_for`)
            fewest = model.config.num_fill_neighbors
            self.budget_check = BudgetCheck({
                "k": f"k must lie in {fewest}..the image's patches",
                "k_ratio": f"k_ratio must lie in (0, 1] and keep at least {fewest} patches (floor(k_ratio * patches))",
                "k_mass": f"k_mass must lie in (0, 1], on an image of at least {fewest} patches",
            }[self.name])
        if self.value is None:
            self.budget_shape = ScalarBudget(self.name, {"k": "16", "k_ratio": "0.25", "k_mass": "0.9"}[self.name])

    def forward(self, pixel_values: torch.Tensor, budget: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        model = self.model
        patch = model.config.patch_size
        pixel_values = require_patch_multiples(pixel_values, patch)
        grid = (pixel_values.shape[2] // patch, pixel_values.shape[3] // patch)
        value = self.budget_shape(budget) if self.value is None else self.value
        if self.name == "k_mass":
            return self.forward_mass(pixel_values, grid, value)
        if self.name == "k":
            k = value
        else:  # the model's kept_for_ratio, in its order and in float64: as (1,) tensors, which the exporter does
            # not demote to float32 as it does 0-d ones (and the tolerance added: onnxruntime drops a Mul by 1 + 1e-9)
            patches = (torch.ones(1, dtype=torch.int64) * grid[0] * grid[1]).double()
            ratio = torch.as_tensor(value, dtype=torch.float64).reshape(1)
            tolerance = torch.tensor([RATIO_TOLERANCE], dtype=torch.float64)
            k = (patches * ratio + tolerance * patches).floor().clamp(min=1).long().reshape(())
        if self.value is None or self.name == "k_ratio":
            within = (k >= model.config.num_fill_neighbors) & (k <= grid[0] * grid[1])
            if self.value is None and self.name == "k_ratio":
                within = within & (value > 0) & (value <= 1)
            k = self.budget_check(k, within)
        global_tokens, selector_map = model.selector(pixel_values, grid)
        selected_indices = selector_map.topk(k, dim=-1).indices.sort(dim=-1).values
        prefix_tokens = global_tokens if model.config.extractor_prefix == "selector" else None
        kept = model.extractor(pixel_values, selected_indices, prefix_tokens, return_dict=True).last_hidden_state
        return model.dense_fill(selected_indices, selector_map, grid)(kept), kept[:, 0]

    def forward_mass(self, pixel_values: torch.Tensor, grid: tuple[int, int], k_mass: torch.Tensor):
        """The model's forward at `k_mass`, with the budget module's own helpers (ours or a hub copy)."""
        model = self.model
        module = sys.modules[type(model).__module__.rpartition(".")[0] + ".budget_lookwhere"]
        fewest = model.config.num_fill_neighbors
        global_tokens, selector_map = model.selector(pixel_values, grid)
        kept = module.kept_for_mass(selector_map, k_mass)
        # At least `fewest` slots, which the fill's fixed neighbour count needs; the extra ones are unused, as in a batch.
        slots = torch.clamp(kept.max(), min=fewest)
        within = (k_mass > 0) & (k_mass <= 1) & (slots <= grid[0] * grid[1])
        slots = self.budget_check(slots, within)
        selected_indices = module.select_in_images(selector_map, slots, kept, None)
        prefix_tokens = global_tokens if model.config.extractor_prefix == "selector" else None
        tokens = model.extractor(pixel_values, selected_indices, prefix_tokens, None, True,
                                 return_dict=True).last_hidden_state
        return model.dense_fill(selected_indices, selector_map, grid)(tokens), tokens[:, 0]


def graph_for(model: nn.Module, budget: dict) -> nn.Module:
    """The traceable module of `model` at `budget` (from `budget_for`)."""
    if "num_cores" in budget:
        return VecaGraph(model, budget["num_cores"]).eval()
    return LookWhereGraph(model, budget).eval()


def budget_for(
    config, num_cores: int | None = None, k_ratio: float | None = None, k: int | None = None, elastic: str | None = None
) -> dict:
    """The forward keyword arguments that fix a model's budget (from its config), or with `elastic` (the name of
    the budget input, "" for the model's own: VECA's num_cores, LookWhere's k_ratio) {name: None}, the budget a
    graph input; an option the model does not take is an ExportError."""
    if elastic is not None:
        if num_cores is not None or k_ratio is not None or k is not None:
            raise ExportError("--elastic takes the budget at run time; drop --num-cores / --k-ratio / --k.")
        inputs = ["num_cores"] if isinstance(config, VecaConfig) else ["k_ratio", "k", "k_mass"]
        if elastic not in ("", *inputs):
            raise ExportError(f"--elastic {elastic}: a {config.model_type} graph's budget input is {' or '.join(inputs)}.")
        return {elastic or inputs[0]: None}
    if isinstance(config, VecaConfig):
        if k_ratio is not None or k is not None:
            raise ExportError("--k-ratio / --k are LookWhere budgets; a VECA graph takes --num-cores (or none: all cores).")
        num_cores = num_cores if num_cores is not None else getattr(config, "default_num_cores", None)
        if num_cores is not None and not 1 <= num_cores <= config.num_cores:
            raise ExportError(f"--num-cores {num_cores} is out of range: this model's core bank holds 1..{config.num_cores}.")
        return {"num_cores": num_cores if num_cores is not None else config.num_cores}
    if isinstance(config, LookWhereConfig):
        if num_cores is not None:
            raise ExportError("--num-cores is VECA's budget; a LookWhere graph takes --k-ratio R (k follows the image) or --k K.")
        if k_ratio is not None and k is not None:
            raise ExportError("Give --k-ratio or --k, not both.")
        if k_ratio is not None and not 0 < k_ratio <= 1:
            raise ExportError(f"--k-ratio must lie in (0, 1], got {k_ratio}.")
        if k is not None and k < config.num_fill_neighbors:
            raise ExportError(
                f"--k must be at least num_fill_neighbors ({config.num_fill_neighbors}): the graph's dense fill averages "
                f"that many kept patches per cell; got {k}."
            )
        patches = (config.image_size // config.patch_size) ** 2
        if k is not None and k > patches:
            raise ExportError(
                f"--k {k} is more than the {patches} patches of a {config.image_size} px image: the graph keeps k "
                f"patches of every input, so give --k at most {patches}, or --k-ratio to follow the image size."
            )
        if k is not None:
            return {"k": k}
        return {"k_ratio": k_ratio if k_ratio is not None else config.k_ratio}
    raise ExportError(f"Only VECA and LookWhere models export here, got a {config.model_type!r} model.")


def example_size(config, batch_size: int = 1, scale: float = 1.0) -> tuple[int, int, int, int]:
    """A (B, C, H, W) input shape near `scale` times the training size, non-square, multiples of the patch size."""
    patch = config.patch_size
    side = max(2, round(config.image_size * scale / patch))
    return batch_size, config.num_channels, side * patch, (side + 1) * patch


def example_budget(config, name: str, shape: tuple[int, int, int, int]):
    """A budget to trace an elastic graph with at a (B, C, H, W) input: none that is 1, which the tracer could take
    for a broadcast (the whole bank, half the patches)."""
    if name == "num_cores":
        return config.num_cores
    return (shape[2] // config.patch_size) * (shape[3] // config.patch_size) // 2 if name == "k" else 0.5  # k_ratio, k_mass


def export_onnx(model: nn.Module, path: str, budget: dict, dtype: str = "fp32", verbose: bool = False) -> str:
    """Writes `model` at `budget` as an ONNX graph with dynamic batch, height and width to `path` (through a
    temporary file in the same folder, renamed when complete); a budget of None is an input of the graph (elastic).
    The model is cast to `dtype` in place. Returns `path`."""
    if dtype not in DTYPES:
        raise ExportError(f"--dtype must be one of {sorted(DTYPES)}, got {dtype!r}.")
    register_symbolics()
    graph = graph_for(model.to(DTYPES[dtype]), budget)
    # Non-square, so that no size-dependent shortcut (an unresized position table) is traced in.
    example = torch.randn(example_size(model.config), dtype=DTYPES[dtype])
    inputs = [name for name, value in budget.items() if value is None]
    budgets = [torch.tensor(example_budget(model.config, name, example.shape), dtype=BUDGET_INPUTS[name]) for name in inputs]
    folder = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(suffix=".onnx.partial", dir=folder)
    os.close(handle)
    follow_umask(temporary)
    patches = onnx_rotary(model) if "num_cores" in budget else onnx_position_resize(model)
    try:
        with torch.no_grad(), patches, warnings.catch_warnings():
            if not verbose:  # the tracer's warnings on every Python value it fixes, torch.onnx's on its legacy exporter
                # and on indexing: the checks below (onnxruntime against PyTorch) are what counts
                for category in (torch.jit.TracerWarning, DeprecationWarning, UserWarning):
                    warnings.simplefilter("ignore", category)
            torch.onnx.export(
                graph,
                (example, *budgets),
                temporary,
                dynamo=False,
                opset_version=OPSET,
                input_names=["pixel_values", *inputs],
                output_names=["last_hidden_state", "pooler_output"],
                dynamic_axes={
                    "pixel_values": {0: "batch", 2: "height", 3: "width"},
                    "last_hidden_state": {0: "batch", 1: "tokens"},
                    "pooler_output": {0: "batch"},
                },
            )
        checks = {"/budget_check/Gather": "budget_check", "/budget_shape/Reshape": "budget_shape"}
        finish_graph(temporary, {node: getattr(graph, check).message for node, check in checks.items()
                                 if hasattr(graph, check)})
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
    return path


def check_onnx(model: nn.Module, path: str, budget: dict, shapes: list[tuple[int, int, int, int]]) -> list[dict]:
    """Runs the graph with onnxruntime (CPU) and the model in PyTorch at `budget` (fed to the graph when it takes
    the budget as an input) on random inputs of each (B, C, H, W) shape; returns one {"shape", "max_abs_diff"} per
    shape (the larger of both outputs)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    inputs = {graph_input.name for graph_input in session.get_inputs()}
    feed = {name: torch.tensor(value, dtype=BUDGET_INPUTS[name]).numpy() for name, value in budget.items() if name in inputs}
    dtype = next(model.parameters()).dtype
    results = []
    generator = torch.Generator().manual_seed(0)
    for shape in shapes:
        pixel_values = torch.randn(shape, generator=generator).to(dtype)
        with torch.no_grad():
            outputs = model(pixel_values, **budget)
        expected = (outputs.last_hidden_state, outputs.pooler_output)
        actual = session.run(None, {"pixel_values": pixel_values.numpy(), **feed})
        diff = max((torch.from_numpy(a).float() - e.float()).abs().max().item() for a, e in zip(actual, expected))
        results.append({"shape": tuple(shape), "max_abs_diff": diff})
    return results


def check_budgets(config, budget: dict, shape: tuple[int, int, int, int]) -> list[dict]:
    """The budgets a graph is checked at: its own, or an elastic graph's smallest, largest and some between: VECA 1, 8,
    16 and the whole bank; LookWhere num_fill_neighbors, 10% and all of the patches of a (B, C, H, W) input."""
    ((name, value),) = budget.items()
    if value is not None:
        return [budget]
    patches = (shape[2] // config.patch_size) * (shape[3] // config.patch_size)
    fewest = config.num_fill_neighbors if name != "num_cores" else 1
    if name == "num_cores":
        values = [cores for cores in (1, 8, 16) if cores < config.num_cores] + [config.num_cores]
    elif name == "k":
        values = sorted({fewest, max(fewest, patches // 10), patches})
    elif name == "k_mass":  # one patch, a few, and all of them
        values = [0.01, 0.5, 1.0]
    else:  # fewest + 0.5 patches, so that the floor keeps `fewest`
        values = sorted({(fewest + 0.5) / patches, max(0.1, (fewest + 0.5) / patches), 1.0})
    return [{name: value} for value in values]


def report_checks(model: nn.Module, path: str, budget: dict) -> None:
    """Runs the graph at `path` against the model at `budget` (an elastic graph at each of `check_budgets`), at two
    sizes and batch sizes (`check_onnx`), and prints the largest difference of each."""
    ((name, value),) = budget.items()
    shapes = [example_size(model.config, 1), example_size(model.config, 2, scale=1.5)]
    for checked in check_budgets(model.config, budget, shapes[0]):
        for result in check_onnx(model, path, checked, shapes):
            at = "" if value is not None else f", {name}={checked[name]:g}"
            print(f"onnxruntime vs PyTorch at {result['shape']}{at}: max abs diff {result['max_abs_diff']:.2e}")


def load_config(model_dir: str):
    """The config of a saved VECA or LookWhere folder or hub id."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_dir)
    except (OSError, ValueError) as error:
        raise ExportError(f"Cannot read a model config from {model_dir!r}: {error}".splitlines()[0]) from None
    if not isinstance(config, (VecaConfig, LookWhereConfig)):
        raise ExportError(f"{model_dir!r} holds a {config.model_type!r} model; only VECA and LookWhere export here.")
    return config


def load_model(model_dir: str, config) -> nn.Module:
    """The base model of a saved folder in float32 eval mode, ready to trace."""
    if isinstance(config, VecaConfig):
        # Token chunks would freeze the sequence length into the graph.
        return load_checked(VecaModel, model_dir, dtype=torch.float32, chunk_size_feed_forward=0).eval()
    return load_checked(LookWhereModel, model_dir, dtype=torch.float32).eval()


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (2 and one line on stderr for a bad input)."""
    return run(export_command, argv)


def export_command(argv: list[str] | None) -> None:
    parser = argparse.ArgumentParser(prog="python -m corevision_hf.export", description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("model_dir", help="a saved VECA or LookWhere folder (or hub id)")
    parser.add_argument("output", help="the .onnx file to write")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--num-cores", type=int, help="VECA: active cores (default: config.default_num_cores or all)")
    budget.add_argument("--k-ratio", type=float, help="LookWhere: fraction of the grid kept (default: config.k_ratio)")
    budget.add_argument("--k", type=int, help="LookWhere: a fixed number of kept patches, whatever the image size")
    budget.add_argument("--elastic", nargs="?", const="", metavar="INPUT",
                        help="one graph for every budget, an input at run time: VECA's num_cores; LookWhere's k_ratio "
                             "(the default), k or k_mass")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="weights and input dtype")
    parser.add_argument("--force", action="store_true", help="replace an existing output file that this package wrote")
    parser.add_argument("--no-check", action="store_true", help="skip the onnxruntime comparison")
    parser.add_argument("--verbose", action="store_true", help="show the tracer's and torch.onnx's warnings")
    args = parser.parse_args(argv)

    refuse_overlap(args.output, args.model_dir)
    check_file_output(args.output, args.force, ours=graph_is_ours)
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
        raise ExportError(f"The folder of {args.output} does not exist; create it first.")
    config = load_config(args.model_dir)
    budget = budget_for(config, args.num_cores, args.k_ratio, args.k, args.elastic)
    with reading_weights(args.model_dir):
        model = load_model(args.model_dir, config)
    export_onnx(model, args.output, budget, args.dtype, verbose=args.verbose)
    ((name, value),) = budget.items()
    print(f"wrote {args.output} ({os.path.getsize(args.output) / 2**20:.1f} MiB; "
          f"{f'budget {budget}' if value is not None else f'elastic: the {name} input'}, {args.dtype})")

    if args.no_check:
        return
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        print("onnxruntime is not installed: skipped the comparison (pip install onnxruntime)")
        return
    report_checks(model, args.output, budget)


if __name__ == "__main__":
    sys.exit(main())
