"""The run lock (training.run_lock): one live run per output folder whatever each run's TMPDIR, and a link planted
where the lock goes is refused, never followed."""

import os
import subprocess
import sys
import tempfile

import pytest
from conftest import ROOT

from training import run_lock

HOLD = ("import sys, time; from training.run_lock import lock_output_dir; lock_output_dir(sys.argv[1]); "
        "print(flush=True); time.sleep(600)")


def test_a_run_with_another_tmpdir_is_refused_while_the_first_holds_the_folder(tmp_path, monkeypatch):
    out = tmp_path / "out"
    (tmp_path / "tmp_a").mkdir()
    (tmp_path / "tmp_b").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp_a"), "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE)
    try:
        holder.stdout.readline()  # the first run holds the lock
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp_b"))  # this run's TMPDIR is another
        with pytest.raises(ValueError, match=rf"^Another run \(process {holder.pid}\) is writing into {out}: wait"):
            run_lock.lock_output_dir(str(out))
    finally:
        holder.kill()
        holder.wait()
    run_lock.lock_output_dir(str(out))  # the first run is gone: its lock with it
    run_lock.release_output_dirs()


def test_a_second_run_is_refused_in_a_subprocess_with_another_tmpdir(tmp_path):
    out = tmp_path / "out"
    runs = []
    for name in ("tmp_a", "tmp_b"):
        (tmp_path / name).mkdir()
        env = {**os.environ, "TMPDIR": str(tmp_path / name), "PYTHONPATH": os.pathsep.join(sys.path)}
        runs.append(subprocess.Popen([sys.executable, "-c", HOLD, str(out)], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        if name == "tmp_a":
            runs[0].stdout.readline()
    try:
        _, err = runs[1].communicate(timeout=60)
        assert runs[1].returncode == 1 and f"ValueError: Another run (process {runs[0].pid})" in err
    finally:
        for process in runs:
            process.kill()
            process.wait()


@pytest.mark.parametrize("planted", ["symlink", "dangling symlink", "folder"])
def test_a_link_where_the_lock_goes_is_refused_and_its_target_untouched(tmp_path, planted):
    out, target = tmp_path / "out", tmp_path / "precious.txt"
    out.mkdir()
    target.write_text("a file a root run could write")
    path = run_lock.lock_path(str(out))
    if planted == "symlink":
        os.symlink(target, path)
    elif planted == "dangling symlink":
        os.symlink(tmp_path / "created-by-the-run", path)
    else:
        os.mkdir(path)
    with pytest.raises(ValueError, match=r"is (a symbolic link|not a regular file), not a run lock: remove it"):
        run_lock.lock_output_dir(str(out))
    assert target.read_text() == "a file a root run could write"
    assert not (tmp_path / "created-by-the-run").exists()


def test_the_lock_is_in_the_output_folder_and_never_truncated(tmp_path):
    out = tmp_path / "out"
    run_lock.lock_output_dir(str(out))
    try:
        assert os.path.dirname(run_lock.lock_path(str(out))) == str(out)
        assert open(run_lock.lock_path(str(out))).read().strip() == str(os.getpid())
    finally:
        run_lock.release_output_dirs()
