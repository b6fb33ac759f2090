"""Generated rules judged by `promtool test rules` on test groups written for them."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from alerts.rules import Links, group_order, render_rules
from alerts.templating import render
from slo.promql import prom_duration
from slo.spec import SLOSpec
from tests.helpers.binaries import binary


def promtool_test_rules(
    folder: Path,
    spec: SLOSpec,
    links: Links,
    groups: list[dict[str, Any]],
    step_s: float,
    source: str,
) -> subprocess.CompletedProcess[str]:
    """Write the spec's rules and a test file of `groups` (evaluated every `step_s`) into
    `folder`, and run promtool on them (one run for every group)."""
    promtool = binary("promtool")
    (folder / "rules.yml").write_text(render_rules(spec, links))
    text = render(
        "rules_test.yml.j2",
        rules_file="rules.yml",
        evaluation_interval=prom_duration(step_s),
        group_eval_order=group_order(spec),
        groups=groups,
        source=source,
    )
    (folder / "rules_test.yml").write_text(text)
    return subprocess.run(
        [promtool, "test", "rules", "rules_test.yml"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
