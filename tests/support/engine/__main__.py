"""``python -m tests.support.engine prepare``: what the compose tests need, installed and built.

Debian's docker.io and debootstrap (apt-get, as root), Docker Compose from its Go module (cached
in ~/.cache/gpuledger/tools), the Debian base image (cached in ~/.cache/gpuledger/images), the
wheelhouse, and the dev and production images. A dockerd started for the builds is stopped at
the end. Each step prints its time.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from tests.support.engine import apt, base_image, compose_build, dockerd, images
from tests.support.engine.errors import EngineError
from tests.support.engine.steps import say, step

PROJECT = "gpuledger-build"


def prepare() -> None:
    started = time.monotonic()
    checkout = images.Checkout.here()
    with step("Debian packages (docker.io, debootstrap)"):
        apt.ensure_packages()
    with step("docker compose"):
        compose_build.install_plugin(compose_build.build())
    with dockerd.engine() as found:
        with step("base image"):
            base_image.ensure_base_image(found.docker)
        images.make_wheelhouse(checkout)
        built = [images.build_dev(found.docker, checkout, PROJECT), images.build_production(found.docker, checkout)]
        images.prune(found.docker, checkout)
        for image in built:
            say(f"{image}: {images.image_size_mb(found.docker, image):.0f} MB")
    say(f"prepared in {time.monotonic() - started:.0f} s")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.engine", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["prepare"])
    parser.parse_args(argv)
    try:
        prepare()
    except EngineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
