"""Every Python snippet in README.md and docs/ runs, against local tiny checkpoints with patch 14 and patch 16 in
place of the folders `make demo` writes and the hub ids the pages name, so that neither the front door nor the
handbook can rot. Each page runs in a fresh namespace after the shared set-up (the tiny checkpoints, the features
the extraction command of docs/features.md writes, a working folder): no page leans on another page's variables.
Within a page, each snippet runs after the page's first (its set-up) alone, so that a reader can copy any one of them:
a snippet imports what else it uses, and leans on no variable of another snippet."""

import pathlib
import re

import pytest
import torch
from conftest import AT_TEACHER_WIDTH, tiny_lookwhere_config, tiny_veca_config
from PIL import Image
from transformers import Dinov2WithRegistersConfig, Dinov2WithRegistersModel

from corevision_hf import LookWhereModel, VecaModel, save_model_folder
from corevision_hf import extract


ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(str(path.relative_to(ROOT)) for path in (ROOT / "docs").glob("*.md"))]
SNIPPETS = {page: re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), flags=re.DOTALL) for page in PAGES}


def test_every_python_block_of_every_page_is_run():
    """Each ```python fence of a page is one snippet the test below runs (none lost to the pattern), and the front
    door shows the two it must (loading with a budget, the LookWhere call)."""
    for page, snippets in SNIPPETS.items():
        assert len(snippets) == (ROOT / page).read_text().count("```python"), page
    assert any("num_cores=" in snippet for snippet in SNIPPETS["README.md"])
    assert any("k_ratio=" in snippet for snippet in SNIPPETS["README.md"])


@pytest.fixture(scope="module", params=[14, 16], ids=lambda patch: f"patch{patch}")
def shared_set_up(request, tmp_path_factory) -> dict[str, str]:
    """What the name in the pages is replaced with: the demo's folders, the hub ids and the features folder, each a
    tiny random checkpoint (wide enough for the pages' budgets and layer choices: a bank of 64 cores, 12 LookWhere
    blocks) or what the extraction command wrote."""
    patch, folder = request.param, tmp_path_factory.mktemp(f"patch{request.param}")
    torch.manual_seed(0)  # saved with their processors, as the demo's training export and distill_demo.py save them
    save_model_folder(VecaModel(
        tiny_veca_config(**AT_TEACHER_WIDTH, num_hidden_layers=4, patch_size=patch, num_cores=64, image_size=4 * patch)
    ), folder / "veca")
    save_model_folder(LookWhereModel(
        tiny_lookwhere_config(num_hidden_layers=12, patch_size=patch, image_size=8 * patch,
                              selector_image_size=3 * patch)
    ), folder / "lookwhere")
    Dinov2WithRegistersModel(
        Dinov2WithRegistersConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, mlp_ratio=2,
                                  patch_size=patch, image_size=8 * patch)
    ).save_pretrained(folder / "dinov2")
    for split in ("train", "heldout"):  # docs/fine-tuning.md's ImageFolders (examples/rotation_task.py writes them)
        for label, name in enumerate(("upright", "upside_down")):
            (folder / "rotation" / split / name).mkdir(parents=True)
            for index in range(4):
                Image.new("RGB", (40, 32), (60 * index, 200 * label, 90)).save(folder / "rotation" / split / name /
                                                                               f"photo{index // 2}_{index % 2}.png")
    extract.main([str(folder / "veca"), "--data", str(ROOT / "assets" / "photos"), "--num-cores", "16",
                  "--resolution", str(4 * patch), "--dense-stride", "2", "--output", str(folder / "features")])
    return {
        "outputs/demo/run/final": str(folder / "veca"),
        "outputs/demo/lookwhere": str(folder / "lookwhere"),
        "outputs/teachers/dinov2-small": str(folder / "dinov2"),
        "org/veca-base": str(folder / "veca"),
        "org/lookwhere-base": str(folder / "lookwhere"),
        "facebook/dinov2-with-registers-base": str(folder / "dinov2"),
        "features/": str(folder / "features"),
        "outputs/rotation/train": str(folder / "rotation" / "train"),
        "outputs/rotation/heldout": str(folder / "rotation" / "heldout"),
        "assets/photos/": str(ROOT / "assets" / "photos") + "/",
    }


@pytest.mark.parametrize("page", [page for page in PAGES if SNIPPETS[page]])
def test_each_page_runs_on_its_own(shared_set_up, tmp_path, monkeypatch, page):
    monkeypatch.chdir(tmp_path)  # snippets save pictures and runs into the working folder
    configs = sorted(pathlib.Path(shared_set_up["outputs/demo/run/final"]).parent.glob("*/config.json"))
    before = {path: path.read_bytes() for path in configs}
    set_up = {}
    for number, snippet in enumerate(SNIPPETS[page], start=1):
        for name, replacement in shared_set_up.items():
            snippet = snippet.replace(f'"{name}', f'"{replacement}')
        try:  # the set-up's names, not those of the snippets between
            exec(compile(snippet, f"{page} python snippet {number}", "exec"), set_up if number == 1 else dict(set_up))
        except Exception as error:
            raise AssertionError(f"{page} python snippet {number} failed:\n{snippet}") from error
    # issue #46: a page's snippets leave the user's model folders as they were (a copy is theirs to change)
    assert [path for path in configs if path.read_bytes() != before[path]] == [], f"{page} changed a model folder"
