"""Regenerate the betterproto package under proto/gpuledger_proto from the .proto sources.

Run with the pinned generator (constraints.txt): ``python proto/generate.py``. ``--check``
regenerates into a temporary folder and fails on any difference from what is committed.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = HERE / "gpuledger_proto"


def sources() -> list[str]:
    return sorted(str(p.relative_to(HERE)) for p in HERE.rglob("*.proto") if "gpuledger_proto" not in p.parts)


def generate(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    plugin = Path(sysconfig.get_path("scripts")) / "protoc-gen-python_betterproto"
    cmd = [
        sys.executable, "-m", "grpc_tools.protoc", f"-I{HERE}",
        f"--plugin=protoc-gen-python_betterproto={plugin}",
        f"--python_betterproto_out={out}", *sources(),
    ]
    subprocess.run(cmd, check=True, cwd=HERE)
    (out / "py.typed").touch()


def differences(a: Path, b: Path) -> list[str]:
    found: list[str] = []

    def walk(cmp: filecmp.dircmp[str], prefix: str) -> None:
        found.extend(f"{prefix}{n}" for n in cmp.left_only + cmp.right_only + cmp.diff_files)
        for name, sub in cmp.subdirs.items():
            walk(sub, f"{prefix}{name}/")

    walk(filecmp.dircmp(a, b, ignore=["__pycache__"]), "")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    args = parser.parse_args()
    if not args.check:
        shutil.rmtree(PACKAGE, ignore_errors=True)
        generate(PACKAGE)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "gpuledger_proto"
        generate(fresh)
        stale = differences(PACKAGE, fresh)
    if stale:
        print("generated code differs from proto sources; run python proto/generate.py:", *stale, sep="\n  ")
        return 1
    print(f"generated code is up to date ({len(sources())} proto files)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
