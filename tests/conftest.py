import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import evaluate
import numpy as np
import pytest
import torch
from PIL import Image
from transformers import Dinov2WithRegistersConfig, Dinov2WithRegistersModel

from corevision_hf import LookWhereConfig, LookWhereModel, VecaConfig, VecaModel

ROOT = Path(__file__).resolve().parents[1]


# The one tiny VECA and the one tiny LookWhere of the tests: a test passes only the fields it needs changed.
_VECA_FIELDS = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, patch_size=8, num_cores=8
)


def tiny_veca_config(**overrides) -> VecaConfig:
    """A VECA small enough for CPU tests: width 64, 2 layers, 4 heads of 16, patch 8 (a 32 px image is a 4 x 4 grid),
    a bank of 8 cores."""
    return VecaConfig(**{**_VECA_FIELDS, "image_size": 32, **overrides})


def tiny_lookwhere_config(**overrides) -> LookWhereConfig:
    """Width 32, 3 extractor blocks, 1 selector block, patch 4: a 32 px image is an 8 x 8 grid, the selector a 3 x 3."""
    fields = dict(
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=64,
        patch_size=4,
        image_size=32,
        selector_depth=1,
        selector_image_size=12,
        k_ratio=0.25,
    )
    return LookWhereConfig(**{**fields, **overrides})


def save_task_teacher(folder, **overrides) -> None:
    """A tiny DINOv2 of patch 14 (the sparse-recognition canvases' cell) saved to `folder`, seeded: the teacher of the
    task benchmarks' smoke runs (width 32, 3 layers, 2 heads)."""
    from transformers import Dinov2Config, Dinov2Model

    fields = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64, patch_size=14,
                  image_size=56)
    torch.manual_seed(0)
    Dinov2Model(Dinov2Config(**{**fields, **overrides})).save_pretrained(folder)


def save_extra_photos(folder, count: int = 4) -> list:
    """`count` photos named extra-0.jpg.. in `folder` (copies of the shipped ones, each its own bytes): the
    --extra-photos of the task benchmarks' photo canvases in tests. By their names' hashes extra-0 and extra-2 go to
    the training pool, extra-1 and extra-3 to the test pool. Returns their paths."""
    import shutil
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shipped = sorted((Path(__file__).resolve().parents[1] / "assets" / "photos").glob("*.jpg"))
    paths = [folder / f"extra-{i}.jpg" for i in range(count)]
    for path, source in zip(paths, shipped):
        shutil.copyfile(source, path)
    return paths


def lookwhere_training_numerics() -> dict:
    """The LookWhere student numerics the lookwhere-dinov2 recipe sets (the authors' JAX training): LayerNorm epsilon
    1e-5, tanh GELU in the MLPs and the map head, antialiased resizes of the selector's input and map."""
    from training.arguments import parse_config_overrides
    from training.recipes import load_recipe

    return parse_config_overrides(load_recipe("lookwhere-dinov2")["config_overrides"])


# The tiny teachers (`teacher_dir` below, and those of the evaluation and comparison tests) are 32 wide with patch 8. A
# student distilled from one or compared with one takes these overrides, so that its features are the teacher's width
# (no output projection) and its patch grid the teacher's.
AT_TEACHER_WIDTH = dict(hidden_size=32, num_attention_heads=2, intermediate_size=48)  # VECA (LookWhere is 32 wide)
AT_TEACHER_PATCH = dict(patch_size=8, selector_image_size=16)  # LookWhere (VECA's patch is 8)


def save_tiny_checkpoints(root) -> dict[str, str]:
    """Random (seed 0) VECA and LookWhere at the tiny teachers' width and patch (32, 8), saved as `root/veca` and
    `root/lookwhere`: {name: folder}."""
    torch.manual_seed(0)
    VecaModel(tiny_veca_config(**AT_TEACHER_WIDTH)).save_pretrained(root / "veca")
    LookWhereModel(tiny_lookwhere_config(**AT_TEACHER_PATCH)).save_pretrained(root / "lookwhere")
    return {name: str(root / name) for name in ("veca", "lookwhere")}


