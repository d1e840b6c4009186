"""``squad trace show|plot``: read the JSONL trace a run wrote (see :mod:`squad.events.jsonl`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from squad.cli import options
from squad.cli._app import app, console
from squad.dirs import check_output_file
from squad.errors import UserError
from squad.events import Event
from squad.events.jsonl import default_trace_dir, load_trace
from squad.events.summary import CallSpan, TraceSummary, engine_labels, engine_legend, short_url, summarize

trace_app = typer.Typer(help="Inspect run traces (JSON Lines written by every `squad run`).", no_args_is_help=True)
app.add_typer(trace_app, name="trace")

PLOT_FORMATS = ("png", "svg", "pdf")
"""Image formats ``squad trace plot`` writes (matplotlib's, picked by the suffix)."""

FileArg = typer.Argument(None, help="Trace file (.jsonl). Default: the newest trace of this machine.")


def resolve_trace(path: Path | None) -> Path:
    """``path``, or the newest ``*.jsonl`` in the traces directory; UserError when none."""
    if path is not None:
        return path
    folder = default_trace_dir()
    found = sorted(folder.glob("*.jsonl"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
    if not found:
        raise UserError(f"no traces in {folder} yet; run `squad run RECIPE` first or pass a trace file")
    return found[-1]


@trace_app.command("show")
def show(
    file: Path | None = FileArg,
    as_json: Annotated[bool, options.as_json("Print the summary as JSON.")] = False,
    calls: Annotated[bool, typer.Option("--calls", help="Also list every engine call: its id, conversation, "
                                                        "parent, slot, times.")] = False,
) -> None:
    """Summarize a trace: per agent status (done, truncated, empty, failed, cancelled), queue
    time, first token, end, tokens, slot, errors and warnings; with --calls one row per engine
    call (matched by its call id)."""
    path = resolve_trace(file)
    summary = summarize(_events(path))
    if as_json:
        print(json.dumps(summary.to_dict(), indent=2))
        return
    console.print(f"[bold]{escape(str(path))}[/]  {summary.events} events over {summary.duration_s:.2f}s",
                  soft_wrap=True)  # a path is never broken across lines
    labels = engine_labels([*(load.engine for load in summary.engine_loads), *summary.engines,
                            *(loss.engine for loss in summary.lost)])
    several = len(labels) > 1
    for load in summary.engine_loads:
        n_ctx = f", n_ctx {load.n_ctx}" if load.n_ctx is not None else ""
        which = f" {short_url(load.engine)}" if several else ""
        console.print(f"engine{which} loaded at {load.t:.2f}s: {load.slots} slots{n_ctx}, pool {load.pool} tokens")
    for loss in summary.lost:
        console.print(f"[red]engine {escape(short_url(loss.engine))} lost[/] at {loss.t:.2f}s: {escape(loss.reason)} "
                      f"({loss.remaining} left)", soft_wrap=True)
    for w in summary.workers:  # a Ray run
        console.print(f"worker {escape(w.worker)}: engine {escape(w.engine or '-')} ready at {w.t:.2f}s, "
                      f"{w.slots} slots, "
                      f"pool {w.pool} tokens; served {w.items} item(s), {w.calls} call(s)", soft_wrap=True)
    console.print(f"max calls in flight: {summary.max_in_flight}")
    if several and (legend := engine_legend(labels)):
        console.print(escape(legend), soft_wrap=True)
    console.print(_agent_table(summary, labels if several else None))
    if calls:
        console.print(_call_table(summary, labels if several else None))
    for a in summary.agents.values():
        for error in a.errors or ([a.reason] if a.reason else []):
            console.print(f"[red]{a.name}[/]: {escape(error)}")
        for note in a.notes:
            console.print(f"[yellow]{a.name}[/]: {escape(note)}")
    for warning in summary.warnings:
        console.print(f"[yellow]warning[/] {escape(warning)}")


def _fmt(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}"


def _agent_table(summary: TraceSummary, labels: Mapping[str, str] | None = None) -> Table:
    """One row per agent; with several engines in the run (``labels``: :func:`engine_labels`), an
    ``engine`` column after the agent's name (the engines its calls went to)."""
    several = labels is not None
    engines = {a.name: ",".join(labels.get(e, short_url(e)) for e in a.engines) or "-"
               for a in summary.agents.values()} if labels is not None else {}
    table = Table(title="agents (times in seconds from trace start)", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0),
                  pad_edge=False)
    for column, justify in [
        ("agent", "left"), *([("engine", "left")] if several else []), ("status", "left"), ("start", "right"),
        ("wait", "right"), ("1st tok", "right"), ("end", "right"), ("calls", "right"), ("in tok", "right"),
        ("out tok", "right"), ("slot", "right"),
    ]:
        # the status and the engine are never cut ("truncated" must read as itself in a narrow terminal; the
        # engine column is not last, where a table wider than the terminal is cropped)
        least = 9 if column == "status" else max(map(len, engines.values()),
                                                 default=0) + 1 if column == "engine" else None
        table.add_column(column, justify=justify, no_wrap=True, min_width=least)  # type: ignore[arg-type]
    style = {"done": "green", "failed": "red", "cancelled": "red", "running": "yellow", "truncated": "yellow",
             "empty": "yellow"}
    for a in summary.agents.values():
        table.add_row(
            a.name,
            *([engines[a.name]] if several else []),
            f"[{style.get(a.status, '')}]{a.status}[/]",
            _fmt(a.started),
            f"{a.queued_s:.2f}",
            _fmt(a.first_token),
            _fmt(a.ended),
            str(a.calls),
            str(a.prompt_tokens),
            str(a.completion_tokens),
            ",".join(str(s) for s in a.slots) or "-",
        )
    return table


def _call_table(summary: TraceSummary, labels: Mapping[str, str] | None = None) -> Table:
    """One row per call; with several engines (``labels``: :func:`engine_labels`), an ``engine``
    column; a call whose engine was lost reads ``moved to ENGINE`` (``re-run on ...`` when it had
    streamed)."""
    several = labels is not None
    name = (lambda url: labels.get(url or "", short_url(url))) if labels is not None else short_url
    table = Table(title="calls (times in seconds from trace start)", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0),
                  pad_edge=False)
    for column, justify in [("call", "left"), ("agent", "left"), ("conversation", "left"), ("parent", "left"),
                            *([("engine", "left")] if several else []),
                            ("slot", "right"), ("queued", "right"), ("admitted", "right"), ("1st tok", "right"),
                            ("end", "right"), ("in tok", "right"), ("out tok", "right"), ("state", "left")]:
        least = max(map(len, labels.values())) + 1 if column == "engine" and labels else None  # never cut (+ padding)
        table.add_column(column, justify=justify, no_wrap=True, min_width=least)  # type: ignore[arg-type]
    for c in sorted(summary.calls, key=lambda c: c.start):
        state = ("[red]failed[/]" if c.error else
                 f"[yellow]{'re-run on' if c.rerun else 'moved to'} {escape(name(c.moved_to))}[/]" if c.moved_to
                 else "[yellow]truncated[/]" if c.finish_reason == "length" else "retried" if c.retried else "ok")
        table.add_row(c.call, c.agent, c.conversation or "-", c.parent or "-",
                      *([name(c.engine)] if several else []),
                      "-" if c.slot is None else str(c.slot), _fmt(c.queued), _fmt(c.admitted),
                      _fmt(c.first_token), _fmt(c.end),
                      ("-" if c.prompt_tokens is None else str(c.prompt_tokens))
                      + (f" ({c.shared_tokens} shared)" if c.shared_tokens else ""),
                      "-" if c.completion_tokens is None else str(c.completion_tokens), state)
    return table


def _events(path: Path) -> list[Event]:
    """The events of trace file ``path``; UserError when it holds none (an empty file, or
    JSON lines that are not squad events: not a trace)."""
    events = load_trace(path)
    if not events:
        raise UserError(f"{path}: not a squad trace: it holds no squad events (a trace is the JSONL file "
                        f"`squad run` writes, by default in {default_trace_dir()})")
    return events


@trace_app.command("plot")
def plot(
    file: Path | None = FileArg,
    out: Annotated[Path, options.out("Image to write; its suffix picks the format "
                                     f"({', '.join(PLOT_FORMATS)}).")] = Path("timeline.png"),
) -> None:
    """Draw a timeline: agents as bars over time, coloured by slot, queue waits hatched."""
    check_output_file(out, "--out")
    if out.suffix.lower().lstrip(".") not in PLOT_FORMATS:
        raise UserError(f"--out {out}: give the image a suffix that names its format: "
                        f"{', '.join('.' + f for f in PLOT_FORMATS)}")
    path = resolve_trace(file)
    summary = summarize(_events(path))
    if not summary.calls and not summary.agents:
        raise UserError(f"{path}: the trace holds no agent or call events to plot")
    plot_timeline(summary, out, title=path.name)
    console.print(f"wrote {out}")


def plot_timeline(summary: TraceSummary, out: Path, *, title: str = "") -> None:
    """Write a timeline image of ``summary`` to ``out`` (format from the suffix).

    One row per agent; per call a hatched grey segment while waiting in squad's queue,
    a light segment for prefill (admitted → first token) and a solid one while generating,
    coloured by slot; failed calls end in a red ✕. Engine loads are dashed vertical lines.
    Raises UserError when matplotlib (the ``squad[plot]`` extra) is missing or ``out`` cannot
    be written (its directory must exist).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise UserError("plotting needs matplotlib: pip install 'squad[plot]'") from None

    agents = list(summary.agents)
    rows = {name: i for i, name in enumerate(agents)}
    end = max([summary.duration_s] + [s.end or 0.0 for s in summary.calls]) or 1.0
    cmap = plt.get_cmap("tab10")
    fig_h = max(2.5, 0.45 * len(agents) + 1.6)
    fig, ax = plt.subplots(figsize=(10, fig_h), dpi=120)
    height = 0.6
    for name, a in summary.agents.items():
        y = rows[name]
        if a.started is not None:
            ax.hlines(y, a.started, a.ended if a.ended is not None else end, color="#bbbbbb", lw=1, zorder=1)
    slots_seen: set[int] = set()
    for span in summary.calls:
        _draw_span(ax, span, rows.get(span.agent, 0), end, height, cmap, slots_seen)
    for load in summary.engine_loads:
        ax.axvline(load.t, color="#555555", ls="--", lw=1)
        ax.annotate(
            f"engine: {load.slots} slots, pool {load.pool or load.n_ctx} tokens", (load.t, -0.8), fontsize=8,
                    color="#555555",
            xytext=(3, 0), textcoords="offset points", va="center",
        )
    ax.set_yticks(range(len(agents)), agents)
    ax.set_ylim(len(agents) - 0.4, -1.1)
    ax.set_xlim(0, end * 1.02)
    ax.set_xlabel("seconds since start of run")
    ax.grid(axis="x", color="#eeeeee")
    ax.set_axisbelow(True)
    ax.set_title(f"{title}  ·  max {summary.max_in_flight} calls in flight", fontsize=10)
    legend = [Patch(facecolor="#dddddd", hatch="///", edgecolor="#999999", label="waiting for a slot")]
    legend += [Patch(facecolor=cmap(s % 10), label=f"slot {s}") for s in sorted(slots_seen)]
    legend += [Patch(facecolor=tuple(0.35 * c + 0.65 for c in cmap(0)[:3]), label="prefill (lighter)")]
    if any(s.error for s in summary.calls):
        legend.append(Patch(facecolor="white", edgecolor="red", lw=2, label="failed"))
    ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.22 if len(agents) < 6 else -0.12),
              ncol=min(6, len(legend)), fontsize=8, frameon=False)
    fig.tight_layout()
    try:
        fig.savefig(out)
    except OSError as exc:
        raise UserError(f"cannot write the timeline to {out}: {exc.strerror or exc}") from None
    except ValueError as exc:  # a format matplotlib does not know
        raise UserError(f"cannot write the timeline to {out}: {exc}") from None
    finally:
        plt.close(fig)


def _draw_span(ax: Any, span: CallSpan, y: int, end: float, height: float, cmap: Any,
               slots_seen: set[int]) -> None:
    stop = span.end if span.end is not None else end
    colour = cmap((span.slot or 0) % 10)
    if span.slot is not None:
        slots_seen.add(span.slot)
    if span.queued is not None and span.admitted is not None and span.admitted > span.queued:
        ax.barh(y, span.admitted - span.queued, left=span.queued, height=height, color="#dddddd",
                hatch="///", edgecolor="#999999", lw=0.5, zorder=2)
    begin = span.admitted if span.admitted is not None else span.queued
    if begin is None:
        return
    first = span.first_token if span.first_token is not None else stop
    light = tuple(0.35 * c + 0.65 for c in colour[:3])  # the slot colour mixed with white
    ax.barh(y, max(first - begin, 0.0), left=begin, height=height, color=light, zorder=2)
    if span.first_token is not None:
        ax.barh(y, max(stop - first, 0.0), left=first, height=height, color=colour, zorder=2)
    if span.error:
        ax.barh(y, stop - begin, left=begin, height=height, fill=False, edgecolor="red", lw=1.5, zorder=3)
        ax.plot([stop], [y], marker="x", color="red", ms=9, mew=2.5, zorder=4)
