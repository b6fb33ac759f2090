"""`slo serve`'s capacity and scheduling flags: parsed into EngineConfig fields, bad values
named in one line, and `--scheduling slo` reading the tiers' objectives from the spec."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from slo.cli import main
from slo.cli.engine_flags import add_engine_flags, engine_overrides, parse_size
from slo.errors import UsageError
from slo.spec import SLOSpec


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_engine_flags(parser)
    return parser.parse_args(argv)


def test_flags_become_engine_config_fields() -> None:
    args = parse(
        "--max-batch-size", "8", "--max-model-len", "512", "--kv-cache-memory", "64MiB",
        "--max-num-batched-tokens", "128", "--scheduling", "fifo",
    )  # fmt: skip
    assert engine_overrides(args, None) == {
        "max_batch_size": 8,
        "max_model_len": 512,
        "max_num_batched_tokens": 128,
        "scheduling": "fifo",
        "scheduling_reason": "--scheduling fifo was given",
        "kv_cache_bytes": 64 * 2**20,
    }
    assert engine_overrides(parse("--kv-cache-blocks", "100"), None)["num_kv_blocks"] == 100


def test_slo_scheduling_reads_each_tiers_objectives_from_the_spec() -> None:
    overrides = engine_overrides(parse("--scheduling", "slo"), None)
    spec = SLOSpec.default()
    premium = next(t for t in spec.tiers if t.name == "premium")
    # The packaged example: premium p95 ttft <= 200ms, p95 tpot <= 50ms; batch has neither.
    assert overrides["tier_objectives"][premium.priority] == pytest.approx((0.2, 0.05))
    batch = next(t for t in spec.tiers if t.name == "batch")
    assert batch.priority not in overrides["tier_objectives"]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (("--max-batch-size", "0"), "--max-batch-size"),
        (("--max-num-batched-tokens", "-4"), "--max-num-batched-tokens"),
        (("--kv-cache-memory", "lots"), "--kv-cache-memory"),
        (("--kv-cache-memory", "0MiB"), "--kv-cache-memory"),
    ],
)
def test_bad_values_name_the_flag(argv: tuple[str, ...], named: str) -> None:
    with pytest.raises(UsageError, match=named):
        engine_overrides(parse(*argv), None)


def test_slo_scheduling_without_any_ttft_or_tpot_objective_is_refused(tmp_path: Path) -> None:
    spec = tmp_path / "slo.yaml"
    spec.write_text(
        "version: 1\ntiers:\n  - name: all\n    default: true\n"
        "    objectives: [availability >= 99%]\n"
    )
    with pytest.raises(UsageError, match="sets no TTFT or TPOT objective"):
        engine_overrides(parse("--scheduling", "slo"), str(spec))


def test_the_spec_drives_the_scheduler_by_default(tmp_path: Path) -> None:
    # The packaged example sets premium's TTFT and TPOT: unset, --scheduling is slo, and says why.
    chosen = engine_overrides(parse(), None)
    assert chosen["scheduling"] == "slo"
    assert chosen["scheduling_reason"].startswith("default: the packaged example spec sets")
    assert "premium" in chosen["scheduling_reason"]
    assert (
        chosen["tier_objectives"]
        == engine_overrides(parse("--scheduling", "slo"), None)["tier_objectives"]
    )
    # A spec without latency objectives: priority, with the reason; no objectives passed on.
    spec = tmp_path / "slo.yaml"
    spec.write_text(
        "version: 1\ntiers:\n  - name: all\n    default: true\n"
        "    objectives: [availability >= 99%]\n"
    )
    plain = engine_overrides(parse(), str(spec))
    assert plain["scheduling"] == "priority" and "tier_objectives" not in plain
    assert plain["scheduling_reason"] == (
        f"default: {spec} sets no TTFT or TPOT objective; tiers go in priority order"
    )
    # fifo and priority stay explicit choices, whatever the spec says.
    for name in ("fifo", "priority"):
        assert engine_overrides(parse("--scheduling", name), None)["scheduling"] == name


def test_default_scheduling_names_a_spec_it_cannot_read(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"the default scheduling reads .* --spec"):
        engine_overrides(parse(), str(tmp_path / "missing.yaml"))


def test_cli_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--kv-cache-memory", "lots", "--port", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--kv-cache-memory 'lots'" in err


def test_sizes() -> None:
    assert parse_size("2GiB", "--x") == 2 * 2**30
    assert parse_size("1.5 MB", "--x") == 1_500_000
    assert parse_size("4096", "--x") == 4096
