"""The inventory's state file: the health book, the remediation book and the MIG book on disk, so
that a restart never turns a card healthy silently, resumes a card's repair where it was, and
knows which MIG instances it made (docs/mig.md, "The node's part")."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from gpuledger_core.errors import InvalidArgument
from gpuledger_inventory.health import HealthBook, HealthPolicy
from gpuledger_inventory.mig_book import MigBook
from gpuledger_inventory.remediation import RemediationBook, RemediationPolicy


class HealthStore:
    """The books on disk (one JSON object; written whole, atomically)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path) if path else None
        self.found = self.path is not None and self.path.exists()  # a book saved by an earlier run

    def _raw(self) -> dict[str, Any]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            raw = json.loads(self.path.read_text())
        except (OSError, ValueError) as err:
            raise InvalidArgument("state_file", f"cannot read {self.path}: {err}") from err
        if not isinstance(raw, dict):
            raise InvalidArgument("state_file", f"cannot read {self.path}: not an object")
        return raw

    def load(self, policy: HealthPolicy) -> HealthBook:
        try:
            return HealthBook.from_json(self._raw(), policy)
        except (ValueError, KeyError, TypeError) as err:
            raise InvalidArgument("state_file", f"cannot read {self.path}: {err}") from err

    def load_remedies(self, policy: RemediationPolicy) -> RemediationBook:
        try:
            return RemediationBook.from_json(self._raw().get("remediation", {}), policy)
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise InvalidArgument("state_file", f"cannot read the remediation in {self.path}: {err}") from err

    def load_mig(self) -> MigBook:
        """The MIG instances made on demand and the instances' faults (none in a file without them)."""
        try:
            return MigBook.from_json(self._raw().get("mig", {}))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise InvalidArgument("state_file", f"cannot read the MIG instances in {self.path}: {err}") from err

    def save(self, book: HealthBook, remedies: RemediationBook | None = None, mig: MigBook | None = None) -> None:
        """Write the books (the MIG book only when it holds something: a node without MIG writes
        the file as before)."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".health-")
        body = book.to_json() | ({"remediation": remedies.to_json()} if remedies is not None else {})
        if mig is not None and not mig.empty():
            body["mig"] = mig.to_json()
        with os.fdopen(fd, "w") as out:
            json.dump(body, out)
        os.replace(tmp, self.path)
