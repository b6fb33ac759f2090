"""Schemathesis against a real `slo serve` (uvicorn on 127.0.0.1, TLS, API keys, operations
token), fuzzed and stateful, 2,000 cases in all: no 5xx; no body or header carries a
traceback, a path of this machine, or uvicorn's or starlette's name or version; every request
that asks for a refused field is a 400 naming one it asked for.

The stateful phase follows the OpenAPI links from GET /v1/models to the generation routes, so
its requests carry the served model's name and reach the engine."""

from __future__ import annotations

import json
import re
import socket
import ssl
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("torch")
schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, Phase, settings  # noqa: E402

from engine.api.fields import BY_ROUTE  # noqa: E402
from engine.api.openapi import openapi_document  # noqa: E402
from slo.cli.bench.server import free_port, stop_process  # noqa: E402
from tests.helpers.tls import make_pki, wait_until_https_ready  # noqa: E402

pytestmark = pytest.mark.integration

MODEL = "bundled:tiny"
# Cases per generation route in the fuzzed phase, and stateful scenarios x steps: 2,000 in all.
FUZZED_PER_ROUTE = 700
SCENARIOS, STEPS = 60, 10
TOTAL_CASES = 2_000
SERVER_HEADER = "llm-slo-fuzzed"
# What must never reach a client. Matched case-insensitively; a hit that the request itself
# carried (an error quoting the bad value back) is not a leak.
LEAKS = re.compile(
    r"traceback|File \"|site-packages|dist-packages|\.py\b|/usr/|/home/|/work/|/tmp/|/root/"
    r"|uvicorn|starlette|python/|httptools|h11",
    re.IGNORECASE,
)
CALLS: Counter[str] = Counter()
STATUSES: Counter[int] = Counter()


@dataclass(frozen=True)
class Served:
    base_url: str
    api_key: str
    ops_token: str
    ca: str  # the CA file that verifies the server's certificate

    def kwargs(self) -> dict[str, Any]:
        """What every schemathesis call needs: the server, the key and the CA."""
        auth = {"Authorization": f"Bearer {self.api_key}"}
        return {"base_url": self.base_url, "headers": auth, "verify": self.ca, "timeout": 60}


def _new_key(path: Path) -> str:
    """A key made by `slo keys new`, as a user makes one; its hash lands in `path`."""
    made = subprocess.run(
        [sys.executable, "-m", "slo.cli", "keys", "new", "--file", str(path), "--id", "fuzz"],
        capture_output=True,
        text=True,
        check=True,
    )
    return made.stdout.split()[0]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    directory = tmp_path_factory.mktemp("fuzz")
    pki = make_pki(directory / "pki")
    api_key = _new_key(directory / "keys.yaml")
    token = "ops-" + "7" * 32
    (directory / "ops-token").write_text(token + "\n")
    port = free_port()
    command = [sys.executable, "-m", "slo.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
               "--model", MODEL, "--max-model-len", "64", "--store", f"sqlite:///{directory}/r.db",
               "--api-keys", str(directory / "keys.yaml"), "--ops-token-file",
               str(directory / "ops-token"), "--ssl-certfile", str(pki.server_cert),
               "--ssl-keyfile", str(pki.server_key), "--server-header", SERVER_HEADER]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base_url = f"https://127.0.0.1:{port}"
    try:
        context = ssl.create_default_context(cafile=str(pki.ca))
        wait_until_https_ready(base_url + "/health", context, timeout_s=120, process=process)
        yield Served(base_url, api_key, token, str(pki.ca))
    finally:
        stop_process(process)
        output = ""
        if process.stdout is not None:
            output = process.stdout.read()
            process.stdout.close()
        assert "Traceback" not in output, output


def _request_text(case: Any) -> str:
    body = case.body
    try:
        return json.dumps(body) + str(body)
    except (TypeError, ValueError):
        return str(body)


def _asked_refused(case: Any) -> set[str]:
    """The body's top-level fields that ask for what the engine does not do."""
    route = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}.get(case.path)
    if route is None or case.method != "POST" or not isinstance(case.body, dict):
        return set()
    fields = BY_ROUTE[route]  # type: ignore[index]
    return {
        name
        for name, value in case.body.items()
        if name not in fields
        or (fields[name].disposition == "refused" and not fields[name].accepts(value))
    }


