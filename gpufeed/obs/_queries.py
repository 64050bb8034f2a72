"""The PromQL in gpufeed's monitoring stack: every dashboard panel, template variable and rule.

Grafana dashboards (``stack/grafana/dashboards/*.json``) and Prometheus rule files
(``stack/prometheus/rules/*.yml``) are read into :class:`Query` records so tests and
``gpufeed obs verify`` can evaluate each one against a real Prometheus. Grafana's variables
(``$__rate_interval``, ``$rank`` ...) are substituted with concrete values first, the way
Grafana would before sending the query.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

__all__ = [
    "DEFAULT_GRAFANA_VALUES",
    "Query",
    "alert_signal",
    "dashboard_queries",
    "label_values_args",
    "load_queries",
    "metric_names",
    "rule_queries",
    "substitute",
]

QueryKind = Literal["panel", "variable", "record", "alert"]

# Grafana's built-in interval variables, as Grafana would fill them in for a 1-second scrape
# interval (the test harness's) and a short time range. Dashboard variables ($rank, $model) are
# filled from their own label_values() queries.
DEFAULT_GRAFANA_VALUES = {
    "__rate_interval": "20s",
    "__interval": "5s",
    "__interval_ms": "5000",
    "__range": "5m",
    "__range_s": "300",
}

_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)(?::\w+)?\]\]")


@dataclass(frozen=True)
class Query:
    """One PromQL expression of the stack.

    Attributes:
        source: The file it comes from (its name, e.g. ``training.json`` or ``serving.yml``).
        where: The panel title, variable name, recorded series or alert name.
        ref: The target's refId for panels; the rule's group for rules; ``query`` for variables.
        expr: The expression as written, Grafana variables included.
        kind: ``panel``, ``variable``, ``record`` or ``alert``.
    """

    source: str
    where: str
    ref: str
    expr: str
    kind: QueryKind

    @property
    def needs_gpu(self) -> bool:
        """Whether it reads dcgm-exporter's GPU metrics (only present on NVIDIA GPU hosts)."""
        return "DCGM_" in self.expr

    @property
    def variables(self) -> set[str]:
        """Grafana variable names it uses."""
        return {next(g for g in m.groups() if g) for m in _VARIABLE.finditer(self.expr)}

    def label(self) -> str:
        return f"{self.source}: {self.kind} {self.where!r} [{self.ref}]"


def _walk_panels(panels: Iterable[dict]) -> Iterator[dict]:
    for panel in panels:
        yield panel
        yield from _walk_panels(panel.get("panels", []))  # rows hold collapsed panels


def dashboard_queries(path: str | Path) -> list[Query]:
    """Every template-variable query and every panel target of a Grafana dashboard JSON file.

    Raises:
        ValueError: The file is not a dashboard, or a target has no ``expr`` (naming the panel).
    """
    path = Path(path)
    try:
        board = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(board, dict) or "panels" not in board:
        raise ValueError(f"{path} is not a Grafana dashboard: no 'panels'")
    out = []
    for var in board.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var.get("query")
        text = query.get("query") if isinstance(query, dict) else query
        if not text:
            raise ValueError(f"{path}: template variable {var.get('name')!r} has no query")
        out.append(Query(path.name, var["name"], "query", text, "variable"))
    for panel in _walk_panels(board["panels"]):
        for target in panel.get("targets", []):
            expr = target.get("expr")
            if not expr:
                raise ValueError(f"{path}: panel {panel.get('title')!r} target {target.get('refId')!r} has no expr")
            out.append(Query(path.name, panel.get("title", f"panel {panel.get('id')}"), target["refId"], expr, "panel"))
    return out


def rule_queries(path: str | Path) -> list[Query]:
    """Every recording and alerting rule's expression in a Prometheus rule file."""
    path = Path(path)
    doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    out = []
    for group in doc.get("groups", []):
        for rule in group.get("rules", []):
            expr = str(rule["expr"]).strip()
            if "alert" in rule:
                out.append(Query(path.name, rule["alert"], group["name"], expr, "alert"))
            else:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(rule.get("labels", {}).items()))
                name = rule["record"] + (f"{{{labels}}}" if labels else "")
                out.append(Query(path.name, name, group["name"], expr, "record"))
    return out


def load_queries(stack_dir: str | Path) -> list[Query]:
    """All queries of a stack folder laid out like ``gpufeed/obs/stack/`` (grafana/dashboards, prometheus/rules)."""
    stack_dir = Path(stack_dir)
    boards = sorted((stack_dir / "grafana" / "dashboards").glob("*.json"))
    rules = sorted((stack_dir / "prometheus" / "rules").glob("*.yml"))
    if not boards or not rules:
        raise FileNotFoundError(
            f"{stack_dir} does not hold the monitoring stack: expected grafana/dashboards/*.json and "
            "prometheus/rules/*.yml under it"
        )
    return [q for p in boards for q in dashboard_queries(p)] + [q for p in rules for q in rule_queries(p)]


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """Replace Grafana variables (``$x``, ``${x}``, ``${x:fmt}``, ``[[x]]``) with concrete values.

    Raises:
        KeyError: A variable has no value; the message names it and the known ones.
    """

    def one(match: re.Match) -> str:
        name = next(g for g in match.groups() if g)
        if name not in values:
            raise KeyError(f"no value for Grafana variable ${name} in {expr!r}; known: {', '.join(sorted(values))}")
        return values[name]

    return _VARIABLE.sub(one, expr)


_THRESHOLD = re.compile(
    r"^(?P<signal>.+?)\s*(?:>=|<=|==|!=|>|<)\s*(?:bool\s+)?[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?\s*$"
)


def alert_signal(expr: str) -> str | None:
    """The part of an alert expression that is compared with its threshold, or ``None``.

    Alerts in gpufeed are written ``<signal> <comparison> <number>``: the signal has data
    whenever the thing it watches exists, while the whole expression only returns series while
    the alert condition holds. Checking the signal tells "healthy" from "not measured".
    """
    match = _THRESHOLD.match(" ".join(expr.split()))
    return match["signal"].strip() if match else None


_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(?P<metric>[^,()]+?)\s*,\s*)?(?P<label>\w+)\s*\)\s*$")


def label_values_args(query: str) -> tuple[str | None, str]:
    """``(metric selector or None, label)`` of a Grafana ``label_values(...)`` variable query.

    Raises:
        ValueError: Any other variable query (the stack only uses ``label_values``).
    """
    match = _LABEL_VALUES.match(query)
    if not match:
        raise ValueError(f"unsupported template variable query {query!r}: expected label_values([metric,] label)")
    return match["metric"], match["label"]


_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric (or recorded series) names an expression reads.

    Strips string literals, label matchers, range/subquery brackets and grouping clauses, then
    keeps identifiers that are not function calls, keywords or numbers.
    """
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^{}]*\}", " ", text)
    text = re.sub(r"\[[^\[\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", text)
    text = re.sub(r"\$\{?\w+(?::\w+)?\}?", " ", text)
    text = re.sub(r"(?<![\w:])\d[\dA-Za-z.]*", " ", text)  # numbers and durations (0.99, 5m, 1h30m, 1e-3)
    names = set()
    for match in _IDENT.finditer(text):
        word = match.group()
        rest = text[match.end() :].lstrip()
        if word in _KEYWORDS or rest.startswith("(") or word.lower() in {"inf", "nan"}:
            continue
        names.add(word)
    return names
