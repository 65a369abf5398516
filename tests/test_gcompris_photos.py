"""examples/gcompris_photos.py: the photographs of a Debian package's Qt resource files, on a package built here."""

import importlib.util
import io
import struct
import tarfile
import zlib
from pathlib import Path

import pytest
from PIL import Image

ACTIVITIES = ("clickgame", "erase", "explore_farm_animals", "explore_monuments", "explore_world_animals",
              "explore_world_music")


def load_script():
    path = Path(__file__).resolve().parents[1] / "examples" / "gcompris_photos.py"
    spec = importlib.util.spec_from_file_location("gcompris_photos", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def webp(width: int, height: int, shade: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (shade, 100, 200 - shade)).save(buffer, "WEBP")
    return buffer.getvalue()


def build_rcc(tree: dict) -> bytes:
    """A Qt resource file (format 3) of `tree` ({name: subtree or (bytes, flags)}; flags 1: zlib, 4: zstd), its
    nodes numbered breadth first, as rcc writes them."""
    order, children, index = [("", tree)], {}, 0
    while index < len(order):
        if isinstance(order[index][1], dict):
            children[index] = (len(order), len(order[index][1]))
            order.extend(order[index][1].items())
        index += 1
    names, data, table = bytearray(), bytearray(), bytearray()
    for index, (name, item) in enumerate(order):
        name_offset = len(names)
        names += struct.pack(">HI", len(name), 0) + name.encode("utf-16-be")
        if isinstance(item, dict):
            first, count = children[index]
            table += struct.pack(">IHII", name_offset, 2, count, first) + bytes(8)
        else:
            content, flags = item
            stored = struct.pack(">I", len(content)) + zlib.compress(content) if flags & 1 else content
            table += struct.pack(">IHHHI", name_offset, flags, 0, 0, len(data)) + bytes(8)
            data += struct.pack(">I", len(stored)) + stored
    start = 24
    return (b"qres" + struct.pack(">IIIII", 3, start, start + len(table), start + len(table) + len(data), 0)
            + table + data + names)


def build_deb(rcc_files: dict[str, bytes]) -> bytes:
    """A .deb (ar: debian-binary, control.tar.xz, data.tar.xz) holding usr/share/gcompris-qt/rcc/{name}.rcc."""
    def tar(files: dict[str, bytes]) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:xz") as archive:
            for name, content in files.items():
                info = tarfile.TarInfo(name)
                info.size = len(content)
                archive.addfile(info, io.BytesIO(content))
        return buffer.getvalue()

    members = {"debian-binary": b"2.0\n", "control.tar.xz": tar({"./control": b"Package: gcompris-qt-data\n"}),
               "data.tar.xz": tar({f"./usr/share/gcompris-qt/rcc/{name}.rcc": content
                                   for name, content in rcc_files.items()})}
    archive = bytearray(b"!<arch>\n")
    for name, content in members.items():
        archive += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(content):<10}`\n".encode() + content
        archive += b"\n" * (len(content) % 2)
    return bytes(archive)


def test_the_photographs_of_the_six_activities_are_written_unchanged_with_their_sources(tmp_path, capsys):
    import hashlib

    script = load_script()
    big, raw, monument = webp(300, 260, 10), webp(260, 400, 50), webp(512, 256, 90)

    def activity(name: str, resource: dict) -> bytes:
        return build_rcc({"gcompris": {"src": {"activities": {name: {"resource": resource}}}}})

    rcc_files = {name: activity(name, {}) for name in ACTIVITIES}
    rcc_files["erase"] = activity("erase", {
        "big.webp": (big, 1), "sub": {"raw.webp": (raw, 0)}, "small.webp": (webp(255, 400, 0), 1),
        "README": (b"Copyright: someone\nLicense: CC0-1.0\nFiles: big.webp\n", 1), "icon.png": (b"png", 0),
        "packed.webp": (b"zstd bytes", 4)})
    rcc_files["explore_monuments"] = activity("explore_monuments", {"egypt": {"pyramid.webp": (monument, 0)}})
    rcc_files["lang"] = activity("lang", {"apple.webp": (webp(600, 600, 0), 0)})  # not one of the six
    package = tmp_path / "gcompris.deb"
    package.write_bytes(build_deb(rcc_files))
    digest = hashlib.sha256(package.read_bytes()).hexdigest()
    output = tmp_path / "out" / "photos"
    script.main(["--deb", str(package), "--sha256", digest, "--output-dir", str(output)])
    written = {path.name: path.read_bytes() for path in output.iterdir()}
    assert set(written) == {"erase-big.webp", "erase-sub-raw.webp", "explore_monuments-egypt-pyramid.webp",
                            "SOURCES.md"}
    assert (written["erase-big.webp"], written["erase-sub-raw.webp"]) == (big, raw)  # zlib inflated, raw as is
    assert written["explore_monuments-egypt-pyramid.webp"] == monument
    assert b"License: CC0-1.0" in written["SOURCES.md"]
    assert sorted(path.name for path in output.parent.iterdir()) == ["photos"]  # no partial folder left
    capsys.readouterr()
    # another package than the one named: one line, and the folder written before is left alone
    with pytest.raises(SystemExit) as stop:
        script.main(["--deb", str(package), "--output-dir", str(tmp_path / "other")])
    assert "has SHA-256" in str(stop.value) and "\n" not in str(stop.value)
    with pytest.raises(SystemExit):
        script.main(["--deb", str(package), "--sha256", digest, "--output-dir", str(output)])
    assert {path.name: path.read_bytes() for path in output.iterdir()} == written
    assert not (tmp_path / "other").exists()
    # a package without the six activities, and a file that is no package: one line each
    del rcc_files["clickgame"]
    package.write_bytes(build_deb(rcc_files))
    for content in (package.read_bytes(), b"not a package"):
        package.write_bytes(content)
        with pytest.raises(SystemExit) as stop:
            script.main(["--deb", str(package), "--sha256", hashlib.sha256(content).hexdigest(), "--output-dir",
                         str(tmp_path / "other")])
        assert "cannot be read as gcompris-qt-data" in str(stop.value) and "\n" not in str(stop.value)
    assert not (tmp_path / "other").exists()
