"""The authors' released LookWhere weights in one command: download from the hub, check, convert.

    python -m corevision_hf.convert.lookwhere --from-hub dinov2 OUT_DIR [--force]
    python -m corevision_hf.convert.lookwhere --from-hub franca OUT_DIR

The file comes from the hub repo `antofuller/lookwhere` through `hf_hub_download` (kept in the hub cache, resumed
where a cut download stopped, served offline from the cache with HF_HUB_OFFLINE=1), is checked against its sha256,
then converted by `corevision_hf.convert.lookwhere.convert` into OUT_DIR (written under a temporary name, then
renamed). The release files' sha256 and the repo's revision are not pinned yet (`UNPINNED`, shown by --help).
"""

import argparse
import hashlib
import os
import re

from huggingface_hub import hf_hub_download, is_offline_mode

from corevision_hf.cli import run
from corevision_hf.convert.common import check_out_dir
from corevision_hf.convert.lookwhere import convert
from corevision_hf.offline import check_hub_reachable


REPO_ID = "antofuller/lookwhere"
RELEASES = {"dinov2": "lookwhere_dinov2.pt", "franca": "lookwhere_franca.pt"}
# The commit the files are read from. "main" until someone with network records the commit whose files were checked
# (then also fill in RELEASE_SHA256); meanwhile every download is held to the hub's own sha256 of the file.
REVISION = "main"
UNPINNED = (
    "Unpinned: neither the release files' sha256 nor the repo's revision is recorded here (they could not be learned "
    "offline), so a download is checked against the hub's own sha256 of the file (its ETag), and a file already in "
    "the hub cache is trusted as it is, which a tampered cache would pass."
)
# Known sha256 of each release file; where absent, the reference is the hub's ETag of the file, which for files
# stored with LFS (as these .pt files are) is their sha256 and names the blob in the hub cache.
RELEASE_SHA256: dict[str, str] = {}
SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")


def download_release(name: str) -> tuple[str, str]:
    """Downloads (or finds in the hub cache) release `name` ("dinov2" or "franca"); returns (local path, a note on
    how its sha256 was checked). A corrupted file is removed from the cache, so that a rerun downloads it again."""
    if name not in RELEASES:
        raise ValueError(f"Unknown LookWhere release {name!r}; choose one of {sorted(RELEASES)}.")
    filename = RELEASES[name]
    check_hub_reachable(REPO_ID, filename, alternative=f"download {filename} yourself and run: python -m "
                        "corevision_hf.convert.lookwhere FILE OUT_DIR")
    try:
        path = hf_hub_download(REPO_ID, filename, revision=REVISION)
    except Exception as error:  # the network stack raises many types (httpx, OSError, hub errors)
        if is_offline_mode():
            raise ConnectionError(
                f"{filename} of {REPO_ID} is not in the hub cache, and HF_HUB_OFFLINE=1 forbids downloading it: run "
                "once with network, or download the file yourself and run: python -m corevision_hf.convert.lookwhere "
                "FILE OUT_DIR."
            ) from None
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ConnectionError(
            f"Downloading {filename} from the hub repo {REPO_ID} failed ({first_line[:200]}); rerun the same command "
            "to resume it, or download the file yourself and run: python -m corevision_hf.convert.lookwhere FILE "
            "OUT_DIR."
        ) from None
    blob = os.path.realpath(path)  # the hub cache links the file to blobs/<ETag>
    etag = os.path.basename(blob)
    expected = RELEASE_SHA256.get(name) or (etag if SHA256_PATTERN.match(etag) else None)
    if expected is None:
        return path, "sha256 not checked: none is known for it and the hub cache did not name it by one"
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        for stale in {path, blob}:
            if os.path.lexists(stale):
                os.remove(stale)
        raise ValueError(
            f"{filename} from {REPO_ID} is corrupted: its sha256 is {digest.hexdigest()}, the hub's is {expected}. "
            "It was removed from the hub cache; rerun the same command to download it again."
        )
    source = "the known release sha256" if name in RELEASE_SHA256 else "the hub's ETag"
    return path, f"sha256 checked against {source} ({expected[:12]}...)"


def usage_lines(out_dir: str, name: str) -> list[str]:
    """What to run next: load, evaluate, publish."""
    evaluation = f"{out_dir.rstrip('/')}-evaluation"
    return [
        f"load:     AutoModel.from_pretrained({out_dir!r}, trust_remote_code=True)",
        f"evaluate: python -m evaluation.evaluate_budgets {out_dir} --budgets 0.05 0.1 0.2 --resolutions 518 1036 "
        f"--output-dir {evaluation}",
        f"publish:  python -m publishing.publish {out_dir} --evaluation {evaluation}/evaluation.json "
        f"--repo-id your-name/lookwhere-{name} --dry-run   # then without --dry-run",
    ]


def main(argv: list[str] | None = None) -> None:
    """The command line (`convert.lookwhere --from-hub` hands over to it): a bad input is one line, exit status 2."""
    status = run(convert_release, argv)
    if status:
        raise SystemExit(status)


def convert_release(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m corevision_hf.convert.lookwhere --from-hub",
        description=f"Download the authors' released LookWhere weights from the hub repo {REPO_ID} and convert them.",
        epilog=UNPINNED if not RELEASE_SHA256 else None,
    )
    parser.add_argument("--from-hub", required=True, metavar="RELEASE", help=f"one of {sorted(RELEASES)}")
    parser.add_argument("out_dir", help="folder to write the hub model into")
    parser.add_argument("--force", action="store_true", help="write into OUT_DIR even if it is not empty")
    args = parser.parse_args(argv)
    check_out_dir(args.out_dir, args.force)  # before a download of hundreds of MB
    path, note = download_release(args.from_hub)
    convert(path, args.out_dir, force=args.force)
    print(f"Wrote {args.out_dir} from {REPO_ID}/{RELEASES[args.from_hub]} (revision {REVISION}; {note}). Next:")
    for line in usage_lines(args.out_dir, args.from_hub):
        print("  " + line)
