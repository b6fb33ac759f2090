"""`slo generate --webhook-token-file/--webhook-ca-file`: every Alertmanager webhook carries the
bearer token and CA as files, and Alertmanager's own checker accepts the config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.binaries import binary

pytestmark = pytest.mark.integration


def test_every_webhook_carries_the_token_and_ca_files(tmp_path: Path) -> None:
    amtool = binary("amtool")
    token, ca = tmp_path / "webhook.token", tmp_path / "webhook-ca.pem"
    out = tmp_path / "out"
    command = [sys.executable, "-m", "slo.cli", "generate", "--out", str(out)]
    command += ["--webhook-url", "https://hooks.example.com/llm-slo"]
    command += ["--webhook-token-file", str(token), "--webhook-ca-file", str(ca)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    path = out / "alertmanager" / "alertmanager.yml"
    config = yaml.safe_load(path.read_text())
    hooks = [hook for receiver in config["receivers"] for hook in receiver["webhook_configs"]]
    assert hooks
    for hook in hooks:
        assert hook["http_config"] == {
            "authorization": {"type": "Bearer", "credentials_file": str(token)},
            "tls_config": {"ca_file": str(ca)},
        }
    assert str(token) in path.read_text() and "Bearer" in path.read_text()
    token.write_text("s3cret\n")  # amtool reads the files it is pointed at
    ca.write_text("")
    checked = subprocess.run(
        [amtool, "check-config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_without_the_flags_no_http_config_is_written(tmp_path: Path) -> None:
    out = tmp_path / "out"
    command = [sys.executable, "-m", "slo.cli", "generate", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "http_config" not in (out / "alertmanager" / "alertmanager.yml").read_text()
