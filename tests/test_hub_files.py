"""The hub files hold the models and nothing else: no branch for one machine, exporter or compiler, no private
operators, no weight mapping from another model; and forward compiles as one graph (no data-dependent Python)."""

from pathlib import Path

import pytest
import torch
from conftest import tiny_lookwhere_config, tiny_veca_config
from test_no_host_sync import PIXEL_MASK

from corevision_hf import LookWhereModel, LookWherePreTrainedModel, VecaModel, VecaPreTrainedModel

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "corevision_hf"
HUB_FILES = sorted(PACKAGE.glob("veca/*_veca.py")) + sorted(PACKAGE.glob("lookwhere/*_lookwhere.py"))
# What the model files used to hold and must not again: export / trace / compile branches, oneDNN prepacking,
# version-counter tricks, a DINOv2 weight mapping.
FORBIDDEN = ["is_in_onnx_export", "is_tracing", "is_compiling", "torch.ops.mkldnn", "._version", "from_teacher("]
# Nor what identifies a machine or times one: latency tables are the package's (`corevision_hf.budget_for_latency`).
MACHINE_READS = ["/proc/cpuinfo", "get_device_name", "platform", "latency_table"]


def test_the_hub_files_are_found():
    assert {path.name for path in HUB_FILES} >= {"modeling_veca.py", "modeling_lookwhere.py"}


@pytest.mark.parametrize("path", HUB_FILES, ids=lambda path: path.name)
def test_hub_file_holds_no_machine_or_exporter_branch(path):
    text = path.read_text()
    assert [word for word in FORBIDDEN + MACHINE_READS if word in text] == []
    assert "prepack" not in text


@pytest.mark.parametrize(
    "build, call",
    [
        (lambda: VecaModel(tiny_veca_config()), {"num_cores": 3}),
        (lambda: LookWhereModel(tiny_lookwhere_config()), {"k": 20}),
        (lambda: LookWhereModel(tiny_lookwhere_config()), {"k_ratio": 0.3, "fill_dense": False}),
        (lambda: VecaModel(tiny_veca_config()), {"num_cores": 3, "pixel_mask": PIXEL_MASK}),
        (lambda: LookWhereModel(tiny_lookwhere_config()), {"k_ratio": 0.3, "pixel_mask": PIXEL_MASK}),
        (lambda: LookWhereModel(tiny_lookwhere_config()), {"k_mass": 0.5, "k_ratio": 0.3}),  # a capped k_mass
        (lambda: LookWhereModel(tiny_lookwhere_config()), {"k_mass": 0.5, "k": 20, "pixel_mask": PIXEL_MASK}),
    ],
)
def test_forward_compiles_as_one_graph(build, call):
    model = build().eval()
    pixel_values = torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(0))
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(pixel_values, **call).last_hidden_state, model(pixel_values, **call).last_hidden_state)


@pytest.mark.parametrize("model_class", [VecaPreTrainedModel, LookWherePreTrainedModel])
def test_saving_is_transformers_own(model_class):
    """As DINOv3: the config's auto_map and the processor's own save carry what a hub repo needs, so the model saves
    with transformers' save_pretrained (`corevision_hf.save_model_folder` adds the processor)."""
    assert "save_pretrained" not in vars(model_class)
