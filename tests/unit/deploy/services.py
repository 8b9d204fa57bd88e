"""What each gpuledger program accepts, read from the program itself: its console script in
pyproject.toml, its settings dataclass, and the flags and ``GPULEDGER_*`` variables its own
argument parser documents (``--help``)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import io
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"

# Services named by the deployment files whose code is not on this branch yet. Their commands
# and settings are checked as soon as their console script exists; remove them from here then.


@dataclass(frozen=True)
class Program:
    script: str
    flags: frozenset[str]
    env: frozenset[str]
    defaults: dict[str, object]

    @property
    def fields(self) -> frozenset[str]:
        return frozenset(self.defaults)


def console_scripts() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    scripts: dict[str, str] = project["scripts"]
    return scripts


@functools.cache
def program(script: str) -> Program:
    """The program behind a console script."""
    target = console_scripts().get(script)
    if target is None:
        raise LookupError(f"{script} is not a console script in pyproject.toml")
    module_name, _, function = target.partition(":")
    main = getattr(importlib.import_module(module_name), function)
    help_text = io.StringIO()
    with contextlib.redirect_stdout(help_text), contextlib.suppress(SystemExit):
        main(["--help"])
    text = help_text.getvalue()
    package = module_name.split(".")[0]
    return Program(
        script=script,
        flags=frozenset(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text)) - {"--help"},
        env=frozenset(re.findall(r"\bGPULEDGER_[A-Z0-9_]+", text)),
        defaults=_settings_defaults(package),
    )


def _settings_defaults(package: str) -> dict[str, object]:
    module = importlib.import_module(f"{package}.settings")
    for value in vars(module).values():
        if (
            isinstance(value, type)
            and dataclasses.is_dataclass(value)
            and value.__module__ == module.__name__
            and "nats_url" in {f.name for f in dataclasses.fields(value)}
        ):
            return {f.name: f.default for f in dataclasses.fields(value)}
    raise LookupError(f"{package}.settings has no settings dataclass")


def flags_of(args: list[str]) -> list[str]:
    """The option names in an argument list (``--name`` or ``--name=value``)."""
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]
