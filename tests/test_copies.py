"""Each hub repo holds one model's self-contained files, so helpers both models need are repeated, each copy marked
`# Copied from corevision_hf.<module>.<name> [with Old->New]` on the line above it, as transformers marks its copies.
tools/check_copies.py keeps the copies true; these tests run it, show that it catches and fixes a drifted copy, and
that no repeated definition goes unmarked."""

import subprocess
import sys
from pathlib import Path

from tools import check_copies

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "corevision_hf"


def run_checker(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "tools" / "check_copies.py"), *args], capture_output=True,
                          text=True)


def test_the_copies_equal_their_sources():
    result = run_checker()
    assert result.returncode == 0, result.stdout


SOURCE = '''\
class VecaGate:
    def forward(self, x):
        return x * self.scale


def veca_sum(values):
    """Adds."""
    return sum(values)
'''

COPY = '''\
# Copied from corevision_hf.veca.modeling_veca.VecaGate with Veca->LookWhere
class LookWhereGate:
    def forward(self, x):
        return x * self.scale


class LookWherePipeline:
    # Copied from corevision_hf.veca.modeling_veca.VecaGate.forward
    def forward(self, x):
        return x * self.scale


# Copied from corevision_hf.veca.modeling_veca.veca_sum
def veca_sum(values):
    """Adds."""
    return sum(values)
'''


def package(tmp_path, copy: str) -> Path:
    """A corevision_hf tree under `tmp_path` with SOURCE as veca/modeling_veca.py and `copy` as lookwhere/x.py."""
    for folder, text in (("veca/modeling_veca.py", SOURCE), ("lookwhere/x.py", copy)):
        (tmp_path / "corevision_hf" / folder).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "corevision_hf" / folder).write_text(text)
    return tmp_path / "corevision_hf" / "lookwhere" / "x.py"


def test_true_copies_pass(tmp_path):
    package(tmp_path, COPY)
    assert run_checker("--root", str(tmp_path)).returncode == 0


def test_a_drifted_copy_is_reported_in_one_line_and_fixed(tmp_path):
    drifted = COPY.replace("return x * self.scale\n\n\nclass", "return x + self.scale\n\n\nclass")  # the class copy
    drifted = drifted.replace('"""Adds."""\n    return sum(values)', '"""Adds."""\n    return sum(values) + 1')
    path = package(tmp_path, drifted)
    result = run_checker("--root", str(tmp_path))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0] == (f"{path}:1: LookWhereGate drifted from corevision_hf.veca.modeling_veca.VecaGate "
                        "(line 3 of the copy: 'return x + self.scale', source: 'return x * self.scale')")
    assert lines[1].startswith(f"{path}:13: veca_sum drifted") and len(lines) == 3  # the method copy is true
    assert run_checker("--root", str(tmp_path), "--fix").returncode == 0
    assert path.read_text() == COPY


def test_a_copy_of_a_missing_definition_is_reported(tmp_path):
    package(tmp_path, COPY.replace("modeling_veca.veca_sum", "modeling_veca.veca_mean"))
    result = run_checker("--root", str(tmp_path))
    assert result.returncode == 1 and "copies corevision_hf.veca.modeling_veca.veca_mean, which does not exist" in (
        result.stdout)


def marked_copies() -> set[str]:
    """'file:name' of every marked copy in the package."""
    marked = set()
    for path in PACKAGE.glob("*/*.py"):
        text = path.read_text()
        by_line = {first: name for name, (first, _) in check_copies.definitions(text).items()}
        for index, line in enumerate(text.splitlines()):
            if check_copies.MARKER.match(line) and index + 2 in by_line:  # not a whole-file marker
                marked.add(f"{path.name}:{by_line[index + 2]}")
    return marked


def test_every_repeated_definition_is_a_marked_copy():
    """A LookWhere definition (six lines or more) equal to a VECA one once the names are swapped is marked, so the
    checker keeps it true: no unmarked copy can drift."""
    repeated = set()
    for lookwhere_path in sorted((PACKAGE / "lookwhere").glob("*.py")):
        ours = lookwhere_path.read_text()
        our_blocks = {name: check_copies.block(ours.splitlines(), *span)
                      for name, span in check_copies.definitions(ours).items()}
        for veca_path in sorted((PACKAGE / "veca").glob("*.py")):
            if check_copies.MARKER.match(ours.partition("\n")[0]):
                continue  # a whole copied file (the image processor), checked as one
            theirs = veca_path.read_text()
            for name, span in check_copies.definitions(theirs).items():
                source = check_copies.replaced(check_copies.block(theirs.splitlines(), *span),
                                               "Veca->LookWhere, veca->lookwhere")
                name = name.replace("Veca", "LookWhere")
                if our_blocks.get(name) == source and source.count("\n") >= 5:
                    repeated.add(f"{lookwhere_path.name}:{name}")
    marked = marked_copies()
    # a method of a marked class is part of the marked copy
    unmarked = {copy_id for copy_id in repeated - marked if copy_id.rsplit(".", 1)[0] not in marked}
    assert not unmarked, f"unmarked copies: {sorted(unmarked)}"
    assert repeated, "no repeated definition found: the search is broken"


def test_lookwhere_marks_its_copies_the_transformers_way():
    """transformers' `# Copied from <module>.<name>`, which the checker reads; not a `# Same as` it would skip."""
    for path in (PACKAGE / "lookwhere").glob("*.py"):
        assert "# Same as" not in path.read_text(), path


def test_a_whole_file_copy_is_checked_and_fixed(tmp_path):
    """A marker naming a module on a file's first line: the rest of the file is that module, names replaced."""
    marker = "# Copied from corevision_hf.veca.modeling_veca with Veca->LookWhere, veca->lookwhere\n"
    true_copy = marker + SOURCE.replace("Veca", "LookWhere").replace("veca", "lookwhere")
    path = package(tmp_path, true_copy)
    assert run_checker("--root", str(tmp_path)).returncode == 0
    path.write_text(true_copy.replace("x * self", "x / self"))
    result = run_checker("--root", str(tmp_path))
    assert result.returncode == 1
    assert result.stdout.splitlines()[0] == (
        f"{path}:1: the file drifted from corevision_hf.veca.modeling_veca "
        "(line 3 of the copy: 'return x / self.scale', source: 'return x * self.scale')")
    assert run_checker("--root", str(tmp_path), "--fix").returncode == 0
    assert path.read_text() == true_copy


def test_the_image_processor_is_a_whole_file_copy():
    first = (PACKAGE / "lookwhere" / "image_processing_lookwhere.py").read_text().partition("\n")[0]
    assert check_copies.MARKER.match(first).group(2) == "veca.image_processing_veca"
