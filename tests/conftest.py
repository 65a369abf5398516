import os
import shutil
import socket
import subprocess
import sys

import evaluate
import pytest
import torch

from corevision_hf import VecaConfig, VecaModel


def tiny_veca_config(**overrides) -> VecaConfig:
    """A VECA small enough for CPU tests: width 64, 2 layers, 4 heads of 16, patch 8, a bank of 8 cores."""
    fields = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=96,
        patch_size=8,
        num_cores=8,
        image_size=32,
    )
    return VecaConfig(**{**fields, **overrides})


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


def make_offline_hub_cache(tmp_path, folder, repo_id: str) -> dict:
    """Places `folder` in a hub cache as the main revision of `repo_id`; returns the environment that serves
    `from_pretrained(repo_id)` from it offline (HF_HUB_OFFLINE=1), through the real hub-resolution code."""
    commit = "0123456789abcdef0123456789abcdef01234567"
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
    monkeypatch.setattr(sys, "path", list(sys.path))  # evaluate.load appends the modules cache to sys.path

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