def save_tiny_model_folders(root) -> dict[str, str]:
    """Random (seed 0) tiny VECA and LookWhere, each saved with its processor (`save_model_folder`) as `root/veca` and
    `root/lookwhere`: {name: folder}."""
    from corevision_hf import save_model_folder

    torch.manual_seed(0)
    save_model_folder(VecaModel(tiny_veca_config()), root / "veca")
    save_model_folder(LookWhereModel(tiny_lookwhere_config()), root / "lookwhere")
    return {name: str(root / name) for name in ("veca", "lookwhere")}


def count_calls(monkeypatch, module, name: str) -> list:
    """Wraps `module.name` for this test so that each call appends 1 to the list returned: its length is the count."""
    calls, original = [], getattr(module, name)

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls


@pytest.fixture(autouse=True)
def process_state_restored():
    """Every test leaves torch's thread count and the SIGINT handler as it found them: a test that changed the thread
    count (a benchmark's main run in process) would change the float rounding of every later test that compares with
    a subprocess, and an ignored SIGINT is inherited by every later subprocess, which Ctrl-C then cannot stop."""
    threads, sigint = torch.get_num_threads(), signal.getsignal(signal.SIGINT)
    yield
    torch.set_num_threads(threads)
    if signal.getsignal(signal.SIGINT) is not sigint:
        signal.signal(signal.SIGINT, sigint)


@pytest.fixture
def tiny_config() -> VecaConfig:
    return tiny_veca_config()


@pytest.fixture
def tiny_model(tiny_config) -> VecaModel:
    torch.manual_seed(0)
    return VecaModel(tiny_config).eval()


@pytest.fixture
def images() -> torch.Tensor:
    """Two non-square images: a 3 x 5 patch grid."""
    return torch.randn(2, 3, 24, 40, generator=torch.Generator().manual_seed(1))


def load_without_package(tmp_path, loader: str, source: str, inputs: torch.Tensor, env: dict | None = None) -> dict:
    """Runs `loader` (a script: argv = source, inputs path, outputs path) in a fresh Python in which
    `import corevision_hf` fails, so only hub-copied code can serve; returns what it saved."""
    torch.save(inputs, tmp_path / "inputs.pt")
    script = tmp_path / "load.py"
    script.write_text("import sys\nsys.modules[\"corevision_hf\"] = None  # any import of our package raises\n" + loader)
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), **(env or {})}
    subprocess.run(
        [sys.executable, str(script), source, str(tmp_path / "inputs.pt"), str(tmp_path / "outputs.pt")],
        check=True,
        env=env,
        cwd=tmp_path,
    )
    return torch.load(tmp_path / "outputs.pt")


def make_offline_hub_cache(
    tmp_path, folder, repo_id: str, commit: str = "0123456789abcdef0123456789abcdef01234567"
) -> dict:
    """Places `folder` in a hub cache as the main revision (`commit`) of `repo_id`; returns the environment that serves
    `from_pretrained(repo_id)` from it offline (HF_HUB_OFFLINE=1), through the real hub-resolution code."""
    repo = tmp_path / "hub" / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(folder, repo / "snapshots" / commit)
    return {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}


