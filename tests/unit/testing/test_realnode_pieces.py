"""The real node's pieces that need no root: the OCI archive an image is imported from, the
report a container prints of itself and its parsing, the pod spec rewritten to print it, the MIG
minors file and the stand-in for the toolkit's CDI spec."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

from gpuledger_core.mig_layout import gpu_instance_id
from gpuledger_core.mig_profiles import A100_40GB
from gpuledger_dev.fleet import parse_fleet
from gpuledger_dev.real_cluster import (
    MIG_ENV,
    REPORT_DEV,
    REPORT_END,
    REPORT_ENV,
    STAY,
    TOOLKIT_ENV,
    TOOLKIT_SPEC,
    parse_report,
    reporting,
    toolkit_spec,
)
from gpuledger_dev.realnode.devices import mig_minors
from gpuledger_dev.realnode.images import WORKLOAD_IMAGE, _layer, oci_archive
from gpuledger_plugin.mig_answer import parse_mig_minors


def members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_an_oci_archive_holds_one_image_whose_blobs_match_their_digests() -> None:
    layer = _layer({"bin/busybox": b"\x7fELF..."}, {"bin/sh": "busybox"})
    files = members(oci_archive("localhost/x/y:1", layer, ["/bin/sh"]))
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    (entry,) = json.loads(files["index.json"])["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == "localhost/x/y:1"
    manifest = json.loads(files[f"blobs/sha256/{entry['digest'].removeprefix('sha256:')}"])
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'].removeprefix('sha256:')}"])
    assert config["config"]["Entrypoint"] == ["/bin/sh"]
    assert config["rootfs"]["diff_ids"] == [manifest["layers"][0]["digest"]]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        found = {m.name: m for m in tar.getmembers()}
    assert found["bin/sh"].issym() and found["bin/sh"].linkname == "busybox"
    assert found["bin/busybox"].mode == 0o755 and found["tmp"].isdir()
    assert all(m.mtime == 0 for m in found.values())  # the same bytes every build


def test_a_report_parses_into_environment_and_dev() -> None:
    text = "\n".join(
        [REPORT_ENV, "A=1", "B=x=y", REPORT_DEV, "null", "nvidia0", "nvidia-container-devices/GPU-1", REPORT_END]
    )
    env, dev = parse_report(text + "\n")
    assert env == {"A": "1", "B": "x=y"}
    assert dev == ("null", "nvidia0", "nvidia-container-devices/GPU-1")


def test_every_container_reports_and_only_app_containers_stay() -> None:
    spec: dict[str, Any] = {
        "containers": [{"name": "app", "image": "cuda", "resources": {"limits": {"gpuledger.io/gpu": "1"}}}],
        "initContainers": [{"name": "setup", "image": "cuda"}],
    }
    changed = reporting(spec)
    (app,), (setup,) = changed["containers"], changed["initContainers"]
    assert app["image"] == setup["image"] == WORKLOAD_IMAGE and app["imagePullPolicy"] == "Never"
    assert app["resources"] == spec["containers"][0]["resources"]  # what it asks for is kept
    assert app["command"][-1].endswith(STAY) and "sleep" not in setup["command"][-1]
    assert spec["containers"][0]["image"] == "cuda"  # the caller's spec is left as it was


def test_the_mig_minors_file_lists_every_instance_id_of_each_card_as_the_driver_numbers_them() -> None:
    found = mig_minors([0, 2])
    text = "".join(f"{name} {minor}\n" for name, minor in found.items())
    assert parse_mig_minors(text) == found  # the plugin reads what the harness writes
    assert list(found.items())[:5] == [
        ("config", 1), ("monitor", 2), ("gpu0/gi0/access", 3), ("gpu0/gi0/ci0/access", 4), ("gpu0/gi0/ci1/access", 5)
    ]  # fmt: skip
    assert found["gpu0/gi1/access"] == 12  # after gi0's access and its eight compute instances
    one_slice = A100_40GB.by_name("1g.5gb")
    assert one_slice is not None
    last = gpu_instance_id(A100_40GB, one_slice, A100_40GB.memory_slices - 1)  # the highest GPU instance ID
    assert f"gpu2/gi{last}/ci7/access" in found and f"gpu2/gi{last + 1}/access" not in found
    assert "gpu1/gi0/access" not in found
    assert len(set(found.values())) == len(found)  # one node per capability


MIG_FLEET = """
nodes:
  - name: real-mig
    cards:
      - {model: NVIDIA A100-SXM4-40GB, memory_mib: 40960}
      - {model: NVIDIA A100-SXM4-40GB, memory_mib: 40960}
    mig:
      - {card: 0, instances: []}
      - {card: 1, instances: [4g.20gb, 3g.20gb]}
"""


def test_the_toolkit_stand_in_defines_the_cards_and_the_mig_devices_that_exist_at_start(tmp_path: Path) -> None:
    fleet = parse_fleet(MIG_FLEET)
    spec = json.loads(toolkit_spec(tmp_path, fleet, fleet.nodes[0]).read_text())
    assert spec["kind"] == "nvidia.com/gpu" and spec["containerEdits"]["env"] == [f"{TOOLKIT_ENV}={TOOLKIT_SPEC}"]
    names = [d["name"] for d in spec["devices"]]
    assert names[:2] == [str(c.uuid) for c in fleet.nodes[0].node.cards]
    migs = [d for d in spec["devices"] if d["name"].startswith("MIG-")]
    assert len(migs) == 2  # card 1's two instances; card 0 has none yet
    assert all(d["containerEdits"]["env"] == [f"{MIG_ENV}={d['name']}"] for d in migs)
