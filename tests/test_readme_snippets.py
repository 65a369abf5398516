"""Every Python snippet in README.md and docs/ runs, against local tiny checkpoints with patch 14 and patch 16 in
place of the hub ids it names, so that neither the front door nor the handbook can rot. The pages run in reading
order in one namespace: docs/usage.md continues the README's snippet."""

import pathlib
import re

import pytest
import torch
from transformers import Dinov2WithRegistersConfig, Dinov2WithRegistersModel

from corevision_hf import LookWhereConfig, LookWhereModel, VecaConfig, VecaModel
from corevision_hf import extract


ROOT = pathlib.Path(__file__).resolve().parents[1]
# Reading order: the README, then the pages whose snippets build on it.
PAGES = ["README.md", *(f"docs/{name}.md" for name in (
    "usage", "parity", "onnx", "training", "evaluation-and-publishing", "features", "pictures-and-demo-page",
    "failure-modes", "speed", "quality", "demo", "development"))]
SNIPPETS = [
    (page, snippet)
    for page in PAGES
    for snippet in re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), flags=re.DOTALL)
]


def test_every_page_with_a_code_block_is_in_the_reading_order():
    pages = {str(path.relative_to(ROOT)) for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]}
    assert pages == set(PAGES)


def tiny_checkpoints(folder: pathlib.Path, patch: int) -> dict[str, str]:
    """Hub id -> a local folder holding a tiny random model of that kind (wide enough for the README's budgets and
    layer choices: a bank of 64 cores, 12 LookWhere blocks)."""
    torch.manual_seed(0)
    VecaModel(
        VecaConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=48, patch_size=patch,
                   num_cores=64, image_size=4 * patch)
    ).save_pretrained(folder / "veca")
    LookWhereModel(
        LookWhereConfig(hidden_size=32, num_hidden_layers=12, num_attention_heads=2, intermediate_size=64,
                        patch_size=patch, image_size=8 * patch, selector_depth=1, selector_image_size=3 * patch)
    ).save_pretrained(folder / "lookwhere")
    Dinov2WithRegistersModel(
        Dinov2WithRegistersConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, mlp_ratio=2,
                                  patch_size=patch, image_size=8 * patch)
    ).save_pretrained(folder / "dinov2")
    return {
        "org/veca-base": str(folder / "veca"),
        "outputs/demo/run/final": str(folder / "veca"),
        "org/lookwhere-base": str(folder / "lookwhere"),
        "facebook/dinov2-with-registers-base": str(folder / "dinov2"),
    }


def test_the_readme_has_python_snippets():
    assert len(SNIPPETS) >= 4


@pytest.mark.parametrize("patch", [14, 16])
def test_readme_snippets_run(tmp_path, monkeypatch, patch):
    replacements = tiny_checkpoints(tmp_path, patch)
    # The features snippet reads what the README's extraction command writes: run that command first.
    extract.main([replacements["org/veca-base"], "--data", str(ROOT / "assets" / "photos"), "--num-cores", "16",
                  "--resolution", str(4 * patch), "--dense-stride", "2", "--output", str(tmp_path / "features")])
    replacements["features/"] = str(tmp_path / "features")
    monkeypatch.chdir(tmp_path)  # snippets save pictures into the working folder
    namespace = {}
    for number, (page, snippet) in enumerate(SNIPPETS, start=1):
        for name, folder in replacements.items():
            snippet = snippet.replace(f'"{name}"', repr(folder))
        snippet = snippet.replace('"assets/photos/', '"' + str(ROOT / "assets" / "photos") + "/")
        try:
            exec(compile(snippet, f"{page} python snippet {number}", "exec"), namespace)
        except Exception as error:
            raise AssertionError(f"{page} python snippet {number} failed with patch {patch}:\n{snippet}") from error
