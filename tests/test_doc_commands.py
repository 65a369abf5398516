"""Every command line of a ```bash block in README.md and docs/*.md names things that exist after `make demo`: the
module of every `python -m X` (or `accelerate launch ... -m X`) answers `--help` in a fresh process, every
`make TARGET` is a Makefile target, and every argument that is a repository path (its first part one of the
repository's folders: assets/..., outputs/demo/..., benchmarks/...) exists in the repository or is a folder
`make demo` writes. Running the commands themselves (minutes to hours, some on a GPU or against the hub) is out of
scope: this checks that a reader who copies a line gets the program and the files it names."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(str(path.relative_to(ROOT)) for path in (ROOT / "docs").glob("*.md"))]
# The repository's own folders: an argument starting with one of them is a repository path, anything else (out/...,
# runs/..., photos/, a hub id) is the reader's own.
REPOSITORY_FOLDERS = {"assets", "benchmarks", "docs", "evaluation", "examples", "experiments", "model_cards", "outputs",
                      "publishing", "space", "src", "tests", "tools", "training", "web"}
# What `make demo` writes (examples/distill_demo.py, docs/demo.md), so that the pages may name it before it exists.
DEMO_FOLDERS = ["outputs/demo/run/final", "outputs/demo/lookwhere", "outputs/demo/evaluation",
                "outputs/demo/hub", "outputs/teachers/"]
# Folders an example script writes by default: a page may name them after running that script.
EXAMPLE_FOLDERS = {"outputs/rotation/": "examples/rotation_task.py",
                   "outputs/rotation_gcompris/": "examples/rotation_task.py",
                   "outputs/rotation_val/": "examples/rotation_task.py",
                   "outputs/gcompris_photos/": "examples/gcompris_photos.py"}
# Options whose value is a file or folder the command writes: it need not exist before.
OUTPUT_OPTIONS = {"--out", "--output", "--output-dir", "--out-dir", "--plot", "--staging-dir", "--scratch-dir"}


def bash_blocks(page: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", (ROOT / page).read_text(), flags=re.DOTALL)


def command_lines(page: str) -> list[list[str]]:
    """The page's bash commands as shell words, continuation lines joined and comments dropped."""
    lines = [line for block in bash_blocks(page) for line in block.replace("\\\n", " ").splitlines()]
    return [words for words in (shlex.split(line, comments=True) for line in lines) if words]


COMMANDS = [(page, words) for page in PAGES for words in command_lines(page)]


def module_of(words: list[str]) -> str | None:
    """X of `python -m X ...` or `accelerate launch ... -m X ...`; None for any other command."""
    if words[0] in ("python", "python3", "accelerate") and "-m" in words:
        return words[words.index("-m") + 1]
    return None


def repository_paths(words: list[str]) -> list[str]:
    """The arguments (values of KEY=VALUE and --option=VALUE included) that are repository paths, less the values of
    options that name what the command writes."""
    paths = []
    for before, word in zip([None, *words], words):
        value = word.split("=", 1)[1] if "=" in word else word
        if before in OUTPUT_OPTIONS or word.split("=", 1)[0] in OUTPUT_OPTIONS:
            continue
        if value.split("/", 1)[0] in REPOSITORY_FOLDERS and "/" in value:
            paths.append(value)
    return paths


def make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), flags=re.MULTILINE))


def test_every_bash_block_is_read():
    """Each page's ```bash fences are all found (none lost to the pattern), and the front door's commands are among
    them, so that the checks below cannot pass on nothing."""
    for page in PAGES:
        assert len(bash_blocks(page)) == (ROOT / page).read_text().count("```bash"), page
    assert ["make", "demo"] in [words for page, words in COMMANDS if page == "README.md"]
    assert len({module_of(words) for _, words in COMMANDS} - {None}) >= 5


def test_the_demo_folders_are_what_make_demo_writes():
    """The folders this test allows before they exist are the ones the demo's script and page name."""
    written = (ROOT / "examples" / "distill_demo.py").read_text() + (ROOT / "docs" / "demo.md").read_text()
    for folder in DEMO_FOLDERS:
        assert folder in written, f"{folder}: neither examples/distill_demo.py nor docs/demo.md names it"


@pytest.mark.parametrize("page, words", COMMANDS, ids=lambda item: " ".join(item)[:60] if isinstance(item, list)
                         else item)
def test_every_named_thing_exists(page, words):
    if words[0] == "make":
        targets = [word for word in words[1:] if "=" not in word and not word.startswith("-")]
        assert set(targets) <= make_targets(), f"{page}: `{' '.join(words)}` names no Makefile target"
    for path in repository_paths(words):
        made_by_demo = any((path + "/").startswith(folder.rstrip("/") + "/") for folder in DEMO_FOLDERS)
        made_by_example = any((path + "/").startswith(folder) and any(script in line for line in bash_blocks(page))
                              for folder, script in EXAMPLE_FOLDERS.items())
        assert (ROOT / path).exists() or made_by_demo or made_by_example, (
            f"{page}: `{' '.join(words)}` names {path}, which is neither in the repository nor written by make demo "
            "or by an example script the page runs")


@pytest.mark.parametrize("module", sorted({module_of(words) for _, words in COMMANDS} - {None}))
def test_every_module_answers_help(module):
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT),
                                                                 os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, env=environment, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0 and "usage" in result.stdout.lower(), f"python -m {module} --help:\n{result.stderr}"
