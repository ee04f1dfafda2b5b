"""The console's two charts, drawn on the server as inline SVG: no chart library, no script.

- `activity_chart`: steps a minute over the last hour as bars, the failed
  attempts of each minute drawn over them; small (a sparkline in a table)
  or large, with a title on each bar.
- `timeline`: a run's attempts as bars on one time axis (start, duration,
  outcome), one row an attempt, newest at the bottom.

Every chart is an `img` with a label that says what it shows in words; the
same figures are in the page's tables for anyone who cannot see it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from markupsafe import Markup, escape

STEP_FILL = "#3b6ea5"
FAILURE_FILL = "#b3261e"
OUTCOME_FILLS = {"ok": "#2e7d32", "retry": "#a35c00", "failed": "#b3261e"}
TEXT_FILL = "#1b1f24"
GRID_STROKE = "#8c959f"
ROW_HEIGHT = 18  # px a timeline row
LABEL_WIDTH = 150  # px of a timeline row's label
MIN_BAR = 2.0  # px: an attempt of a microsecond still shows
MAX_TIMELINE_ROWS = 60  # attempts drawn; the table beside it lists more


def activity_chart(
    minutes: Sequence[datetime],
    steps: Sequence[int],
    failures: Sequence[int],
    *,
    label: str,
    small: bool = False,
) -> Markup:
    """Bars of steps a minute, failures over them; `label` says it in words."""
    width, height = (120, 24) if small else (720, 140)
    bottom = height - (0 if small else 18)
    top = 0 if small else 6
    most = max([*steps, 1])
    slot = width / max(len(steps), 1)
    parts = [
        f'<svg class="chart{" spark" if small else ""}" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{escape(label)}" '
        f'preserveAspectRatio="none">'
    ]
    if not small:
        parts.append(
            f'<line x1="0" y1="{bottom}" x2="{width}" y2="{bottom}" stroke="{GRID_STROKE}" '
            'stroke-width="1"/>'
        )
    for n, (minute, done, failed) in enumerate(zip(minutes, steps, failures, strict=True)):
        x = n * slot
        bar = (bottom - top) * done / most
        failed_bar = (bottom - top) * failed / most
        title = f"{minute:%H:%M}: {done} steps, {failed} failed"
        if done:
            parts.append(
                f'<rect x="{x:.1f}" y="{bottom - bar:.1f}" width="{max(slot - 1, 1):.1f}" '
                f'height="{bar:.1f}" fill="{STEP_FILL}">'
                + ("" if small else f"<title>{escape(title)}</title>")
                + "</rect>"
            )
        if failed:
            parts.append(
                f'<rect x="{x:.1f}" y="{bottom - failed_bar:.1f}" '
                f'width="{max(slot - 1, 1):.1f}" height="{failed_bar:.1f}" fill="{FAILURE_FILL}"/>'
            )
    if not small and minutes:
        for n in (0, len(minutes) // 2, len(minutes) - 1):
            anchor = "start" if n == 0 else "end" if n == len(minutes) - 1 else "middle"
            x = n * slot + (slot if n == len(minutes) - 1 else 0)
            parts.append(
                f'<text x="{x:.1f}" y="{height - 4}" font-size="11" fill="{TEXT_FILL}" '
                f'text-anchor="{anchor}">{minutes[n]:%H:%M}</text>'
            )
    parts.append("</svg>")
    return Markup("".join(parts))


def timeline(attempts: Sequence[dict[str, Any]], *, label: str) -> Markup:
    """A run's newest attempts (dicts of the attempt log) as bars on one time axis."""
    shown = list(attempts)[-MAX_TIMELINE_ROWS:]
    if not shown:
        return Markup("")
    spans = [(_started(a), a["finished_at"]) for a in shown]
    first = min(start for start, _ in spans)
    last = max(end for _, end in spans)
    total = max((last - first).total_seconds(), 1e-3)
    width = 720
    plot = width - LABEL_WIDTH - 8
    height = ROW_HEIGHT * len(shown) + 22
    parts = [
        f'<svg class="timeline" viewBox="0 0 {width} {height}" width="100%" '
        f'role="img" aria-label="{escape(label)}">'
    ]
    for n, (attempt, (start, end)) in enumerate(zip(shown, spans, strict=True)):
        y = n * ROW_HEIGHT
        x = LABEL_WIDTH + plot * (start - first).total_seconds() / total
        bar = max(plot * (end - start).total_seconds() / total, MIN_BAR)
        x = min(x, width - 8 - bar)
        fill = OUTCOME_FILLS.get(attempt["outcome"], GRID_STROKE)
        name = f"{attempt['step']} #{attempt['attempt']}"
        title = (
            f"{name} {attempt['outcome']}: started {start:%Y-%m-%d %H:%M:%S.%f}"[:-3]
            + f", took {attempt['took_ms']:.1f} ms"
            + (f"; {attempt['error']}" if attempt.get("error") else "")
        )
        parts.append(
            f'<text x="0" y="{y + 13}" font-size="12" fill="{TEXT_FILL}">{escape(name)}</text>'
            f'<rect x="{x:.1f}" y="{y + 3}" width="{bar:.1f}" height="{ROW_HEIGHT - 6}" '
            f'rx="2" fill="{fill}"><title>{escape(title)}</title></rect>'
        )
    axis = ROW_HEIGHT * len(shown) + 4
    parts.append(
        f'<line x1="{LABEL_WIDTH}" y1="{axis}" x2="{width - 8}" y2="{axis}" '
        f'stroke="{GRID_STROKE}" stroke-width="1"/>'
        f'<text x="{LABEL_WIDTH}" y="{axis + 14}" font-size="11" fill="{TEXT_FILL}">'
        f"{first:%Y-%m-%d %H:%M:%S}</text>"
        f'<text x="{width - 8}" y="{axis + 14}" font-size="11" fill="{TEXT_FILL}" '
        f'text-anchor="end">{last:%Y-%m-%d %H:%M:%S} ({_span(last - first)})</text>'
    )
    parts.append("</svg>")
    return Markup("".join(parts))


def _started(attempt: dict[str, Any]) -> datetime:
    finished: datetime = attempt["finished_at"]
    return finished - timedelta(milliseconds=attempt["took_ms"] or 0)


def _span(span: timedelta) -> str:
    seconds = span.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
