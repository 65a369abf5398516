"""Each hub repo holds one model's self-contained files, so helpers both models need are repeated, each copy marked
`# Same as <module>.<name>` on the line above it. This test keeps the copies true: every marked definition equals
its source with the model's name substituted (Veca <-> LookWhere), as transformers checks its "Copied from" code."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "corevision_hf"
MARKER = re.compile(r"\s*# Same as (\w+)\.([\w.]+)\s*$")
NAMES = {"veca": ("Veca", "veca"), "lookwhere": ("LookWhere", "lookwhere")}


def definitions(path: Path) -> dict[str, tuple[int, str]]:
    """Top-level functions and classes, and methods as Class.method: name -> (first line, source)."""
    text = path.read_text()
    found = {}
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found[node.name] = (node.lineno, ast.get_source_segment(text, node))
            for sub in node.body if isinstance(node, ast.ClassDef) else []:
                if isinstance(sub, ast.FunctionDef):  # a decorated method starts at its first decorator
                    first = sub.decorator_list[0].lineno if sub.decorator_list else sub.lineno
                    found[f"{node.name}.{sub.name}"] = (first, ast.get_source_segment(text, sub))
    return found


def marked_copies() -> list[tuple[str, Path, str, str]]:
    """(copy's id, source module path, source name, copy's source) for every marker in the hub-copied files."""
    copies = []
    for path in sorted(PACKAGE.glob("*/*.py")):
        lines = path.read_text().splitlines()
        by_line = {line: (name, source) for name, (line, source) in definitions(path).items()}
        for index, line in enumerate(lines):
            if match := MARKER.match(line):
                module, name = match.groups()
                copy_name, copy_source = by_line[index + 2]  # the definition right below the marker (1-based lines)
                copies.append((f"{path.name}:{copy_name}", next(PACKAGE.glob(f"*/{module}.py")), name, copy_source))
    return copies


COPIES = marked_copies()


def whole_file_copy(veca_path: Path, lookwhere_path: Path) -> bool:
    source = veca_path.read_text()
    return lookwhere_path.read_text() == source.replace("Veca", "LookWhere").replace("VECA", "LookWhere").replace(
        "veca", "lookwhere")


def test_every_repeated_definition_is_a_marked_copy():
    """A definition in both models' files that is the same once the names are swapped is marked (so this test keeps
    it true), and every marker sits on such a definition: no unmarked copy can drift."""
    repeated = set()
    for lookwhere_path in sorted((PACKAGE / "lookwhere").glob("*.py")):
        veca_path = PACKAGE / "veca" / lookwhere_path.name.replace("lookwhere", "veca")
        if not veca_path.exists() or whole_file_copy(veca_path, lookwhere_path):
            continue  # a whole generated file (the image processor) is checked as one in test_image_processor
        ours = definitions(lookwhere_path)
        for name, (_, source) in definitions(veca_path).items():
            for old, new in zip(NAMES["veca"], NAMES["lookwhere"]):
                source, name = source.replace(old, new), name.replace(old, new)
            if name in ours and ours[name][1] == source and source.count("\n") >= 5:  # six lines, as `duplicates`
                repeated.add(f"{lookwhere_path.name}:{name}")
    marked = {copy_id for copy_id, *_ in COPIES}
    # a method of a marked class is part of the marked copy
    unmarked = {copy_id for copy_id in repeated - marked if copy_id.rsplit(".", 1)[0] not in marked}
    assert not unmarked, f"unmarked copies: {sorted(unmarked)}"
    assert repeated, "no repeated definition found: the search is broken"


@pytest.mark.parametrize("copy_id, source_path, name, copy_source", COPIES, ids=[c[0] for c in COPIES])
def test_marked_copy_equals_its_source(copy_id, source_path, name, copy_source):
    source = definitions(source_path)[name][1]
    source_model = source_path.parent.name
    copy_model = "lookwhere" if source_model == "veca" else "veca"
    for old, new in zip(NAMES[source_model], NAMES[copy_model]):
        source = source.replace(old, new)
    assert copy_source == source, f"{copy_id} drifted from {source_path.name}:{name}; change them together"
