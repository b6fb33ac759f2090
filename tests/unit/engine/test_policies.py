"""The scheduling policies behind one protocol: each class implements it and describes itself
(name, help, whether it reads the spec's objectives, when it is the default); the classes found
in engine/policies/ are the one list of policies, which the engine's config and the CLI's
--scheduling (its choices, help and default) are built from; and the scheduler asks a policy
nothing outside the protocol."""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from engine.config import EngineConfig
from engine.kv_cache import BlockAllocator
from engine.policies import (
    DEFAULT_POLICY,
    POLICIES,
    POLICY_NAMES,
    SHED_REASONS,
    WITH_OBJECTIVES,
    WITHOUT_OBJECTIVES,
    PolicySettings,
    SchedulingPolicy,
    TierObjective,
    create_policy,
    default_policy,
    discover,
)
from engine.policies.fifo import FifoPolicy
from engine.sampling import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from slo.cli.engine_flags import add_engine_flags, choose_scheduling, scheduling_help
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
    # Found in engine/policies/, one module each: the three this repository has, at least.
    assert {"fifo", "priority", "slo"} <= set(POLICY_NAMES)
    assert {POLICIES[name].__module__ for name in POLICY_NAMES} == {
        f"engine.policies.{name}" for name in POLICY_NAMES
    }


@pytest.fixture
def policy_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty package `extra_policies` to write policy modules into; imported from tmp_path."""
    package = tmp_path / "extra_policies"
    package.mkdir()
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    for module in [m for m in sys.modules if m.split(".")[0] == "extra_policies"]:
        del sys.modules[module]


LIFO = """
from typing import ClassVar
from engine.policies.base import OrderingPolicy

class LifoPolicy(OrderingPolicy):
    name: ClassVar[str] = "lifo"
    help: ClassVar[str] = "newest first"
    promise: ClassVar[str] = "the newest request prefills first; nothing is preempted or shed"

    def __init__(self, settings=None):
        pass

    def rank(self, sequence, now_ns, tokens_per_step):
        return (0.0, 0, -sequence.arrival)

    def victim_key(self, sequence):
        return (0, sequence.arrival)

    def may_preempt(self, waiting, running):
        return False
"""


def test_a_module_with_a_policy_class_is_a_policy(policy_package: Path) -> None:
    (policy_package / "lifo.py").write_text(LIFO)
    (policy_package / "helpers.py").write_text("class Model:\n    pass\n")  # not a policy
    found = discover(importlib.import_module("extra_policies"))
    assert list(found) == ["lifo"]
    assert isinstance(found["lifo"](PolicySettings()), SchedulingPolicy)
    assert not found["lifo"].reads_objectives and found["lifo"].default_for is None  # inherited


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (('    help: ClassVar[str] = "newest first"\n', ""), "LifoPolicy: help must be a str"),
        (('"lifo"', '"lifo"\n    reads_objectives = "yes"'), "reads_objectives must be a bool"),
        (('"lifo"', '"lifo"\n    default_for = "always"'), "default_for is 'always'"),
    ],
)
def test_a_policy_that_does_not_describe_itself_is_refused(
    policy_package: Path, change: tuple[str, str], refusal: str
) -> None:
    (policy_package / "lifo.py").write_text(LIFO.replace(*change))
    with pytest.raises(TypeError, match=re.escape(refusal)):
        discover(importlib.import_module("extra_policies"))


def test_two_policies_of_one_name_are_refused(policy_package: Path) -> None:
    (policy_package / "lifo.py").write_text(LIFO)
    (policy_package / "stack.py").write_text(LIFO.replace("LifoPolicy", "StackPolicy"))
    with pytest.raises(TypeError, match="two policies are called 'lifo'"):
        discover(importlib.import_module("extra_policies"))


def test_each_kind_of_spec_has_one_default_policy() -> None:
    with_objectives = [n for n in POLICY_NAMES if POLICIES[n].default_for == WITH_OBJECTIVES]
    without = [n for n in POLICY_NAMES if POLICIES[n].default_for == WITHOUT_OBJECTIVES]
    assert with_objectives == [default_policy(objectives=True)]
    assert without == [default_policy(objectives=False)] == [DEFAULT_POLICY]
    # A spec with objectives gets a policy that keeps them; the engine's own default is the other.
    assert POLICIES[default_policy(objectives=True)].reads_objectives
    assert EngineConfig().scheduling == DEFAULT_POLICY


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


def test_the_cli_offers_exactly_the_engines_policies_with_their_help() -> None:
    parser = argparse.ArgumentParser()
    add_engine_flags(parser)
    (choices,) = re.findall(r"--scheduling \{([^}]*)\}", parser.format_usage())
    assert tuple(choices.split(",")) == POLICY_NAMES
    assert parser.parse_args([]).scheduling is None  # unset: the spec decides
    (action,) = [a for a in parser._actions if a.dest == "scheduling"]
    assert action.help is not None
    for name in POLICY_NAMES:  # the help describes every choice, in the class's words
        assert f"{name}: {POLICIES[name].help}" in action.help
    assert action.help.endswith(
        f"(default: {default_policy(objectives=True)} when the spec sets a TTFT or TPOT "
        f"objective on any tier, else {default_policy(objectives=False)})"
    )


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_the_cli_passes_the_specs_objectives_to_a_policy_that_reads_them(name: str) -> None:
    chosen = choose_scheduling(name, None)
    assert chosen["scheduling"] == name
    assert ("tier_objectives" in chosen) == POLICIES[name].reads_objectives


def test_what_a_policy_reads_is_the_classs_word_not_its_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class ReadsObjectives(FifoPolicy):  # a new policy that schedules by the spec's objectives
        name = "edf"
        help = "earliest TTFT deadline first"
        reads_objectives = True

    monkeypatch.setitem(POLICIES, "edf", ReadsObjectives)
    chosen = choose_scheduling("edf", None)
    assert chosen["scheduling"] == "edf" and chosen["tier_objectives"]
    assert "; edf: earliest TTFT deadline first (default:" in scheduling_help()
    # And one that does not, even under the name of one that does.
    monkeypatch.setitem(POLICIES, "slo", FifoPolicy)
    assert "tier_objectives" not in choose_scheduling("slo", None)


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
