"""The one report shape of the fault and load runs (gpufeed.core._report, gpufeed.reliability._server_runs), without a server."""

from __future__ import annotations

import json
from dataclasses import dataclass

from gpufeed.core._report import Check, Checklist, finish
from gpufeed.reliability._drain import DrainReport
from gpufeed.reliability._server_runs import ServerRunReport


@dataclass
class _Pairs(Checklist):
    value: int

    def checks(self):
        return [("positive", self.value > 0), ("even", self.value % 2 == 0)]

    def table(self) -> str:
        return f"value {self.value}\n{self.verdict()}"


@dataclass
class _Run(ServerRunReport):
    def checks(self):
        errors = self.figures["errors"]
        return [Check("no errors", errors == 0, f"{errors} error(s)")]

    def lines(self):
        return [f"\nrun: {self.figures['errors']} errors"]


def test_pairs_and_checks_give_one_verdict(tmp_path, capsys):
    assert _Pairs(4).ok and _Pairs(4).verdict() == "PASS" and _Pairs(4).problems() == []
    bad = _Pairs(-3)
    assert not bad.ok and bad.problems() == ["positive", "even"] and bad.verdict() == "FAIL: positive; even"
    assert bad.to_dict() == {"value": -3, "checks": {"positive": False, "even": False}, "ok": False}
    out = tmp_path / "r.json"
    assert finish(bad, out) == 1 and json.loads(out.read_text())["ok"] is False
    assert capsys.readouterr().out == "value -3\nFAIL: positive; even\n"
    assert finish(_Pairs(2)) == 0


def test_a_server_run_keeps_its_figures_at_the_top_of_its_json():
    run = _Run({"errors": 2, "load": {"ok": 5}})
    assert run.problems() == ["2 error(s)"]  # the detail, not the name, says what went wrong
    assert run.table() == "\nrun: 2 errors\n  result: FAIL: 2 error(s)"
    assert run.to_dict() == {"errors": 2, "load": {"ok": 5}, "checks": {"no errors": False}, "ok": False}
    assert _Run({"errors": 0}).table().endswith("  result: PASS")


def test_drain_report_names_the_first_wrong_answer():
    figures = {
        "inflight_at_signal": float("nan"),  # a failed scrape is not held against the run
        "inflight_sent": 3,
        "inflight_answered_correctly": 3,
        "dropped": 0,
        "refused_at_connect": 0,
        "ready_probes": [[0.01, 400]],
        "drain_responses": [{"reason": "not_ready", "retry-after": "1", "connection": "close"}, {"reason": "x"}],
        "exit_status": 0,
        "log_says_drained": True,
    }
    assert DrainReport(figures).problems() == [
        "a request during the drain got {'reason': 'x'} (expected not_ready, Retry-After, close)"
    ]
