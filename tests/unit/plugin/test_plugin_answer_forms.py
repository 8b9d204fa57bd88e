"""What a container gets, in the forms NVIDIA documents (table tests).

Sources of the forms:
- device list as volume mounts: NVIDIA/k8s-device-plugin ``internal/plugin/server.go``
  (``updateResponseForDeviceMounts``: host ``/dev/null`` at ``/var/run/nvidia-container-devices/<id>``,
  ``NVIDIA_VISIBLE_DEVICES`` = that directory) and NVIDIA/nvidia-container-toolkit
  ``internal/config/image/cuda_image.go`` (``requestsFromMounts`` takes only mounts whose source is
  ``/dev/null`` under that root);
- CDI names ``vendor/class=name`` and the ``cdi.k8s.io/<plugin>_<id>`` annotation key;
- ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``: NVIDIA's MPS documentation, a comma list of
  ``<device ordinal or UUID>=<limit>`` (``0=1G,1=512MB``); NVIDIA/k8s-device-plugin pull request 572
  (CHANGELOG: "Set MPS memory limit by device index and not device UUID ... limits are not applied
  for devices if set by UUID"): so by ordinal, the container's own;
- ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: a percentage; NVIDIA's plugin and GKE's pass whole numbers;
- ``CUDA_MPS_PIPE_DIRECTORY`` with the pipe directory and the daemon's shm mounted
  (``internal/plugin/mps.go``: ``updateReponse``); ``CUDA_MPS_LOG_DIRECTORY`` is the daemon's.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuledger_common.settings import SettingsError, load
from gpuledger_core.errors import InvalidArgument
from gpuledger_core.model import CardShare, Grant, Isolation
from gpuledger_plugin.answer import Answer, AnswerPolicy, Mount, answer
from gpuledger_plugin.settings import PluginSettings

from .plugin_fixtures import node, pod, share

ROOT = "/var/run/nvidia-container-devices"


def _answer(*shares: CardShare, isolation: Isolation = Isolation.NONE, **policy: Any) -> Answer:
    alloc = pod("p", Grant("c", shares, device_ids=tuple(f"{s.uuid}::0" for s in shares)), isolation=isolation)
    return answer(node(), alloc, alloc.grants[0], AnswerPolicy(**policy))


def test_the_default_device_list_is_volume_mounts_a_pod_cannot_forge() -> None:
    got = _answer(share(2, mem=1000), share(0, mem=1000))
    assert AnswerPolicy().strategies == ("volume-mounts",)
    assert got.envs["NVIDIA_VISIBLE_DEVICES"] == ROOT
    assert got.mounts == (
        Mount(f"{ROOT}/GPU-2", "/dev/null", read_only=True),
        Mount(f"{ROOT}/GPU-0", "/dev/null", read_only=True),
    )
    assert got.envs["CUDA_VISIBLE_DEVICES"] == "GPU-2,GPU-0"  # ordinal 0 is card 2, as granted
    assert got.cdi_devices == () and got.annotations == {}


@pytest.mark.parametrize(
    ("strategies", "visible", "mounted", "cdi", "annotated"),
    [
        (("volume-mounts",), ROOT, 1, (), False),
        (("env",), "GPU-1", 0, (), False),
        (("cdi-cri",), None, 0, ("nvidia.com/gpu=GPU-1",), False),
        (("cdi-annotations",), None, 0, (), True),
        (("volume-mounts", "cdi-cri"), ROOT, 1, ("nvidia.com/gpu=GPU-1",), False),
    ],
)
def test_each_strategy_passes_the_list_its_way(
    strategies: tuple[str, ...], visible: str | None, mounted: int, cdi: tuple[str, ...], annotated: bool
) -> None:
    got = _answer(share(1, exclusive=True), strategies=strategies)
    assert got.envs.get("NVIDIA_VISIBLE_DEVICES") == visible
    assert len([m for m in got.mounts if m.container_path.startswith(ROOT)]) == mounted
    assert got.cdi_devices == cdi
    if annotated:
        ((key, value),) = got.annotations.items()
        plugin, _, device = key.removeprefix("cdi.k8s.io/").partition("_")
        assert key.startswith("cdi.k8s.io/") and plugin == "gpuledger" and device
        assert len(key.split("/", 1)[1]) <= 63 and value == "nvidia.com/gpu=GPU-1"
    else:
        assert got.annotations == {}


@pytest.mark.parametrize(
    ("shares", "limit", "threads"),
    [
        ((share(0, mem=2048, core=300),), "0=2048M", "30"),
        ((share(3, mem=1024, core=125), share(1, mem=1024, core=125)), "0=1024M,1=1024M", "12"),
        ((share(2, mem=512, core=5),), "0=512M", "1"),  # 0.5 %: never 0, which would mean nothing
        ((share(1, exclusive=True),), "0=81920M", "100"),
    ],
)
def test_mps_limits_go_by_the_containers_ordinal(shares: tuple[CardShare, ...], limit: str, threads: str) -> None:
    got = _answer(*shares, isolation=Isolation.MPS)
    assert got.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == limit
    assert got.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == threads
    assert got.envs["CUDA_VISIBLE_DEVICES"] == ",".join(s.uuid for s in shares)
    assert "GPU-" not in got.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]  # never by UUID
    assert got.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert "CUDA_MPS_LOG_DIRECTORY" not in got.envs


def test_a_memory_only_mps_grant_is_not_throttled_to_one_percent() -> None:
    got = _answer(share(0, mem=4096, core=0), isolation=Isolation.MPS)
    assert got.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in got.envs


def test_mps_mounts_the_pipe_and_the_daemons_shm() -> None:
    got = _answer(share(0, mem=64), isolation=Isolation.MPS, mps_host_shm_dir="/run/nvidia/mps/shm")
    assert got.mounts[-2:] == (Mount("/tmp/nvidia-mps", "/run/nvidia/mps"), Mount("/dev/shm", "/run/nvidia/mps/shm"))
    plain = _answer(share(0, mem=64), isolation=Isolation.NONE, mps_host_shm_dir="/run/nvidia/mps/shm")
    assert [m.container_path for m in plain.mounts] == [f"{ROOT}/GPU-0"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("envvar", "unknown strategy 'envvar'; choose from volume-mounts, env, cdi-cri, cdi-annotations"),
        ("volume-mounts,cdi", "unknown strategy 'cdi'"),
        (",", "must name at least one strategy"),
        ("env,volume-mounts", "both set NVIDIA_VISIBLE_DEVICES"),
    ],
)
def test_a_bad_strategy_is_refused_by_name(value: str, message: str) -> None:
    with pytest.raises(SettingsError, match=r"^device_list_strategy: .*" + message.replace("(", r"\(")):
        load(PluginSettings, ["--node", "n1", "--device-list-strategy", value], {})


def test_the_settings_default_and_env_choice() -> None:
    assert load(PluginSettings, ["--node", "n1"], {}).strategies == ("volume-mounts",)
    env = {"GPULEDGER_DEVICE_LIST_STRATEGY": "env"}
    assert load(PluginSettings, ["--node", "n1"], env).strategies == ("env",)
    with pytest.raises(SettingsError, match=r"^mps_host_shm_dir: must be an absolute path"):
        load(PluginSettings, ["--node", "n1", "--mps-host-shm-dir", "shm"], {})


def test_the_policy_refuses_an_unknown_strategy_too() -> None:
    with pytest.raises(InvalidArgument, match=r"device_list_strategy: .*unknown 'env-var'"):
        AnswerPolicy(strategies=("env-var",))
