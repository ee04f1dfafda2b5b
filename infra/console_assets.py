"""Refresh the console's vendored scripts from the npm registry: `python -m infra.console_assets`.

The console has no build step and loads nothing from a CDN: each library is
its released minified file, committed under `functions/console/static/vendor/`
with its licence. This script is how those files change: edit a version in
`PINNED`, run it, review the diff. It checks each tarball against the
registry's published SHA-512 before writing anything.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import sys
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REGISTRY = "https://registry.npmjs.org"
VENDOR = Path(__file__).resolve().parent.parent / "functions" / "console" / "static" / "vendor"
TIMEOUT = 60.0


@dataclass(frozen=True)
class Asset:
    """One npm package's minified file, and the name it is served under."""

    package: str
    version: str
    file: str  # inside the tarball's package/ folder
    served_as: str
    licence: str = "LICENSE"


PINNED = (
    Asset("htmx.org", "2.0.11", "dist/htmx.min.js", "htmx.min.js"),
    Asset("cytoscape", "3.35.0", "dist/cytoscape.min.js", "cytoscape.min.js"),
    # 4.x bundles its own dagre: one file, no separate layout package.
    Asset("cytoscape-dagre", "4.0.1", "dist/cytoscape-dagre.min.js", "cytoscape-dagre.min.js"),
)


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
        data: bytes = response.read()
    return data


def tarball(asset: Asset) -> bytes:
    """The package's tarball, refused unless it matches the registry's integrity hash."""
    meta = json.loads(fetch(f"{REGISTRY}/{asset.package}/{asset.version}"))
    data = fetch(meta["dist"]["tarball"])
    algorithm, _, expected = meta["dist"]["integrity"].partition("-")
    if algorithm != "sha512" or base64.b64decode(expected) != hashlib.sha512(data).digest():
        raise SystemExit(f"{asset.package} {asset.version}: tarball does not match its integrity")
    return data


def vendor(asset: Asset) -> None:
    with tarfile.open(fileobj=io.BytesIO(tarball(asset)), mode="r:gz") as archive:
        wanted = (asset.file, asset.licence)
        members = {name: archive.extractfile(f"package/{name}") for name in wanted}
        contents = {name: member.read() for name, member in members.items() if member is not None}
    stem = asset.served_as.removesuffix(".min.js")
    (VENDOR / asset.served_as).write_bytes(contents[asset.file])
    (VENDOR / f"{stem}.LICENSE").write_bytes(contents[asset.licence])


def main() -> int:
    VENDOR.mkdir(parents=True, exist_ok=True)
    for asset in PINNED:
        vendor(asset)
        print(f"{asset.package} {asset.version} -> {asset.served_as}")
    versions = {asset.served_as: f"{asset.package}@{asset.version}" for asset in PINNED}
    (VENDOR / "VERSIONS.json").write_text(json.dumps(versions, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
