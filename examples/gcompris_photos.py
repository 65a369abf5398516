"""More held-out photographs, offline: the Wikimedia Commons photos that GCompris ships in Debian.

    python examples/gcompris_photos.py                    # downloads the package: outputs/gcompris_photos/
    python examples/gcompris_photos.py --deb gcompris-qt-data_3.1-2_all.deb   # from `apt-get download` instead

The Debian package gcompris-qt-data 3.1-2 (the data of GCompris, an educational suite; 44 MB) keeps its pictures in Qt
resource files (.rcc). Six of its activities show photographs from Wikimedia Commons: monuments, wild and farm animals,
musicians, sea floors (ACTIVITIES). This script reads the .deb (an `ar` archive holding data.tar.xz), walks the six .rcc
files and writes every WebP picture of at least MIN_SIDE px on its shorter side, its bytes unchanged, as
`{activity}-{path}.webp` (121 photos, no two of them near-copies), with the activities' README files (author, licence:
CC0, public domain, CC-BY or CC-BY-SA, and source of each picture) as SOURCES.md. The package is checked against its
SHA-256 first. Without --deb it is downloaded from deb.debian.org (Debian's package archive, no hub).

For example, as a second held-out set of the rotation task (no training photo among them):

    python examples/rotation_task.py --output-dir outputs/rotation_gcompris --train-images 800 \\
        --heldout-photos outputs/gcompris_photos --heldout-crops 10
"""

import argparse
import hashlib
import io
import os
import shutil
import struct
import sys
import tarfile
import tempfile
import urllib.request
import zlib
from pathlib import Path

from PIL import Image

from corevision_hf.cli import HelpFormatter

URL = "http://deb.debian.org/debian/pool/main/g/gcompris-qt/gcompris-qt-data_3.1-2_all.deb"
SHA256 = "e9cf06ab2105529068df73085784e835d2ff03f870d2a8091f09125d40abac9f"
RCC_FOLDER = "usr/share/gcompris-qt/rcc"
ACTIVITIES = ("clickgame", "erase", "explore_farm_animals", "explore_monuments", "explore_world_animals",
              "explore_world_music")
MIN_SIDE = 256


def ar_member(archive: bytes, prefix: str) -> bytes:
    """The first member of the `ar` archive (a .deb) whose name starts with `prefix`."""
    if archive[:8] != b"!<arch>\n":
        raise ValueError("not a Debian package (no ar archive header)")
    offset = 8
    while offset + 60 <= len(archive):
        name, size = archive[offset:offset + 16].decode().strip(), int(archive[offset + 48:offset + 58])
        if name.rstrip("/").startswith(prefix):
            return archive[offset + 60:offset + 60 + size]
        offset += 60 + size + size % 2  # members start at even offsets
    raise ValueError(f"the package has no {prefix}* member")


def rcc_files(resource: bytes):
    """(path, bytes) of every file of a Qt resource file (.rcc, format versions 1-3), zlib-compressed ones inflated;
    None for zstd-compressed ones (not needed here)."""
    if resource[:4] != b"qres":
        raise ValueError("not a Qt resource file (no qres header)")
    version, tree, data, names = struct.unpack(">IIII", resource[4:20])
    node_size = 22 if version >= 2 else 14

    def name(offset):
        length = struct.unpack(">H", resource[names + offset:names + offset + 2])[0]
        return resource[names + offset + 6:names + offset + 6 + 2 * length].decode("utf-16-be")

    def walk(index, folder):
        start = tree + index * node_size
        name_offset, flags = struct.unpack(">IH", resource[start:start + 6])
        path = f"{folder}/{name(name_offset)}" if index else ""
        if flags & 2:  # a directory: its children are `count` nodes from `first`
            count, first = struct.unpack(">II", resource[start + 6:start + 14])
            for child in range(first, first + count):
                yield from walk(child, path)
            return
        offset = data + struct.unpack(">I", resource[start + 10:start + 14])[0]
        size = struct.unpack(">I", resource[offset:offset + 4])[0]
        content = resource[offset + 4:offset + 4 + size]
        if flags & 1:  # qCompress: the inflated size, then a zlib stream
            content = zlib.decompress(content[4:])
        yield path, None if flags & 4 else content

    yield from walk(0, "")


