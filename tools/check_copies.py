"""Checks the copies that each hub model keeps of the other's helpers, as transformers' utils/check_copies.py does.

A hub repo holds one model's files, so a helper both models need is repeated, and the copy is marked on the line above
its definition (or its first decorator):

    # Copied from corevision_hf.veca.modeling_veca.VecaSwiGLU with Veca->LookWhere

The copy must equal the named definition (a function, a class, or `Class.method`) once each `Old->New` replacement is
applied to it. A marker naming a module, on the first line of a file, makes the rest of the file a copy of that module
(the image processors: `# Copied from corevision_hf.veca.image_processing_veca with Veca->LookWhere, ...`).
`python tools/check_copies.py` prints one line per drifted copy and exits 1; `--fix` rewrites the copies from their
sources.
"""

import argparse
import ast
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src"
MARKER = re.compile(r"^(\s*)# Copied from corevision_hf\.([\w.]+)(?: with (.+?))?\s*$")


def definitions(text: str) -> dict[str, tuple[int, int]]:
    """Top-level functions and classes, and methods as Class.method: name -> (first line, last line), 1-based, the
    first line being the first decorator's."""
    found = {}

    def span(node) -> tuple[int, int]:
        return (node.decorator_list[0].lineno if node.decorator_list else node.lineno), node.end_lineno

    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found[node.name] = span(node)
            for sub in node.body if isinstance(node, ast.ClassDef) else []:
                if isinstance(sub, ast.FunctionDef):
                    found[f"{node.name}.{sub.name}"] = span(sub)
    return found


def block(lines: list[str], first: int, last: int) -> str:
    """Lines first..last (1-based), dedented."""
    return textwrap.dedent("\n".join(lines[first - 1 : last]))


def replaced(source: str, replacements: str | None) -> str:
    """`source` with each `Old->New` of a comma-separated `replacements` applied, in order."""
    for pair in (replacements or "").split(","):
        if pair.strip():
            old, new = (part.strip() for part in pair.split("->"))
            source = source.replace(old, new)
    return source


def first_difference(copy: str, expected: str) -> str:
    """The first line where `copy` and `expected` differ, as 'line N: copy ... / source ...'."""
    ours, theirs = copy.splitlines(), expected.splitlines()
    for number, (a, b) in enumerate(zip(ours, theirs), start=1):
        if a != b:
            return f"line {number} of the copy: {a.strip()!r}, source: {b.strip()!r}"
    return f"the copy has {len(ours)} lines, the source {len(theirs)}"


def source_definition(root: Path, dotted: str) -> tuple[str, str, str, tuple[int, int]] | None:
    """`module.path.Name` or `module.path.Class.method` under `root`/corevision_hf -> (module, name, the module's text,
    the definition's lines), or None if there is no such definition."""
    parts = dotted.split(".")
    for split in range(len(parts) - 1, 0, -1):  # the longest module path that is a file
        path = root / "corevision_hf" / Path(*parts[:split]).with_suffix(".py")
        if path.exists():
            text, name = path.read_text(), ".".join(parts[split:])
            span = definitions(text).get(name)
            return None if span is None else (".".join(parts[:split]), name, text, span)
    return None


def source_module(root: Path, dotted: str) -> Path | None:
    """The file of module `dotted` under `root`/corevision_hf, or None if it names no module."""
    path = root / "corevision_hf" / Path(*dotted.split(".")).with_suffix(".py")
    return path if path.is_file() else None


def check_whole_file(path: Path, root: Path, fix: bool) -> list[str] | None:
    """With a module marker on the first line of `path`: the problem if the rest of the file is not that module
    with the replacements applied (fixed with `fix`), else []; None if the first line is no module marker."""
    text = path.read_text()
    first, _, rest = text.partition("\n")
    match = MARKER.match(first)
    module = source_module(root, match.group(2)) if match and not match.group(1) else None
    if module is None:
        return None
    expected = replaced(module.read_text(), match.group(3))
    if rest == expected:
        return []
    if fix:
        path.write_text(first + "\n" + expected)
    return [f"{path}:1: the file drifted from corevision_hf.{match.group(2)} ({first_difference(rest, expected)})"]


def check_file(path: Path, root: Path, fix: bool) -> list[str]:
    """The drifted copies of `path`, one line each; with `fix`, rewrites them from their sources."""
    whole = check_whole_file(path, root, fix)
    if whole is not None:
        return whole
    text = path.read_text()
    lines = text.splitlines()
    spans = {first: (name, last) for name, (first, last) in definitions(text).items()}
    problems, edits = [], []
    for index, line in enumerate(lines):
        match = MARKER.match(line)
        if not match:
            continue
        indent, dotted, replacements = match.groups()
        where = f"{path}:{index + 1}"
        if index + 2 not in spans:
            problems.append(f"{where}: the marker is not on the line above a definition")
            continue
        copy_name, last = spans[index + 2]
        found = source_definition(root, dotted)
        if found is None:
            problems.append(f"{where}: {copy_name} copies corevision_hf.{dotted}, which does not exist")
            continue
        module, name, source_text, source_span = found
        expected = replaced(block(source_text.splitlines(), *source_span), replacements)
        copy = block(lines, index + 2, last)
        if copy != expected:
            problems.append(f"{where}: {copy_name} drifted from corevision_hf.{module}.{name} "
                            f"({first_difference(copy, expected)})")
            edits.append((index + 2, last, textwrap.indent(expected, indent).splitlines()))
    if fix and edits:
        for first, last, new in reversed(edits):
            lines[first - 1 : last] = new
        path.write_text("\n".join(lines) + "\n")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check the '# Copied from' copies of the hub files.")
    parser.add_argument("--fix", action="store_true", help="rewrite drifted copies from their sources")
    parser.add_argument("--root", type=Path, default=ROOT, help="the folder holding the corevision_hf package")
    args = parser.parse_args(argv)
    paths = sorted((args.root / "corevision_hf").rglob("*.py"))
    if args.fix:
        for path in paths:
            check_file(path, args.root, fix=True)
    problems = [problem for path in paths for problem in check_file(path, args.root, fix=False)]
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} copies drifted: change them with their sources, or run tools/check_copies.py --fix.")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