@pytest.fixture
def offline_evaluate(tmp_path, monkeypatch):
    """Offline, with evaluate's module copies and prediction caches in tmp_path; any connection attempt fails."""
    for name in ["HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_EVALUATE_OFFLINE"]:
        monkeypatch.setenv(name, "1")
    # evaluate reads its cache folders and offline flag at import time, so the environment alone is too late.
    monkeypatch.setattr(evaluate.config, "HF_EVALUATE_OFFLINE", True)
    monkeypatch.setattr(evaluate.config, "HF_MODULES_CACHE", tmp_path / "modules")
    monkeypatch.setattr(evaluate.config, "HF_METRICS_CACHE", tmp_path / "metrics")
    # evaluate.load appends its modules cache to sys.path and imports `evaluate_modules` from the first entry that has
    # one: a cache another load of this process put there earlier (holding accuracy but not mean_iou, say) would win
    # over this test's. This test's cache goes first, and folders holding another `evaluate_modules` are left out.
    modules = tmp_path / "modules"
    others = [entry for entry in sys.path if not (Path(entry or ".") / "evaluate_modules").is_dir()]
    monkeypatch.setattr(sys, "path", [str(modules), *others])

    def no_network(*args, **kwargs):
        raise AssertionError("a metric tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    _forget_evaluate_modules()
    yield tmp_path
    _forget_evaluate_modules()


def _forget_evaluate_modules():
    """evaluate imports its script copies as `evaluate_modules.*`, a package bound to the modules cache of the
    process's first load; forgetting it lets each test's own cache serve (and leaves none of ours behind)."""
    for name in [name for name in sys.modules if name.split(".")[0] == "evaluate_modules"]:
        del sys.modules[name]


# ------------------------------------------------------------------------------------- distillation runs (tiny, CPU)

# training.distill_veca's --config-overrides: the tiny VECA at the teacher's width (--image-size sets the resolution)
TINY_VECA = json.dumps({**_VECA_FIELDS, **AT_TEACHER_WIDTH})


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory) -> str:
    """A tiny random DINOv2-with-registers teacher, patch 8, saved like a hub checkpoint."""
    torch.manual_seed(0)
    config = Dinov2WithRegistersConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2, patch_size=8, image_size=32,
        num_register_tokens=4,
    )
    folder = tmp_path_factory.mktemp("teacher")
    Dinov2WithRegistersModel(config).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory) -> str:
    """8 random photos of two sizes in an ImageFolder layout (two classes; labels are never used)."""
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for i in range(8):
        (folder / f"class{i % 2}").mkdir(exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (40 + 4 * i, 48, 3), dtype=np.uint8)).save(folder / f"class{i % 2}" / f"{i}.jpg")
    return str(folder)


def veca_args(teacher_dir, data, output_dir, *extra) -> list[str]:
    """training.distill_veca's arguments for a tiny VECA at 32 px, batch 2 (later flags in `extra` win)."""
    return [
        "--teacher", teacher_dir, "--data", data, "--output-dir", str(output_dir), "--config-overrides", TINY_VECA,
        "--image-size", "32", "--batch-size", "2", "--log-with", "none", "--seed", "3", *extra,
    ]


def lookwhere_args(teacher_dir, data, output_dir, *extra) -> list[str]:
    """training.distill_lookwhere's arguments for a tiny LookWhere at 32 px, batch 2, k in [2, 8]."""
    return [
        "--teacher", teacher_dir, "--data", data, "--output-dir", str(output_dir), "--image-size", "32",
        "--selector-depth", "1", "--selector-image-size", "16", "--k-min", "2", "--k-max", "8", "--batch-size", "2",
        "--log-with", "none", "--seed", "3", *extra,
    ]


def read_metrics(output_dir) -> list[dict]:
    return [json.loads(line) for line in Path(output_dir, "metrics.jsonl").read_text().splitlines()]


def launch_two_processes(tmp_path, module: str, args: list[str]) -> None:
    """`accelerate launch -m module` with training/configs/cpu_2proc.yaml (two gloo processes on the CPU), from the
    repository root; every process left behind whose command line names `tmp_path` is killed afterwards."""
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", "training/configs/cpu_2proc.yaml",
        "-m", module, *args,
    ]
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, cwd=ROOT, env=env)
    try:
        assert process.wait(timeout=300) == 0
    finally:
        kill_processes_naming(tmp_path)


def kill_processes_naming(path) -> None:
    """Kills every process but this one whose command line names `path`: no launcher or worker of a test is left
    behind (torchrun starts workers in sessions of their own)."""
    for pid in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if pid.isdigit() and str(path).encode() in cmdline and int(pid) != os.getpid():
            os.kill(int(pid), signal.SIGKILL)


def nothing_written(folder) -> bool:
    """A refused run wrote nothing: no folder, or, for an error found after the run took the folder, the run lock alone
    (training.run_lock never deletes it: a deleted lock lets two runs lock different files)."""
    from training.run_lock import LOCK_FILE

    return not os.path.exists(folder) or os.listdir(folder) == [LOCK_FILE]