def photographs(package: bytes):
    """(file name, WebP bytes) of the photographs of ACTIVITIES, and the text of their README files."""
    with tarfile.open(fileobj=io.BytesIO(ar_member(package, "data.tar"))) as data:
        resources = {Path(member.name).stem: data.extractfile(member).read() for member in data.getmembers()
                     if member.isfile() and Path(member.name).parent.as_posix().lstrip("./") == RCC_FOLDER
                     and Path(member.name).stem in ACTIVITIES}
    if sorted(resources) != sorted(ACTIVITIES):
        raise ValueError(f"the package lacks {', '.join(sorted(set(ACTIVITIES) - set(resources)))} in {RCC_FOLDER}")
    photos, readmes = [], []
    for activity in ACTIVITIES:
        for path, content in rcc_files(resources[activity]):
            if content is None:
                continue
            if Path(path).name.lower() == "readme":
                readmes.append(f"## {activity}: {path}\n\n{content.decode()}")
            elif path.endswith(".webp") and min(Image.open(io.BytesIO(content)).size) >= MIN_SIDE:
                inside = path.split("/resource/", 1)[-1].removesuffix(".webp").replace("/", "-")
                photos.append((f"{activity}-{inside}.webp", content))
    return photos, readmes


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--output-dir", default="outputs/gcompris_photos", help="a new or empty folder for the photos")
    parser.add_argument("--deb", default=None, help=f"the package file (default: downloaded from {URL})")
    parser.add_argument("--sha256", default=SHA256, help="the package's expected SHA-256")
    args = parser.parse_args(argv)
    output = Path(args.output_dir)
    if output.exists() and any(output.iterdir()):
        parser.error(f"{output} exists and is not empty: give another --output-dir or remove it.")
    if args.deb is None:
        print(f"downloading {URL} (44 MB)", flush=True)
        try:
            with urllib.request.urlopen(URL, timeout=60) as response:
                package = response.read()
        except OSError as error:
            sys.exit(f"error: could not download {URL} ({error}); download it elsewhere (or `apt-get download "
                     f"gcompris-qt-data=3.1-2` on Debian) and pass --deb FILE.")
    else:
        try:
            package = Path(args.deb).read_bytes()
        except OSError as error:
            sys.exit(f"error: cannot read --deb {args.deb}: {error.strerror}.")
    digest = hashlib.sha256(package).hexdigest()
    if digest != args.sha256:
        sys.exit(f"error: {args.deb or URL} has SHA-256 {digest}, not {args.sha256}: another version of "
                 f"gcompris-qt-data than 3.1-2, or a damaged download.")
    try:
        photos, readmes = photographs(package)
    except (ValueError, OSError, tarfile.TarError, zlib.error, struct.error) as error:  # OSError: a bad picture
        sys.exit(f"error: {args.deb or URL} cannot be read as gcompris-qt-data: {error}.")
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))  # renamed when complete
    try:
        for name, content in photos:
            (partial / name).write_bytes(content)
        (partial / "SOURCES.md").write_text(
            f"# Photographs of gcompris-qt-data 3.1-2 (Debian), from {URL}\n\nEach file is "
            "`{activity}-{path inside the activity's resource folder}.webp`; the README files of the activities "
            "give each picture's author, licence and source:\n\n" + "\n\n".join(readmes))
        if output.exists():
            output.rmdir()  # empty, checked above
        os.replace(partial, output)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    print(f"wrote {len(photos)} photographs of {len(ACTIVITIES)} activities and SOURCES.md to {output}")


if __name__ == "__main__":
    main()
