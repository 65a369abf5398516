"""The authors' released LookWhere weights: where they are on the hub, and their download, checked against its sha256.

`python -m corevision_hf.convert.lookwhere --from-hub dinov2 OUT_DIR` (`convert.lookwhere.convert_release`) downloads
a file through `download_release`, then converts it. The file comes from the hub repo `antofuller/lookwhere` through
`hf_hub_download` (kept in the hub cache, resumed where a cut download stopped, served offline from the cache with
HF_HUB_OFFLINE=1). The release files' sha256 and the repo's revision are not pinned yet (`UNPINNED`, shown by --help).
"""

import os
import re

from huggingface_hub import hf_hub_download, is_offline_mode

from corevision_hf.offline import check_hub_reachable
from corevision_hf.outputs import sha256


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
    actual = sha256(path)
    if actual != expected:
        for stale in {path, blob}:
            if os.path.lexists(stale):
                os.remove(stale)
        raise ValueError(
            f"{filename} from {REPO_ID} is corrupted: its sha256 is {actual}, the hub's is {expected}. "
            "It was removed from the hub cache; rerun the same command to download it again."
        )
    source = "the known release sha256" if name in RELEASE_SHA256 else "the hub's ETag"
    return path, f"sha256 checked against {source} ({expected[:12]}...)"