def check_response(case: Any, response: Any) -> None:
    """The properties every answer holds, fuzzed or stateful."""
    CALLS[f"{case.method} {case.path}"] += 1
    STATUSES[response.status_code] += 1
    assert response.status_code < 500, f"{response.status_code}: {response.text[:500]}"
    request = _request_text(case).lower()
    # schemathesis keeps each header's values as a list
    exposed = [f"{name}: {value}" for name, values in response.headers.items() for value in values]
    for text in [response.text, *exposed]:
        for match in LEAKS.finditer(text):
            assert match.group().lower() in request, f"leak {match.group()!r} in {text[:300]!r}"
    assert response.headers.get("server") == [SERVER_HEADER]
    asked = _asked_refused(case)
    if asked and response.status_code not in (401, 413, 429):
        assert response.status_code == 400, f"{sorted(asked)} served: {response.status_code}"
        param = response.json()["error"]["param"]
        named = param.split(".")[0] if param else param
        assert named in asked, f"400 names {param!r}, the request asked for {sorted(asked)}"


schema = schemathesis.openapi.from_dict(openapi_document(MODEL))


@schema.parametrize()
@settings(
    max_examples=FUZZED_PER_ROUTE,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.generate],
    derandomize=True,  # the same cases on every run: a CI failure reproduces here
)
def test_fuzzed(case: Any, served: Served) -> None:
    response = case.call(**served.kwargs())
    check_response(case, response)


def test_stateful(served: Served) -> None:
    class Fuzzer(schema.as_state_machine()):  # type: ignore[misc]
        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return served.kwargs()

        def validate_response(self, response: Any, case: Any, **kwargs: Any) -> None:
            check_response(case, response)
            generated[case.method == "POST" and response.status_code == 200] += 1

    generated: Counter[bool] = Counter()
    before = sum(CALLS.values())
    Fuzzer.run(
        settings=settings(
            max_examples=SCENARIOS,
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
        )
    )
    assert sum(CALLS.values()) - before >= SCENARIOS  # each scenario made calls
    # The links carried the served model's name into generation requests that were served.
    assert generated[True] > 0, dict(generated)


def test_raw_http_garbage_and_ops_endpoints_expose_nothing(served: Served) -> None:
    """What the schema cannot send: bytes that are not HTTP, a body that is not JSON, and the
    operations endpoints without their token."""
    context = ssl.create_default_context(cafile=served.ca)
    host, port = served.base_url.removeprefix("https://").split(":")
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        tls.sendall(b"GET /\x00\x01 HTTP/9.9\r\nHost: \xff\r\n\r\n")
        reply = tls.recv(65536).decode("latin-1")
    assert not LEAKS.search(reply), reply
    key = {"Authorization": f"Bearer {served.api_key}"}
    with httpx.Client(verify=context, timeout=30) as client:
        for path in ("/metrics", "/slo", "/slo.html"):
            refused = client.get(served.base_url + path)
            assert refused.status_code == 401 and not LEAKS.search(
                refused.text + str(refused.headers)
            )
            token = {"Authorization": f"Bearer {served.ops_token}"}
            assert client.get(served.base_url + path, headers=token).status_code == 200
        broken = client.post(
            served.base_url + "/v1/completions", content=b'{"model": ', headers=key
        )
        assert broken.status_code == 400 and not LEAKS.search(broken.text)
        assert broken.headers["server"] == SERVER_HEADER


def test_the_run_made_the_cases_it_promised() -> None:
    """Last in the module: the fuzzed and stateful phases together sent 2,000 cases."""
    made = sum(CALLS.values())
    assert made >= TOTAL_CASES, f"{made} cases: {dict(CALLS)}"
    # Not a vacuous run: the key was taken every time, and many cases reached the engine.
    assert STATUSES[401] == 0 and STATUSES[200] >= made // 20, dict(STATUSES)
    print(f"schemathesis: {made} cases, statuses {dict(STATUSES)}")
