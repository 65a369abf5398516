"""Files a command reads that are damaged or of another kind (a run record, a pickled checkpoint, an ONNX input) and
numbers past what a float holds: each is one ValueError line naming the problem, never a traceback."""

import importlib.util
import json
import re

import pytest
import torch
from conftest import ROOT, TINY_VECA, tiny_veca_config, veca_args
from transformers import AutoModel

from corevision_hf import VecaModel
from corevision_hf.cli import run
from training import distill_veca
from training.checkpointing import check_new_or_resumed_run

RESUME = {"script": "training.distill_veca", "args": {"resume": True, "overwrite": False, "seed": 0},
          "num_processes": 1}
RUN_RECORDS = {
    "without num_processes": (json.dumps({"script": "training.distill_veca", "args": {"seed": 0}}),
                              "no num_processes of the kind a run writes"),
    "args a list": (json.dumps({"script": "training.distill_veca", "args": [], "num_processes": 1}),
                    "no args of the kind a run writes"),
    "truncated": ('{"script": "training.distill_veca", "args": {"se', "not valid JSON: "),
    "not an object": ("[1, 2]", "no script or args or num_processes"),
}


@pytest.mark.parametrize("case", RUN_RECORDS)
def test_a_damaged_run_record_is_one_line_naming_it(tmp_path, case):
    text, problem = RUN_RECORDS[case]
    (tmp_path / "run.json").write_text(text)
    with pytest.raises(ValueError, match=rf"^--resume: {tmp_path / 'run.json'} is not a run record \(.*{problem}") as e:
        check_new_or_resumed_run(str(tmp_path), RESUME)
    assert "\n" not in str(e.value) and "start again with --overwrite" in str(e.value)


@pytest.fixture(scope="module")
def pickled(teacher_dir, tmp_path_factory) -> dict[str, str]:
    """Folders whose pytorch_model.bin pickles the whole model (torch.save(model)), beside their config.json: a
    teacher and a VECA. Weights-only loading refuses such a pickle (it would run code)."""
    root = tmp_path_factory.mktemp("pickled")
    folders = {"teacher": AutoModel.from_pretrained(teacher_dir), "veca": VecaModel(tiny_veca_config(**json.loads(TINY_VECA)))}
    for name, model in folders.items():
        model.save_pretrained(root / name)
        (root / name / "model.safetensors").unlink()
        torch.save(model, root / name / "pytorch_model.bin")
    return {name: str(root / name) for name in folders}


PICKLE_REFUSED = "cannot be loaded (a pickle of more than tensors, which is never unpickled)"


@pytest.mark.parametrize("option", ["--teacher", "--init-from"])
def test_a_pickled_model_as_teacher_or_init_is_one_line(teacher_dir, image_dir, pickled, tmp_path, option, capsys):
    teacher = pickled["teacher"] if option == "--teacher" else teacher_dir
    extra = ["--init-from", pickled["veca"]] if option == "--init-from" else []
    code = run(distill_veca.main, veca_args(teacher, image_dir, tmp_path / "out", "--max-steps", "1", *extra))
    err = capsys.readouterr().err.strip().splitlines()
    name = pickled["teacher" if option == "--teacher" else "veca"]
    assert code == 2 and err[-1].startswith(f"error: The weights of {name!r} {PICKLE_REFUSED}"), err[-1]


def test_a_pickled_model_on_the_demo_page_is_one_line(pickled):
    gr = pytest.importorskip("gradio", reason="the demo page needs gradio: pip install -e '.[app]'")
    spec = importlib.util.spec_from_file_location("demo_app", ROOT / "space" / "app.py")
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    with pytest.raises(gr.Error, match=re.escape(f"The weights of {pickled['veca']!r} {PICKLE_REFUSED}")):
        app.load_model(pickled["veca"])
