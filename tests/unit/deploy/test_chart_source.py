"""deploy/helm/gpuledger: its generated templates are what ``python -m tests.support.chart`` writes
from deploy/kubernetes today, so a change of the kustomize source that is not carried to the chart
fails here, without helm (tox -e helm renders the chart and compares it with kustomize)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import yaml

from tests.support.chart import CHART, OUT, generate, main, stale


def test_the_committed_templates_are_what_the_generator_writes_from_the_kustomize_source() -> None:
    assert main(["--check"]) == 0, "the chart is stale: run python -m tests.support.chart and commit the result"


def test_every_source_object_has_a_template_and_every_value_it_reads_is_declared() -> None:
    files = generate()
    assert set(files) == {p.name for p in OUT.iterdir()}
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    text = "".join(files.values())
    for path in sorted(set(re.findall(r"\$\.Values\.([A-Za-z.]+)", text))):
        node = values
        for part in path.split("."):
            assert isinstance(node, dict) and part in node, f"the templates read .Values.{path}, values.yaml lacks it"
            node = node[part]


def test_the_check_catches_an_edited_and_an_extra_template(tmp_path: Path) -> None:
    copy = tmp_path / "generated"
    shutil.copytree(OUT, copy)
    assert stale(copy) == []
    (copy / "base-viewer.yaml").write_text((copy / "base-viewer.yaml").read_text() + "# edited by hand\n")
    (copy / "extra.yaml").write_text("")
    assert stale(copy) == ["base-viewer.yaml", "extra.yaml"]
