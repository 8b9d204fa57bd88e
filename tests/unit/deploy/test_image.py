"""deploy/Dockerfile and .dockerignore, read as text (no Docker engine here)."""

from __future__ import annotations

import re

from .services import DEPLOY, ROOT, console_scripts

DOCKERFILE = (DEPLOY / "Dockerfile").read_text()


def instructions(name: str) -> list[str]:
    return re.findall(rf"^{name}\s+(.+)$", DOCKERFILE, re.MULTILINE)


def test_builds_in_one_stage_and_runs_in_another_on_python_3_11() -> None:
    stages = instructions("FROM")
    assert [s.split()[-1] for s in stages] == ["build", "runtime"]
    (base,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE, re.MULTILINE)
    assert base.startswith("python:3.11-slim")
    assert "--mount=type=bind,from=build" in DOCKERFILE


def test_runs_as_an_unprivileged_user() -> None:
    user = instructions("USER")[-1]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) >= 1000


def test_no_secret_is_baked_in() -> None:
    assignments = " ".join(instructions("ENV") + instructions("ARG"))
    assert not re.search(r"PASSWORD|TOKEN|SECRET|KEY", assignments, re.IGNORECASE)


def test_copies_only_what_the_dockerignore_lets_through() -> None:
    allowed = {line.strip("!/") for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")}
    for copy in instructions("COPY"):
        if copy.startswith("--from"):
            continue
        *sources, _ = copy.split()
        for source in sources:
            assert source.rstrip("/") in allowed
            assert (ROOT / source).exists()


def test_the_image_leaves_the_program_to_the_command() -> None:
    assert not instructions("ENTRYPOINT")
    (cmd,) = instructions("CMD")
    assert cmd.split('"')[1] in console_scripts()
