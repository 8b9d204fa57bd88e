"""deploy/Dockerfile and .dockerignore, read as text (tests/compose builds and inspects the images)."""

from __future__ import annotations

import re

from .services import DEPLOY, ROOT, console_scripts

DOCKERFILE = (DEPLOY / "Dockerfile").read_text()


def instructions(name: str) -> list[str]:
    return re.findall(rf"^{name}\s+(.+)$", DOCKERFILE, re.MULTILINE)


def stage(name: str) -> str:
    """The text of one stage, from its FROM to the next."""
    start = re.search(rf"^FROM \S+ AS {name}$", DOCKERFILE, re.MULTILINE)
    assert start, f"no stage {name}"
    end = re.search(r"^FROM ", DOCKERFILE[start.end() :], re.MULTILINE)
    return DOCKERFILE[start.start() : start.end() + (end.start() if end else len(DOCKERFILE))]


def test_production_is_the_default_target_and_dev_a_separate_one_on_python_3_11() -> None:
    names = [s.split()[-1] for s in instructions("FROM")]
    assert names[-1] == "production"  # what a plain docker build makes
    assert "dev" in names
    (base,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE, re.MULTILINE)
    assert base.startswith("python:3.11-slim")


def test_production_installs_the_package_alone_and_dev_adds_the_dev_mode() -> None:
    production = "\n".join(line for line in stage("install-production").splitlines() if not line.startswith("#"))
    assert re.search(r"install --constraint constraints\.txt \.( |\\?$)", production, re.MULTILINE)
    assert "gpuledger_dev" not in production and "rm " not in production  # left out by packaging
    assert "install --constraint constraints.txt . ./libs/gpuledger_dev" in stage("install-dev")
    assert "--from=install-production" in stage("production")
    assert "--from=install-dev" in stage("dev")


def test_wheels_come_from_the_index_or_only_from_the_wheelhouse() -> None:
    (default,) = re.findall(r"^ARG WHEELS=(\S+)$", DOCKERFILE, re.MULTILINE)
    assert default == "index"
    assert re.search(r"^FROM packages-\$\{WHEELS\} AS build$", DOCKERFILE, re.MULTILINE)
    assert "PIP_NO_INDEX=1" in stage("packages-wheelhouse")


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
            assert (ROOT / source).exists() or source == "deploy/wheelhouse/"  # made for an offline build


def test_the_image_leaves_the_program_to_the_command() -> None:
    assert not instructions("ENTRYPOINT")
    (cmd,) = instructions("CMD")
    assert cmd.split('"')[1] in console_scripts()
