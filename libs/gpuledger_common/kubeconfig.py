"""Kubernetes access, the same in every service: one vocabulary of modes, one test for "in a pod",
one loader of the client configuration.

A service's ``kube`` setting (``KubeClientSettings``) is one of:

- ``in-cluster``: the pod's service account (its token and CA under
  ``/var/run/secrets/kubernetes.io/serviceaccount``, the API server from ``KUBERNETES_SERVICE_HOST``
  and ``KUBERNETES_SERVICE_PORT``);
- ``kubeconfig``: the file the ``kubeconfig`` setting names, or when that is empty the client's
  default (``$KUBECONFIG``, else ``~/.kube/config``);
- ``off``: no Kubernetes;
- ``auto`` (the default): ``in-cluster`` when the pod's service-account token and
  ``KUBERNETES_SERVICE_HOST`` are both there, else ``kubeconfig`` when the ``kubeconfig`` setting
  names a file, else ``off``. ``$KUBECONFIG`` alone does not make ``auto`` reach a cluster: a
  process that inherits a shell's ``$KUBECONFIG`` (a test, the local stack) would reach a cluster
  it was not told to; ``kube=kubeconfig`` reads it.

This is the one module outside the services' ``kube.py`` adapters that imports kubernetes_asyncio,
and only to load the configuration; the adapters take the loaded configuration from ``load``.
A mode that cannot be loaded (``in-cluster`` outside a pod, a kubeconfig that cannot be read) is a
``SettingsError`` naming the setting, whatever the mode asked.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from gpuledger_common.natscreds import NatsClientSettings
from gpuledger_common.settings import SettingsError, option

log = logging.getLogger(__name__)

Configuration = Any  # kubernetes_asyncio.client.Configuration: the API server, its CA, the credentials


class Mode(StrEnum):
    AUTO = "auto"
    IN_CLUSTER = "in-cluster"
    KUBECONFIG = "kubeconfig"
    OFF = "off"


MODES = tuple(mode.value for mode in Mode)
RENAMED = {"on": "in-cluster or kubeconfig"}  # an older vocabulary's values, and what replaces them
HOST_ENV = "KUBERNETES_SERVICE_HOST"
KUBE_HELP = (
    "Kubernetes access: auto (in-cluster in a pod with a service-account token and KUBERNETES_SERVICE_HOST, "
    "else the kubeconfig if one is given, else off), in-cluster, kubeconfig or off"
)
KUBECONFIG_HELP = "kubeconfig file (kube=kubeconfig or auto; empty with kube=kubeconfig: $KUBECONFIG, ~/.kube/config)"


def mode_problem(value: str) -> str:
    """What is wrong with a ``kube`` value; empty when nothing is."""
    if value in MODES:
        return ""
    if value in RENAMED:
        return f"{value!r} is not a mode; use {RENAMED[value]}"
    return f"must be one of {', '.join(MODES[:-1])} or {MODES[-1]}, got {value!r}"


def check_mode(value: str, name: str = "kube") -> Mode:
    problem = mode_problem(value)
    if problem:
        raise SettingsError(f"{name}: {problem}")
    return Mode(value)


@dataclass(frozen=True, slots=True)
class Pod:
    """Where a pod's service account shows: its files and the API server's address in the environment."""

    directory: Path = Path("/var/run/secrets/kubernetes.io/serviceaccount")
    env: Mapping[str, str] = field(default_factory=lambda: os.environ)

    @property
    def token(self) -> Path:
        return self.directory / "token"

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"


HERE = Pod()


def in_cluster(pod: Pod = HERE) -> bool:
    """Whether this process runs in a pod that can reach its API server: the service-account token
    is mounted and ``KUBERNETES_SERVICE_HOST`` is set."""
    return bool(pod.env.get(HOST_ENV)) and pod.token.is_file()


def resolve(mode: str, kubeconfig: str, pod: Pod = HERE) -> Mode:
    """The mode ``auto`` stands for here (any other mode stands for itself): never ``auto``."""
    chosen = check_mode(mode)
    if chosen is not Mode.AUTO:
        return chosen
    if in_cluster(pod):
        return Mode.IN_CLUSTER
    return Mode.KUBECONFIG if kubeconfig else Mode.OFF


def why_off(mode: str) -> str:
    """Why ``mode`` came to no Kubernetes, for a service that needs it."""
    if mode == Mode.OFF:
        return "kube is off"
    return (
        f"kube is {mode} and found no pod's service account (token and {HOST_ENV}) and no kubeconfig setting; "
        "set kube to in-cluster, or kubeconfig (with the kubeconfig setting, or $KUBECONFIG)"
    )


async def load(mode: str, kubeconfig: str, pod: Pod = HERE) -> Configuration | None:
    """The client configuration of ``mode`` (``resolve``), or None for ``off``."""
    resolved = resolve(mode, kubeconfig, pod)
    if resolved is Mode.OFF:
        log.info("no Kubernetes access (kube=%s)", mode)
        return None
    from kubernetes_asyncio import client

    configuration = client.Configuration()
    if resolved is Mode.IN_CLUSTER:
        _load_in_cluster(configuration, pod)
    else:
        await _load_kubeconfig(configuration, kubeconfig)
    log.info("Kubernetes access: %s (kube=%s), API server %s", resolved, mode, configuration.host)
    return configuration


async def load_required(mode: str, kubeconfig: str, what: str, pod: Pod = HERE) -> Configuration:
    """``load`` for a service (or a mode of one) that cannot run without Kubernetes: ``what`` names it."""
    found = await load(mode, kubeconfig, pod)
    if found is None:
        raise SettingsError(f"kube: {what} needs Kubernetes, but {why_off(mode)}")
    return found


async def from_file(kubeconfig: str) -> Configuration:
    """The configuration in one kubeconfig file (a tool's, a test's)."""
    return await load(Mode.KUBECONFIG, kubeconfig)


@dataclass(frozen=True, slots=True)
class UserAccess:
    """A person's access as kubectl reads it: the client configuration of one context, the context's
    name and namespace ("" when it names none), and the kubeconfig file(s) it came from."""

    configuration: Configuration
    context: str
    namespace: str
    files: str


async def for_user(files: str, context: str = "") -> UserAccess:
    """The access of ``context`` ("": the current context) in ``files``, kubectl's list of kubeconfig
    files (paths joined by ``os.pathsep``, as in ``$KUBECONFIG``; merged the way kubectl merges them).
    A list naming no file that exists, a context that is not there, or a file the client cannot use is
    a ``SettingsError`` that says which."""
    if not _any_file(files):
        raise SettingsError(f"kubeconfig: no such file: {files or '(none given)'}")
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    try:
        loader = await config.load_kube_config(
            config_file=files, context=context or None, client_configuration=configuration
        )
    except Exception as err:  # ConfigException, OSError, YAML errors: not a usable kubeconfig or context
        which = f"context {context!r} of " if context else ""
        raise SettingsError(f"kubeconfig: cannot use {which}{files}: {err}") from err
    chosen = loader.current_context or {}
    namespace = str((chosen.get("context") or {}).get("namespace") or "")
    return UserAccess(configuration, str(chosen.get("name") or context), namespace, files)


def _any_file(files: str) -> bool:
    return any(Path(p).expanduser().is_file() for p in files.split(os.pathsep) if p)


def _load_in_cluster(configuration: Configuration, pod: Pod) -> None:
    from kubernetes_asyncio import config

    try:
        config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration,
            token_filename=str(pod.token),
            cert_filename=str(pod.ca),
            environ=pod.env,
        )
    except Exception as err:  # ConfigException, OSError: the pod's service account is not usable
        raise SettingsError(f"kube: in-cluster, but the pod's service account cannot be used: {err}") from err


async def _load_kubeconfig(configuration: Configuration, kubeconfig: str) -> None:
    from kubernetes_asyncio import config

    try:
        await config.load_kube_config(config_file=kubeconfig or None, client_configuration=configuration)
    except Exception as err:  # ConfigException, OSError, YAML errors: the file is not a usable kubeconfig
        where = repr(kubeconfig) if kubeconfig else "the default ($KUBECONFIG or ~/.kube/config)"
        raise SettingsError(f"kubeconfig: cannot load {where}: {err}") from err


@dataclass(frozen=True, slots=True)
class KubeClientSettings(NatsClientSettings):
    """How a service reaches NATS and Kubernetes. A service's settings class derives from it and
    calls ``check_kube`` (which checks NATS too) in its ``__post_init__``."""

    kube: str = option(Mode.AUTO.value, KUBE_HELP)
    kubeconfig: str = option("", KUBECONFIG_HELP)

    def check_kube(self) -> None:
        self.check_nats()
        check_mode(self.kube)

    async def kube_configuration(self) -> Configuration | None:
        return await load(self.kube, self.kubeconfig)

    async def required_kube_configuration(self, what: str) -> Configuration:
        return await load_required(self.kube, self.kubeconfig, what)
