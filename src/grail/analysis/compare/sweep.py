"""The layout of a `grail compare` plan: which arm each arm is paired with, and, for a swept comparison, which arm of
`--arms` and which swept value each arm is.

`--sweep FIELD=v1,v2` crosses every arm with every value; arm A at value v is labelled `A@FIELD=v`, and a second
`--sweep` appends its own `@FIELD=value` (grail.analysis.compare.plan.parse_arms). The plan records the sweeps, in the
order given, as [{"field": F, "values": [text, ...]}] (values as typed on the command line, as in the labels).

Pairing: an arm is paired with the first arm of `--arms` at the same swept values (without a sweep: the first arm).
Pairing across swept values would fold the field's own effect into the method's.

Series: for the sweep table and plot, the x axis is the *last* sweep's field; each arm of `--arms` (with the values of
any earlier sweeps) is one series, with one arm per x value."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Layout", "layout", "numeric_values"]


@dataclass(frozen=True)
class Layout:
    baseline: dict[str, str]  # arm label → the arm it is paired with (itself for the reference arms)
    field: str | None = None  # the last sweep's field (the x axis); None without a sweep
    values: tuple[str, ...] = ()  # its values, as typed
    series: dict[str, dict[str, str]] | None = None  # series label → {value: arm label}

    @property
    def paired(self) -> list[str]:
        """The arms that have a reference to differ from (every arm but the references), in plan order."""
        return [arm for arm, base in self.baseline.items() if base != arm]

    @property
    def references(self) -> list[str]:
        return [arm for arm, base in self.baseline.items() if base == arm]


def _split(label: str, sweeps: list[dict]) -> tuple[str, tuple[str, ...]]:
    """`grail@x=1@task_filler_rate=0.45` → ("grail@x=1", ("0.45",)) for one sweep of task_filler_rate."""
    values = []
    for sweep in reversed(sweeps):
        match = [v for v in sweep["values"] if label.endswith(f"@{sweep['field']}={v}")]
        if len(match) != 1:
            raise ValueError(f"arm {label!r} does not end with one of the sweep's values "
                             f"{sweep['field']}={','.join(sweep['values'])}: compare.json's arms and sweeps disagree.")
        values.append(match[0])
        label = label[: -len(f"@{sweep['field']}={match[0]}")]
    return label, tuple(reversed(values))


def layout(plan: dict) -> Layout:
    """The pairing (and, with sweeps, the series) of a plan's arms; a plan without "sweeps" (written before sweeps
    were recorded, or without any) pairs every arm with the first."""
    labels = [a["label"] for a in plan["arms"]]
    sweeps = plan.get("sweeps") or []
    if not sweeps:
        return Layout({arm: labels[0] for arm in labels})
    parts = {arm: _split(arm, sweeps) for arm in labels}
    first = parts[labels[0]][0]
    by_part = {part: arm for arm, part in parts.items()}
    baseline = {arm: by_part.get((first, values), arm) for arm, (_, values) in parts.items()}
    series: dict[str, dict[str, str]] = {}
    for arm, (base, values) in parts.items():
        name = base + "".join(f"@{s['field']}={v}" for s, v in zip(sweeps[:-1], values[:-1], strict=True))
        series.setdefault(name, {})[values[-1]] = arm
    return Layout(baseline, sweeps[-1]["field"], tuple(sweeps[-1]["values"]), series)


def numeric_values(values: tuple[str, ...]) -> list[float] | None:
    """The values as numbers when they all are (a numeric x axis), else None (categories, in the given order)."""
    try:
        return [float(v) for v in values]
    except ValueError:
        return None
