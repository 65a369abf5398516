"""`python -m corevision_hf.convert.lookwhere --from-hub dinov2 OUT`: the released file downloaded (mocked here: the
parity fixture served from a fake hub cache), checked against its sha256, converted; bad cases are one line."""

import hashlib
import os
import shutil
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants

from corevision_hf import LookWhereModel
from corevision_hf.convert import lookwhere as convert_lookwhere
from corevision_hf.convert import lookwhere_release


FIXTURES = Path(__file__).parent / "fixtures" / "parity" / "lookwhere"


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """Serves the parity fixtures as hf_hub_download would: snapshots/<commit>/<file> linking to blobs/<sha256>.
    Returns the calls made; `fake_hub.blob_name` (sha256 by default) and `fake_hub.error` change what is served."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(lookwhere_release, "check_hub_reachable", lambda *args, **kwargs: None)  # the mock downloads

    class Hub:
        calls, blob_name, error = [], None, None

    def download(repo_id, filename, revision=None):
        Hub.calls.append((repo_id, filename, revision))
        if Hub.error:
            raise Hub.error
        source = FIXTURES / filename
        blob = tmp_path / "cache" / "blobs" / (Hub.blob_name or hashlib.sha256(source.read_bytes()).hexdigest())
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, blob)
        link = tmp_path / "cache" / "snapshots" / ("0" * 40) / filename
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
        return str(link)

    monkeypatch.setattr(lookwhere_release, "hf_hub_download", download)
    return Hub


def run_failing(argv, capsys) -> str:
    assert convert_lookwhere.main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1, error
    return error


@pytest.mark.parametrize("release", ["dinov2", "franca"])
def test_released_weights_in_one_command(fake_hub, tmp_path, capsys, release):
    out = tmp_path / "lookwhere"
    convert_lookwhere.main(["--from-hub", release, str(out)])
    filename = f"lookwhere_{release}.pt"
    assert fake_hub.calls == [("antofuller/lookwhere", filename, lookwhere_release.REVISION)]
    printed = capsys.readouterr().out.splitlines()
    assert "sha256 checked against the hub's ETag" in printed[0]
    assert [line.split(":")[0].strip() for line in printed[1:]] == ["load", "evaluate", "publish"]
    assert f"AutoModel.from_pretrained('{out}', trust_remote_code=True)" in printed[1]
    # the same weights as converting the file by hand
    convert_lookwhere.main([str(FIXTURES / filename), str(tmp_path / "by-hand")])
    downloaded = LookWhereModel.from_pretrained(out).state_dict()
    by_hand = LookWhereModel.from_pretrained(tmp_path / "by-hand").state_dict()
    assert downloaded.keys() == by_hand.keys()
    assert all(torch.equal(downloaded[key], by_hand[key]) for key in by_hand)


def test_unknown_release(fake_hub, tmp_path, capsys):
    error = run_failing(["--from-hub", "dinov3", str(tmp_path / "out")], capsys)
    assert "Unknown LookWhere release 'dinov3'; choose one of ['dinov2', 'franca']" in error
    assert fake_hub.calls == [] and not (tmp_path / "out").exists()


def test_a_download_cut_halfway_leaves_nothing(fake_hub, tmp_path, capsys):
    fake_hub.error = ConnectionError("Connection broken: IncompleteRead(1048576 bytes read, 2208417 more expected)")
    error = run_failing(["--from-hub", "dinov2", str(tmp_path / "out")], capsys)
    assert "Downloading lookwhere_dinov2.pt from the hub repo antofuller/lookwhere failed (Connection broken" in error
    assert "rerun the same command to resume it" in error
    assert sorted(os.listdir(tmp_path)) == []  # no output folder, no staging folder


def test_a_checksum_mismatch_is_removed_from_the_cache(fake_hub, tmp_path, capsys):
    fake_hub.blob_name = "0" * 64  # the hub's sha256 that the served file does not have
    error = run_failing(["--from-hub", "dinov2", str(tmp_path / "out")], capsys)
    assert "lookwhere_dinov2.pt from antofuller/lookwhere is corrupted" in error and "rerun" in error
    assert not (tmp_path / "out").exists()
    assert os.listdir(tmp_path / "cache" / "blobs") == []  # a rerun downloads it again
    assert os.listdir(tmp_path / "cache" / "snapshots" / ("0" * 40)) == []


def test_an_existing_output_is_refused_before_downloading(fake_hub, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    error = run_failing(["--from-hub", "dinov2", str(tmp_path / "out")], capsys)
    assert "is not empty" in error and fake_hub.calls == []
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"


def test_offline_the_real_download_serves_the_hub_cache(tmp_path, monkeypatch, capsys):
    """No mock: huggingface_hub's own hf_hub_download with HF_HUB_OFFLINE=1 finds the file in a hub cache laid out as
    it writes one (refs/main, snapshots/<commit>/<file> -> blobs/<sha256>)."""
    source = FIXTURES / "lookwhere_dinov2.pt"
    repo = tmp_path / "hub" / "models--antofuller--lookwhere"
    blob = repo / "blobs" / hashlib.sha256(source.read_bytes()).hexdigest()
    blob.parent.mkdir(parents=True)
    shutil.copy(source, blob)
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "lookwhere_dinov2.pt").symlink_to(f"../../blobs/{blob.name}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    convert_lookwhere.main(["--from-hub", "dinov2", str(tmp_path / "out")])
    assert f"sha256 checked against the hub's ETag ({blob.name[:12]}" in capsys.readouterr().out
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_offline_without_the_file_in_the_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    error = run_failing(["--from-hub", "franca", str(tmp_path / "out")], capsys)
    assert "lookwhere_franca.pt of antofuller/lookwhere is not in the hub cache, and HF_HUB_OFFLINE=1" in error
    assert not (tmp_path / "out").exists()
