"""The engine's capacity and scheduling flags, shared by `slo serve` and the demo.

--max-batch-size, --max-model-len, --kv-cache-memory or --kv-cache-blocks,
--max-num-batched-tokens and --scheduling (the names vLLM users know) with the engine's
policies as its choices: their names, help and whether they read the spec's objectives come
from the policy classes (engine.policies, which imports without torch: `slo --help` stays
light). The spec drives the scheduler by default: when the spec the middleware judges with
sets a TTFT or TPOT objective on any tier, the engine runs the policy that schedules by them
(`slo`); a spec without latency objectives gets `priority`. The others stay explicit choices.
The choice and its reason travel to the engine (`EngineConfig.scheduling_reason`), which shows
both in /health.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from engine.policies import POLICIES, POLICY_NAMES, default_policy
from slo.cli.common.flags import add_number_flag, check_at_least_one
from slo.errors import UsageError

SCHEDULING = POLICY_NAMES  # --scheduling's choices (slo compare's scheduling variants too)
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]i?b|b)?\s*$", re.IGNORECASE)


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    add_number_flag(parser, "--max-batch-size", int, 64, "sequences decoded together in one step")
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="context length: prompt plus output tokens (default: the model's)",
    )
    kv = parser.add_mutually_exclusive_group()
    kv.add_argument(
        "--kv-cache-memory",
        default=None,
        metavar="SIZE",
        help="memory for the KV cache, e.g. 512MiB or 2GiB (default: 256MiB)",
    )
    kv.add_argument(
        "--kv-cache-blocks",
        type=int,
        default=None,
        metavar="N",
        help="KV-cache blocks of 16 tokens, instead of --kv-cache-memory",
    )
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        metavar="N",
        help="tokens one engine step computes: running decodes first, prefill chunks fill the "
        "rest, so a long prompt spans several steps instead of stalling the decodes "
        "(default: 4096; smaller keeps inter-token latency low under long prompts)",
    )
    parser.add_argument("--scheduling", choices=SCHEDULING, default=None, help=scheduling_help())


def scheduling_help() -> str:
    """Each policy's help, then which runs when none is named."""
    choices = "; ".join(f"{name}: {policy.help}" for name, policy in POLICIES.items())
    return (
        f"{choices} (default: {default_policy(objectives=True)} when the spec sets a TTFT or "
        f"TPOT objective on any tier, else {default_policy(objectives=False)})"
    )


def parse_size(text: str, flag: str) -> int:
    match = _SIZE.match(text)
    if match is None:
        raise UsageError(f"{flag} {text!r}: give a size such as 512MiB, 2GiB or 1000000 (bytes)")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    size = int(number * _UNITS[unit])
    if size <= 0:
        raise UsageError(f"{flag} must be more than 0 bytes, got {text!r}")
    return size


def engine_overrides(args: argparse.Namespace, spec_path: str | None) -> dict[str, Any]:
    """EngineConfig fields from the flags; one line naming the flag on a bad value."""
    check_at_least_one(
        {
            "--max-batch-size": args.max_batch_size,
            "--max-model-len": args.max_model_len,
            "--kv-cache-blocks": args.kv_cache_blocks,
            "--max-num-batched-tokens": args.max_num_batched_tokens,
        }
    )
    overrides: dict[str, Any] = {
        "max_batch_size": args.max_batch_size,
        "max_model_len": args.max_model_len,
        "max_num_batched_tokens": args.max_num_batched_tokens,
    }
    if args.kv_cache_blocks is not None:
        overrides["num_kv_blocks"] = args.kv_cache_blocks
    if args.kv_cache_memory is not None:
        overrides["kv_cache_bytes"] = parse_size(args.kv_cache_memory, "--kv-cache-memory")
    overrides.update(choose_scheduling(args.scheduling, spec_path))
    return overrides


def choose_scheduling(explicit: str | None, spec_path: str | None) -> dict[str, Any]:
    """The policy, why it was chosen, and the tiers' objectives it schedules by.

    `explicit` is --scheduling as given (None: not given). Unset, the spec decides: the
    default policy for a spec with a TTFT or TPOT objective on any tier (a spec is a promise;
    the scheduler keeps it), or the one for a spec without.
    """
    if explicit is not None and explicit not in POLICIES:
        raise UsageError(f"--scheduling {explicit!r}: use one of {', '.join(POLICY_NAMES)}")
    if explicit is not None and not POLICIES[explicit].reads_objectives:
        return {"scheduling": explicit, "scheduling_reason": f"--scheduling {explicit} was given"}
    from slo.errors import SpecError
    from slo.isolation import tier_objectives
    from slo.spec import SLOSpec

    where = spec_path or "the packaged example spec"
    try:
        spec = SLOSpec.load(spec_path) if spec_path else SLOSpec.default()
    except (SpecError, OSError) as error:
        flag = f"--scheduling {explicit}" if explicit else "the default scheduling"
        raise UsageError(f"{flag} reads the tiers' objectives from --spec: {error}") from None
    objectives = tier_objectives(spec)
    tiers = ", ".join(t.name for t in spec.tiers if t.priority in objectives)
    if explicit is None:
        name = default_policy(objectives=bool(objectives))
        reason = (
            f"default: {where} sets TTFT/TPOT objectives on {tiers}; scheduling keeps them"
            if objectives
            else f"default: {where} sets no TTFT or TPOT objective; tiers go in priority order"
        )
    else:
        name, reason = explicit, f"--scheduling {explicit} was given"
    if not objectives and explicit:
        raise UsageError(
            f"--scheduling {explicit}: the spec {spec_path or '(packaged example)'} sets no TTFT "
            "or TPOT objective on any tier; add one (e.g. 'p95 ttft <= 200ms') or use "
            f"--scheduling {default_policy(objectives=False)}"
        )
    chosen: dict[str, Any] = {"scheduling": name, "scheduling_reason": reason}
    if POLICIES[name].reads_objectives:
        chosen["tier_objectives"] = objectives
    return chosen
