"""Which CDI device names the node's container runtime can resolve: those in the CDI specs of its
spec directories (containerd's and CRI-O's defaults are /etc/cdi and /var/run/cdi), as NVIDIA's
container toolkit writes them (``nvidia-ctk cdi generate``). A name is ``<kind>=<device name>``.

The plugin refuses, before binding, an Allocate answer naming a CDI device that no spec here
has: kubelet would admit the pod, and the runtime fail its container afterwards with a message
that names neither the pod's cards nor the plugin. The specs are read again whenever a file of
the directories changed (its name, size or modification time); a file that cannot be read or is
no CDI spec is skipped, as the runtime skips it, and logged once. The specs read are kept too
(``specs``, ``defining``): the plugin builds a MIG device's spec from the toolkit's (``mig_cdi``).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger(__name__)
SUFFIXES = (".json", ".yaml", ".yml")
Stamp = tuple[tuple[str, int, int], ...]
Spec = dict[str, Any]


class CdiSpecs:
    def __init__(self, dirs: Sequence[str]) -> None:
        self.dirs = tuple(dirs)
        self._stamp: Stamp | None = None
        self._names: frozenset[str] = frozenset()
        self._specs: tuple[tuple[str, Spec], ...] = ()
        self._warned: set[tuple[str, int, int]] = set()

    def unresolved(self, names: Iterable[str]) -> list[str]:
        """The names among ``names`` that no spec in the directories defines."""
        known = self.names()
        return [n for n in names if n not in known]

    def names(self) -> frozenset[str]:
        self._refresh()
        return self._names

    def specs(self) -> tuple[tuple[str, Spec], ...]:
        """Every readable CDI spec of the directories, as (path, spec), in path order."""
        self._refresh()
        return self._specs

    def defining(self, name: str) -> list[str]:
        """The paths of the specs that define the CDI device ``name`` (``<kind>=<device name>``)."""
        return [path for path, spec in self.specs() if name in _device_names(spec)]

    def _refresh(self) -> None:
        stamp = self._files()
        if stamp != self._stamp:
            read = [(entry[0], spec) for entry in stamp if (spec := self._read(entry)) is not None]
            self._specs = tuple(read)
            self._names = frozenset(name for _, spec in read for name in _device_names(spec))
            self._stamp = stamp

    def _files(self) -> Stamp:
        found: list[tuple[str, int, int]] = []
        for directory in self.dirs:
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue  # a directory that does not exist holds no spec
            for entry in entries:
                if entry.name.endswith(SUFFIXES):
                    try:
                        info = entry.stat()
                    except OSError:
                        continue
                    found.append((entry.path, info.st_size, info.st_mtime_ns))
        return tuple(sorted(found))

    def _read(self, entry: tuple[str, int, int]) -> Spec | None:
        path = entry[0]
        try:
            spec = yaml.safe_load(Path(path).read_text())  # JSON is YAML too
            _device_names(spec)
        except (OSError, yaml.YAMLError, ValueError) as err:
            if entry not in self._warned:
                self._warned.add(entry)
                log.warning("CDI spec %s skipped: %s", path, err)
            return None
        assert isinstance(spec, dict)
        return spec


def _device_names(spec: Any) -> list[str]:
    if not isinstance(spec, dict) or not isinstance(spec.get("kind"), str) or "/" not in spec["kind"]:
        raise ValueError("no CDI spec (it names no vendor/class kind)")
    devices = spec.get("devices")
    if not isinstance(devices, list):
        raise ValueError("no CDI spec (its devices are not a list)")
    kind = spec["kind"]
    return [f"{kind}={d['name']}" for d in devices if isinstance(d, dict) and isinstance(d.get("name"), str)]


def write_spec(path: Path, content: Mapping[str, Any]) -> bool:
    """Write a CDI spec atomically (a runtime never reads half a file); False when the file is
    there with this content already."""
    text = json.dumps(content, indent=2, sort_keys=True) + "\n"
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".gpuledger-", suffix=".tmp")
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return True
