"""Every file the package writes goes through `corevision_hf.atomic`: under a fresh name of its own, then renamed.
A link planted at the old fixed temporary names (`PATH.tmp`, `.NAME.tmp`, `shard-N.tmp`, `OUT.partial/merged`) or at
the path itself is never written through: its target keeps its content, and the path gets the right content."""

import json
import os
from pathlib import Path

import datasets
import pytest
import torch
from safetensors.torch import load_file

from corevision_hf import extract
from corevision_hf.atomic import atomic_path, write_text_atomically
from publishing import publish
from training import checkpointing
from training.teacher_cache import TeacherCache
from training.teacher_mean import FILE, TeacherMean


def planted(tmp_path, *links):
    """A file outside the written folder, and links to it at `links`; returns the file."""
    target = tmp_path / "users-file.txt"
    target.write_text("the user's")
    for link in links:
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target)
    return target


def test_a_link_at_the_path_or_beside_it_is_replaced_not_followed(tmp_path):
    folder = tmp_path / "out"
    target = planted(tmp_path, folder / "a.json", folder / "a.json.tmp", folder / ".a.json.tmp")
    write_text_atomically(folder / "a.json", "new")
    assert target.read_text() == "the user's"
    assert not (folder / "a.json").is_symlink() and (folder / "a.json").read_text() == "new"
    assert sorted(p.name for p in folder.iterdir()) == [".a.json.tmp", "a.json", "a.json.tmp"]  # nothing left over
    umask = os.umask(0)
    os.umask(umask)
    assert (folder / "a.json").stat().st_mode & 0o777 == 0o666 & ~umask  # as `open` would make it, not mkstemp's 0600


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    (tmp_path / "a.json").write_text("old")
    (tmp_path / "b").mkdir()
    for name, folder in (("a.json", False), ("b", True)):
        with pytest.raises(KeyError), atomic_path(tmp_path / name, folder=folder) as temporary:
            assert os.path.dirname(temporary) == str(tmp_path)
            raise KeyError("stopped half way")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b"] and (tmp_path / "a.json").read_text() == "old"


def test_run_json_and_a_published_config(tmp_path):
    target = planted(tmp_path, tmp_path / "run" / "run.json.tmp", tmp_path / "repo" / "config.json")
    checkpointing.write_json(str(tmp_path / "run" / "run.json"), {"script": "training.distill_veca"})
    publish.write_json(str(tmp_path / "repo" / "config.json"), {"model_type": "veca"})
    assert target.read_text() == "the user's"
    assert json.loads((tmp_path / "run" / "run.json").read_text()) == {"script": "training.distill_veca"}
    assert json.loads((tmp_path / "repo" / "config.json").read_text()) == {"model_type": "veca"}


def test_the_teacher_cache_and_the_teacher_mean(tmp_path):
    cache_folder, export = tmp_path / "teacher_cache", tmp_path / "final"
    target = planted(tmp_path, cache_folder / "0_3.safetensors.tmp", export / f"{FILE}.tmp")
    (cache_folder / "cache_info.json").symlink_to(tmp_path / "nowhere.json")  # a fresh cache's info replaces it
    cache = TeacherCache(str(cache_folder), 2, {"teacher": "t"})
    (served,) = cache.targets(lambda pixels: (pixels.sum((1, 2, 3))[:, None],), torch.ones(1, 3, 2, 2),
                              torch.tensor([3]), 0)
    mean = TeacherMean()
    mean.update(torch.ones(2, 4), torch.full((2, 5, 4), 2.0))
    mean.save(str(export))
    assert target.read_text() == "the user's" and not (tmp_path / "nowhere.json").exists()
    assert json.loads((cache_folder / "cache_info.json").read_text()) == {"teacher": "t", "cycle": 2}
    assert served.tolist() == [[12.0]] and load_file(cache_folder / "0_3.safetensors")["0"].tolist() == [12.0]
    assert load_file(export / FILE)["patch"].tolist() == [2.0] * 4


