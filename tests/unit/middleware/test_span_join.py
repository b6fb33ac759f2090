"""The span join: every finished request is reported exactly once, with its engine span when
the span comes within the wait, without it otherwise; stray spans are bounded and counted."""

from __future__ import annotations

from middleware.intake import SpanJoin
from middleware.upstream import SpanPhases


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def span(trace: str, request_id: str | None = None, queue_s: float = 0.1) -> SpanPhases:
    return SpanPhases(trace_id=trace, request_id=request_id, queue_s=queue_s, engine="vllm")


def make(expect: str = "always", **kwargs: float) -> tuple[SpanJoin, Clock, list]:
    clock = Clock()
    join = SpanJoin(kwargs.pop("wait_s", 5.0), expect=expect, now=clock, **kwargs)  # type: ignore[arg-type]
    return join, clock, []


def test_a_span_after_the_response_is_joined_once() -> None:
    join, clock, reports = make()
    assert join.settle("t1", "r1", reports.append) == 5.0
    assert reports == []
    clock.now = 3.0
    join.add([span("t1")])
    join.add([span("t1")])  # exported twice
    clock.now = 10.0
    join.expire()
    assert [r.trace_id for r in reports] == ["t1"]
    assert (join.counts.joined, join.counts.duplicates, join.counts.waited_in_vain) == (1, 1, 0)


def test_a_span_before_the_response_is_held_then_joined() -> None:
    join, _clock, reports = make()
    join.add([span("t1"), span("t1")])
    assert join.settle("t1", None, reports.append) is None
    assert [r.trace_id for r in reports] == ["t1"]
    assert join.counts.duplicates == 1 and join.held == 0


def test_a_span_that_never_comes_reports_without_it_after_the_wait() -> None:
    join, clock, reports = make()
    join.settle("t1", None, reports.append)
    clock.now = 4.9
    assert join.expire() == 5.0 - 4.9  # a timer that fired early: set it again for the rest
    assert reports == []
    clock.now = 5.0
    join.expire()
    assert reports == [None]
    assert join.waiting == 0 and join.counts.waited_in_vain == 1
    join.add([span("t1")])  # too late: held for a request that already went
    assert reports == [None] and join.held == 1


def test_the_request_id_finds_a_span_from_another_trace() -> None:
    join, _clock, reports = make()
    join.settle("ours", "req-abc1", reports.append)
    join.add([span("engine-own-trace", request_id="chatcmpl-req-abc1")])
    assert [r.request_id for r in reports] == ["chatcmpl-req-abc1"]
    join.add([span("early", request_id="chatcmpl-req-abc2")])
    join.settle("other", "req-abc2", reports.append)
    assert [r.trace_id for r in reports] == ["engine-own-trace", "early"]


def test_stray_spans_are_bounded_in_count_and_time() -> None:
    join, clock, _reports = make(max_held=100, hold_s=30.0)
    for index in range(1000):
        join.add([span(f"stray{index}", request_id=f"x-{index}")])
    assert join.held == 100 and join.counts.unmatched == 900
    assert len(join._held_by_request) <= 200
    clock.now = 31.0
    join.expire()
    assert join.held == 0 and join.counts.unmatched == 1000
    assert not join._held_by_request


def test_auto_waits_only_once_the_engine_sent_a_span() -> None:
    join, clock, reports = make(expect="auto")
    assert join.settle("t1", None, reports.append) is None and reports == [None]
    join.add([span("unrelated")])
    assert join.settle("t2", None, reports.append) == 5.0
    clock.now = 700.0  # the engine stopped exporting long ago
    join.expire()
    assert join.settle("t3", None, reports.append) is None


def test_close_reports_every_waiting_request() -> None:
    join, _clock, reports = make()
    for index in range(5):
        join.settle(f"t{index}", None, reports.append)
    join.close()
    assert reports == [None] * 5 and join.waiting == 0


def test_a_failing_report_does_not_break_the_join() -> None:
    join, _clock, reports = make()

    def broken(_span: SpanPhases | None) -> None:
        raise RuntimeError("store exploded")

    join.settle("t1", None, broken)
    join.settle("t2", None, reports.append)
    join.add([span("t1"), span("t2")])
    assert [r.trace_id for r in reports] == ["t2"]


def test_a_vllm_completion_prompt_id_finds_its_request() -> None:
    join, _clock, reports = make()
    join.settle("ours", "abc7", reports.append)
    join.add([span("theirs", request_id="cmpl-abc7-0")])
    assert [r.request_id for r in reports] == ["cmpl-abc7-0"]


def test_only_spans_a_request_of_ours_can_take_are_wanted() -> None:
    join, _clock, reports = make()
    assert not join.wanted("stranger", "nobody")  # counted unmatched at once, never read
    assert (join.counts.spans, join.counts.unmatched, join.held) == (1, 1, 0)
    join.begin("t1", "r1")
    assert join.wanted("t1", None) and join.wanted("other-trace", "chatcmpl-r1")
    join.end("t1", "r1")
    assert not join.wanted("t1", None)  # ended and not waiting: nothing can take it
    join.begin("t2", None)
    join.end("t2", None)
    join.settle("t2", None, reports.append)  # waits for its span
    assert join.wanted("t2", None)
    join.add([span("t2")])
    assert join.wanted("t2", None)  # joined: a second copy is read, and counted a duplicate
    join.add([span("t2")])
    assert join.counts.duplicates == 1 and len(reports) == 1
