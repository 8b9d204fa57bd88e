#!/usr/bin/env python3
"""Set up and run gpuledger on a fresh machine that has only python3 and git.

    python3 dev.py up     # create .venv, install, run the whole stack on a simulated fleet
    python3 dev.py test   # install tox into .venv and run it (every check and test)

Any further arguments go to ``gpuledger dev up`` or to ``tox``. Every tox env runs on the Python
that runs this script (Python 3.11, 3.12 or 3.13); another one is refused before anything is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"
CONSTRAINTS = ROOT / "constraints.txt"
SUPPORTED = ((3, 11), (3, 14))  # pyproject.toml's requires-python: >=3.11,<3.14


def check_python(version: tuple[int, int] | None = None) -> None:
    """Refuse a Python outside pyproject's requires-python, naming the one found and the ones wanted."""
    major, minor = version or sys.version_info[:2]
    low, high = SUPPORTED
    if not low <= (major, minor) < high:
        names = ", ".join(f"python{low[0]}.{m}" for m in range(low[1], high[1]))
        sys.exit(
            f"gpuledger needs Python >={low[0]}.{low[1]},<{high[0]}.{high[1]} (pyproject.toml's requires-python), "
            f"and {sys.executable} is Python {major}.{minor}: run dev.py with one of {names}"
        )


def run(*cmd: str | Path) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, cwd=ROOT)


def venv_version() -> tuple[int, int] | None:
    """The Python version .venv was made with, or None when there is no usable .venv."""
    if not (BIN / "python").exists():
        return None
    probe = [str(BIN / "python"), "-c", "import sys; print(*sys.version_info[:2])"]
    done = subprocess.run(probe, capture_output=True, text=True, check=False)
    parts = done.stdout.split()
    return (int(parts[0]), int(parts[1])) if done.returncode == 0 and len(parts) == 2 else None


def ensure_venv() -> None:
    found = venv_version()
    if found == sys.version_info[:2]:
        return
    if found is not None or VENV.exists():
        was = f"of Python {found[0]}.{found[1]}" if found else "broken"
        print(f"+ .venv is {was}: making it afresh for {sys.executable}", flush=True)
        shutil.rmtree(VENV)
    try:
        venv.create(VENV, with_pip=True)
    except (subprocess.CalledProcessError, OSError):
        # Debian ships venv's pip bootstrap separately (python3-venv).
        shutil.rmtree(VENV, ignore_errors=True)
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            sys.exit("python3 cannot create a virtual environment: install python3-venv (apt-get install python3-venv)")
        ver = f"{sys.version_info.major}.{sys.version_info.minor}"
        run("apt-get", "update", "-q")
        run("apt-get", "install", "-y", "-q", "python3-venv", f"python{ver}-venv")
        venv.create(VENV, with_pip=True)


def ensure_chromium() -> None:
    """The dashboard's browser test needs a real Chromium: Debian's package."""
    if any(shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        sys.exit("the tests need Chromium: install Debian's chromium package (apt-get install chromium)")
    run("apt-get", "update", "-q")
    run("apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium")


def install(*extra: str) -> None:
    ensure_venv()
    run(BIN / "python", "-m", "pip", "install", "-q", "--upgrade", "pip")
    # gpuledger and its dev mode, a distribution of its own (libs/gpuledger_dev): gpuledger dev up, the tests
    run(BIN / "python", "-m", "pip", "install", "-q", "-c", CONSTRAINTS, "-e", ".", "-e", "libs/gpuledger_dev", *extra)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("up", "test"):
        print(__doc__)
        return 2
    check_python()
    if argv[0] == "up":
        install()
        os.execv(BIN / "gpuledger", [str(BIN / "gpuledger"), "dev", "up", *argv[1:]])
    install("tox")
    ensure_chromium()
    return subprocess.run([str(BIN / "tox"), *argv[1:]], cwd=ROOT).returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
