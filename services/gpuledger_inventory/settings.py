"""Settings of gpuledger-inventory: flags > ``GPULEDGER_*`` env > defaults, validated once."""

from __future__ import annotations

import argparse
import importlib.util
import socket
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from gpuledger_common.natscreds import credentials_of
from gpuledger_common.settings import SettingsError, nats_url_problem, redact_url
from gpuledger_core.errors import InvalidArgument
from gpuledger_core.slots import DEFAULT_SLOTS_PER_CARD, MAX_SLOTS_PER_CARD
from gpuledger_inventory.health import DEFAULT_IGNORED_XIDS

ENV_PREFIX = "GPULEDGER_"
KUBE_MODES = ("auto", "on", "off")
MODES = ("classic", "dra")  # how this node's pool is served (docs/dra.md)


@dataclass(frozen=True, slots=True)
class Settings:
    node: str = ""
    nats_url: str = "nats://127.0.0.1:4222"
    nats_user: str = ""  # this node's inventory user, inventory-<node> (docs/security.md)
    nats_password_file: str = ""
    nats_ca_file: str = ""
    nats_cert_file: str = ""
    nats_key_file: str = ""
    fake_fleet: str = ""  # a fleet file: run on the fake NVML instead of the real one
    http_host: str = "0.0.0.0"
    http_port: int = 9402
    heartbeat_interval_s: float = 5.0
    inventory_interval_s: float = 30.0
    poll_interval_s: float = 10.0
    event_wait_ms: int = 1000
    nvml_retry_max_s: float = 30.0
    ignore_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    recover_on_nvml_return: bool = True
    recover_after_s: float = 0.0
    state_file: str = ""
    kube: str = "auto"
    kubeconfig: str = ""
    in_cluster: bool = False  # detected from KUBERNETES_SERVICE_HOST
    mode: str = "classic"  # classic: the device plugin; dra: publish ResourceSlices (docs/dra.md)
    slots_per_card: int = DEFAULT_SLOTS_PER_CARD  # dra: the most claims sharing a card (1: never shared)
    dra_memory_step_mib: int = 256  # dra: the memory capacity's request step (and its minimum)
    dra_binding_conditions: bool = True  # dra: kube-scheduler binds a claim's pod only once the ledger committed it
    dra_resync_s: float = 30.0  # dra: how often the slices are read back and mended (kubelet deletes them)
    log_level: str = "info"
    log_format: str = "text"
    stop_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.node:
            raise InvalidArgument("node", "is required (--node or GPULEDGER_NODE)")
        for name in (
            "heartbeat_interval_s",
            "inventory_interval_s",
            "poll_interval_s",
            "nvml_retry_max_s",
            "dra_resync_s",
        ):
            if getattr(self, name) <= 0:
                raise InvalidArgument(name, f"must be positive, got {getattr(self, name)}")
        if not 1 <= self.event_wait_ms <= 60000:
            raise InvalidArgument("event_wait_ms", f"must be 1..60000, got {self.event_wait_ms}")
        if not 0 <= self.http_port <= 65535:
            raise InvalidArgument("http_port", f"must be 0..65535, got {self.http_port}")
        if self.recover_after_s < 0:
            raise InvalidArgument("recover_after_s", "must not be negative")
        if self.kube not in KUBE_MODES:
            raise InvalidArgument(
                "kube", f"must be one of {'|'.join(KUBE_MODES)}, got {self.kube!r}"
            )
        if self.mode not in MODES:
            raise InvalidArgument("mode", f"must be one of {'|'.join(MODES)}, got {self.mode!r}")
        if self.mode == "dra" and not self.use_kube:
            raise InvalidArgument("mode", "dra publishes ResourceSlices and needs Kubernetes (kube on or a kubeconfig)")
        if not 1 <= self.slots_per_card <= MAX_SLOTS_PER_CARD:
            raise InvalidArgument("slots_per_card", f"must be 1..{MAX_SLOTS_PER_CARD}, got {self.slots_per_card}")
        if not 1 <= self.dra_memory_step_mib <= 65536:
            raise InvalidArgument("dra_memory_step_mib", f"must be 1..65536, got {self.dra_memory_step_mib}")
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise InvalidArgument("log_level", f"must be debug|info|warning|error, got {self.log_level!r}")
        if self.log_format not in ("text", "json"):
            raise InvalidArgument("log_format", f"must be text|json, got {self.log_format!r}")
        if problem := nats_url_problem(self.nats_url):
            raise InvalidArgument("nats_url", problem)
        try:
            credentials_of(self)
        except SettingsError as err:
            field, _, problem = str(err).partition(": ")
            raise InvalidArgument(field, problem) from None
        if self.fake_fleet and importlib.util.find_spec("gpuledger_testing") is None:
            raise InvalidArgument(
                "fake_fleet",
                "needs the simulated fleet, which this install leaves out (the production image); "
                "use the image's dev target or install gpuledger with its test utilities",
            )

    @property
    def use_kube(self) -> bool:
        return self.kube == "on" or (
            self.kube == "auto" and (self.in_cluster or bool(self.kubeconfig))
        )

    def describe(self) -> dict[str, Any]:
        """The effective settings for the start-up log (a password in the URL is hidden)."""
        out = asdict(self)
        out["ignore_xids"] = sorted(self.ignore_xids)
        out["nats_url"] = redact_url(self.nats_url)
        return out


def parse_xids(text: str) -> frozenset[int]:
    try:
        return frozenset(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise InvalidArgument(
            "ignore_xids", f"must be a comma list of XID numbers, got {text!r}"
        ) from None


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


_CONVERT: dict[type, Any] = {int: int, float: float, bool: _bool, str: str}


_ALIASES = {"nats_url": ["--nats"]}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpuledger-inventory", description="Per-node GPU inventory and health."
    )
    for f in fields(Settings):
        if f.name == "in_cluster":
            continue
        flags = ["--" + f.name.replace("_", "-"), *_ALIASES.get(f.name, [])]
        p.add_argument(
            *flags,
            dest=f.name,
            default=None,
            metavar=f.name.upper(),
            help=f"env {ENV_PREFIX}{f.name.upper()}",
        )
    return p


def load_settings(argv: Sequence[str] | None, env: Mapping[str, str]) -> Settings:
    """Flags, then ``GPULEDGER_*`` env, then defaults; ``InvalidArgument`` names the field."""
    args = vars(_parser().parse_args(argv))
    values: dict[str, Any] = {}
    for f in fields(Settings):
        if f.name == "in_cluster":
            continue
        raw = args.get(f.name)
        if raw is None:
            raw = env.get(ENV_PREFIX + f.name.upper())
        if raw is None:
            continue
        values[f.name] = _convert(f.name, raw)
    values.setdefault("node", env.get("NODE_NAME") or socket.gethostname())
    values["in_cluster"] = bool(env.get("KUBERNETES_SERVICE_HOST"))
    return Settings(**values)


def _convert(name: str, raw: str) -> Any:
    if name == "ignore_xids":
        return parse_xids(raw)
    kind = type(getattr(Settings(node="x"), name))
    try:
        return _CONVERT[kind](raw)
    except (ValueError, KeyError):
        raise InvalidArgument(name, f"must be a {kind.__name__}, got {raw!r}") from None
