"""Without network, a hub id is one line in about a second that says how to work offline, not half a minute of
retries (corevision_hf.offline.check_hub_reachable, called by the command lines before loading by name)."""

import socket
import time

import pytest
from conftest import make_offline_hub_cache
from huggingface_hub import constants
from PIL import Image

from corevision_hf.convert import lookwhere as convert_lookwhere
from corevision_hf.extract import cli as extract_cli
from corevision_hf.offline import check_hub_reachable
from corevision_hf.visualize import cli as visualize_cli


@pytest.fixture
def no_network(monkeypatch):
    """Every connection fails at once, as on a machine without network; records the hosts asked for."""
    asked = []

    def refuse(address, *args, **kwargs):
        asked.append(address)
        raise OSError("Name or service not known")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for name in ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    return asked


def test_an_unreachable_hub_is_one_line_naming_the_offline_ways(no_network, tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ConnectionError) as error:
        check_hub_reachable("org/veca-base")
    message = str(error.value)
    assert "\n" not in message and "HF_HUB_OFFLINE=1" in message and "local model folder" in message
    assert "load config.json of 'org/veca-base'" in message and "which does not hold it" in message
    assert no_network == [("huggingface.co", 443)]


def test_behind_a_proxy_the_proxy_is_asked(no_network, tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("https_proxy", "http://proxy.example:3128")
    with pytest.raises(ConnectionError):
        check_hub_reachable("org/veca-base")
    assert no_network == [("proxy.example", 3128)]


def test_the_message_says_when_the_cache_holds_the_model(no_network, tmp_path, monkeypatch):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    cache = make_offline_hub_cache(tmp_path, tmp_path / "model", "org/x")["HF_HUB_CACHE"]
    monkeypatch.setattr(constants, "HF_HUB_CACHE", cache)
    with pytest.raises(ConnectionError, match="HF_HUB_OFFLINE=1 to use the hub cache, which holds it"):
        check_hub_reachable("org/x")


def test_folders_offline_mode_and_non_ids_never_touch_the_network(no_network, tmp_path, monkeypatch):
    check_hub_reachable(str(tmp_path))  # a folder
    check_hub_reachable("/no/such/folder")  # not a hub id: the loader's own (fast) error follows
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    check_hub_reachable("org/veca-base")
    assert no_network == []


def test_a_command_fails_in_a_second_with_one_line(no_network, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    Image.new("RGB", (32, 24)).save(tmp_path / "photo.png")
    start = time.perf_counter()
    assert visualize_cli(["org/veca-base", str(tmp_path / "photo.png"), "--output", str(tmp_path / "out.png")]) == 2
    assert time.perf_counter() - start < 2
    error = capsys.readouterr().err
    assert error.startswith("error: https://huggingface.co cannot be reached") and error.count("\n") == 1


def test_extract_fails_in_a_second_with_one_line(no_network, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    start = time.perf_counter()
    assert extract_cli(["org/veca-base", "--data", str(tmp_path), "--output", str(tmp_path / "features")]) == 2
    assert time.perf_counter() - start < 2
    assert "HF_HUB_OFFLINE=1" in capsys.readouterr().err


def test_the_release_download_says_how_to_work_without_the_hub(no_network, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    assert convert_lookwhere.main(["--from-hub", "dinov2", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "cannot be reached to load lookwhere_dinov2.pt of 'antofuller/lookwhere'" in error
    assert "download lookwhere_dinov2.pt yourself and run: python -m corevision_hf.convert.lookwhere FILE" in error
