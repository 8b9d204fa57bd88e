"""The real node's pieces that need no root: the OCI archive an image is imported from, the
report a container prints of itself and its parsing, and the pod spec rewritten to print it."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from typing import Any

from gpuledger_dev.real_cluster import REPORT_DEV, REPORT_END, REPORT_ENV, STAY, parse_report, reporting
from gpuledger_dev.realnode.images import WORKLOAD_IMAGE, _layer, oci_archive


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
