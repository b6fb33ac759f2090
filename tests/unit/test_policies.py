"""The scheduling policies behind one protocol: each class implements it, the name-to-class map
is the one list of policies, every copy of that list agrees with it, and the scheduler asks a
policy nothing outside the protocol."""

from __future__ import annotations

import argparse
import inspect
import re
from typing import Any

import pytest

pytest.importorskip("torch")

from engine.config import EngineConfig
from engine.kv_cache import BlockAllocator
from engine.policies import (
    POLICIES,
    POLICY_NAMES,
    SHED_REASONS,
    PolicySettings,
    SchedulingPolicy,
    TierObjective,
    create_policy,
)
from engine.sampling import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from slo.cli.engine_flags import SCHEDULING, add_engine_flags
from slo.sli import SHED_REASONS as CATALOG_SHED_REASONS

SECOND = 1_000_000_000
# What the protocol declares: its methods and its one attribute (`name`).
PROTOCOL_METHODS = sorted(
    name
    for name, member in vars(SchedulingPolicy).items()
    if not name.startswith("_") and inspect.isfunction(member)
)
PROTOCOL_MEMBERS = {*PROTOCOL_METHODS, *SchedulingPolicy.__annotations__}


def test_the_protocol_is_what_the_scheduler_needs() -> None:
    # A walk that found no methods would make every check below pass.
    assert {"name", "rank", "shed", "shape_step", "after_step"} <= PROTOCOL_MEMBERS


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_each_policy_class_implements_the_protocol(name: str) -> None:
    policy_class = POLICIES[name]
    assert policy_class.name == name  # the map's key is the class's own name
    policy = policy_class(PolicySettings())
    assert isinstance(policy, SchedulingPolicy)
    for method in PROTOCOL_METHODS:
        declared = inspect.signature(getattr(SchedulingPolicy, method))
        implemented = inspect.signature(getattr(policy_class, method))
        assert list(implemented.parameters) == list(declared.parameters), (name, method)
        for parameter in declared.parameters.values():
            assert implemented.parameters[parameter.name].kind == parameter.kind, (name, method)


def test_the_map_is_the_one_list_of_policies() -> None:
    assert tuple(POLICIES) == POLICY_NAMES
    assert len(set(POLICIES.values())) == len(POLICIES)  # one class each
    for name in POLICY_NAMES:
        assert type(create_policy(name)) is POLICIES[name]  # chosen once, by name


def test_an_unknown_policy_is_refused_naming_every_known_one() -> None:
    with pytest.raises(ValueError, match="'lifo' is unknown") as error:
        create_policy("lifo")
    assert re.findall(r"use one of (.*)$", str(error.value)) == [", ".join(POLICY_NAMES)]


def test_engine_config_accepts_exactly_the_policies() -> None:
    for name in POLICY_NAMES:
        assert EngineConfig(scheduling=name).scheduling == name
    # Its refusal lists the names it accepts: those and no others.
    with pytest.raises(ValueError) as error:
        EngineConfig(scheduling="lifo")
    accepted = re.findall(r"'(\w+)'", str(error.value).split(";", 1)[1])
    assert tuple(accepted) == POLICY_NAMES


def test_the_cli_offers_exactly_the_engines_policies() -> None:
    # slo/cli keeps its own copy (building the parser must not import torch): it must agree.
    assert SCHEDULING == POLICY_NAMES
    parser = argparse.ArgumentParser()
    add_engine_flags(parser)
    (choices,) = re.findall(r"--scheduling \{([^}]*)\}", parser.format_usage())
    assert tuple(choices.split(",")) == POLICY_NAMES
    assert parser.parse_args([]).scheduling is None  # unset: the spec decides
    help_text = parser.format_help()
    for name in POLICY_NAMES:  # the help describes every choice
        assert f"{name}:" in help_text


def test_every_policy_states_its_promise() -> None:
    promises = {name: POLICIES[name].promise for name in POLICY_NAMES}
    assert all(len(promise) > 20 for promise in promises.values())
    assert len(set(promises.values())) == len(promises)  # one each, none copied


def test_shed_reasons_agree_with_the_catalog() -> None:
    assert SHED_REASONS == CATALOG_SHED_REASONS


# ------------------------------------------------------- the scheduler keeps to the protocol
class ProtocolOnly:
    """A real policy seen only through the protocol: anything else the scheduler reaches for
    fails the test, and every member used is counted."""

    def __init__(self, policy: SchedulingPolicy) -> None:
        self._policy = policy
        self.used: set[str] = set()

    def __getattr__(self, member: str) -> Any:
        if member not in PROTOCOL_MEMBERS:
            raise AttributeError(f"the scheduler used {member!r}, which is not in the protocol")
        self.used.add(member)
        return getattr(self._policy, member)


def make_sequence(name: str, priority: int, prompt_tokens: int, now_ns: int) -> Sequence:
    sequence = Sequence(
        request_id=name,
        prompt_ids=[1] * prompt_tokens,
        params=SamplingParams(max_tokens=50, temperature=0),
        priority=priority,
        arrival=now_ns,
        detokenizer=None,  # type: ignore[arg-type]  # never detokenized here
        deliver=lambda _: None,
    )
    sequence.arrival_ns = sequence.queued_ns = now_ns
    return sequence


def drive(policy: ProtocolOnly) -> None:
    """Steps that make every policy answer every question: a long batch prompt, a TPOT-bound
    premium request that needs the only batch slot, and one whose deadline is long gone."""
    scheduler = Scheduler(BlockAllocator(256), 4, 1, 32, policy=policy)  # type: ignore[arg-type]
    scheduler.add(make_sequence("batch", 2, 100, 0))
    for step in range(40):
        now = step * SECOND // 100
        if step == 10:
            scheduler.add(make_sequence("premium", 0, 8, now))
        if step == 20:
            scheduler.add(make_sequence("late", 1, 8, 0))  # 200 ms old: past its 50 ms
        plan = scheduler.schedule(now)
        for sequence, count in plan.chunks:
            sequence.num_cached += count
            sequence.prefilled = sequence.num_cached == sequence.num_tokens
        for sequence in plan.decodes:
            sequence.output_ids.append(0)
            sequence.num_cached = sequence.num_tokens
        scheduler.step_finished(plan, 0.02)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_the_scheduler_asks_a_policy_only_what_the_protocol_declares(name: str) -> None:
    objectives = {0: TierObjective(ttft_s=1.0, tpot_s=0.01), 1: TierObjective(ttft_s=0.05)}
    policy = ProtocolOnly(create_policy(name, objectives=objectives))
    drive(policy)
    # And nothing in the protocol is there for nobody: a scheduler that stopped asking one of
    # its questions would leave a member unused here.
    assert policy.used == set(PROTOCOL_METHODS)