def test_extraction_shards_and_their_merge(tmp_path):
    partial = tmp_path / "features.partial"
    outside = tmp_path / "outside"
    outside.mkdir()
    for link in (partial / "shard-00000.tmp", partial / "shard-00001.tmp", partial / "merged"):
        link.parent.mkdir(exist_ok=True)
        link.symlink_to(outside, target_is_directory=True)
    features = extract.shard_features(2, None)
    extract.write_shard({"id": ["a"], "pooled": [[1.0, 2.0]]}, features, partial / "shard-00000", [])
    extract.write_shard({"id": [], "pooled": []}, features, partial / "shard-00001", ["b.jpg"])
    merged = extract.merge(partial, tmp_path / "features", 2, {"data": "photos"})
    assert list(outside.iterdir()) == []
    assert merged["id"] == ["a"] and merged["pooled"] == [[1.0, 2.0]] and not partial.exists()
    assert json.loads((tmp_path / "features" / extract.INFO_FILE).read_text())["skipped"] == ["b.jpg"]
    assert datasets.load_from_disk(str(tmp_path / "features"))["id"] == ["a"]


def test_an_unfinished_extraction_that_is_a_link_is_one_line(tmp_path, capsys):
    """OUT.partial is where extraction writes as it goes: a link there is refused, its target left as it was."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / extract.SETTINGS_FILE).write_text("{}")
    (tmp_path / "features.partial").symlink_to(outside, target_is_directory=True)
    assert extract.cli([str(tmp_path / "model"), "--data", str(tmp_path), "--output", str(tmp_path / "features")]) == 2
    err = capsys.readouterr().err
    assert "features.partial is a link" in err and err.count("\n") == 1, err
    assert [p.name for p in outside.iterdir()] == [extract.SETTINGS_FILE]


def test_a_manifest_is_written_whole_and_not_through_a_link(tmp_path):
    """The manifest that --force reads (`outputs.record`) replaces a link planted at its name."""
    from corevision_hf.outputs import MANIFEST, read_manifest, record

    target = planted(tmp_path, tmp_path / "out" / MANIFEST)
    (tmp_path / "out" / "a.json").write_text("{}")
    record(str(tmp_path / "out"), ["a.json"])
    assert target.read_text() == "the user's" and not (tmp_path / "out" / MANIFEST).is_symlink()
    assert list(read_manifest(str(tmp_path / "out"))) == ["a.json"]


def test_the_training_image_listing(tmp_path):
    """training.data's listing of an image folder (OUT/image_files.json), read by every process and by a resume."""
    from PIL import Image

    from training.data import cached_image_files

    (tmp_path / "photos").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "photos" / "a.png")
    listing = tmp_path / "run" / "image_files.json"
    target = planted(tmp_path, tmp_path / "run" / f"image_files.json.{os.getpid()}.tmp")
    files, left_out = cached_image_files(tmp_path / "photos", "train", True, str(listing))
    assert target.read_text() == "the user's" and [os.path.basename(f) for f in files] == ["a.png"]
    assert json.loads(listing.read_text())["files"] == files and left_out == 0


def test_a_temporary_name_ends_in_tmp_whatever_the_extension(tmp_path):
    """A file a killed process left is never taken for one of ours by its extension (a listing of "*.safetensors")."""
    with atomic_path(tmp_path / "0_3.safetensors") as temporary:
        assert os.path.basename(temporary).startswith(".0_3.safetensors.") and temporary.endswith(".tmp")
        assert not list(tmp_path.glob("*.safetensors"))


@pytest.mark.parametrize("found", ["link", "file", "folder with a file"])
def test_a_folder_is_never_put_over_a_link_a_file_or_a_full_folder(tmp_path, found):
    """atomic_path(folder=True) says in one line what is in the way, before the block runs, and leaves it as it was."""
    target = planted(tmp_path)
    path = tmp_path / "out"
    if found == "link":
        (tmp_path / "theirs").mkdir()
        path.symlink_to(tmp_path / "theirs")
    elif found == "file":
        path.write_text("mine")
    else:
        path.mkdir()
        (path / "notes.txt").write_text("mine")
    ran = []
    with pytest.raises(FileExistsError, match=f"out is a {found.split(' with')[0]}") as error:
        with atomic_path(path, folder=True):
            ran.append(True)
    assert not ran and "\n" not in str(error.value) and "Move it or choose another path" in str(error.value)
    assert target.read_text() == "the user's" and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["users-file.txt", "out", *(["theirs"] if found == "link" else [])])
    (tmp_path / "empty").mkdir()
    with atomic_path(tmp_path / "empty", folder=True) as temporary:  # an empty folder is replaced
        (Path(temporary) / "a.txt").write_text("new")
    assert (tmp_path / "empty" / "a.txt").read_text() == "new"
