"""What ``squad run`` prints and keeps: the per-agent summary, the ``--json`` documents (also of
a run that failed) and the outputs of the steps that finished before a failure (stdout, ``--out``)."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape
from rich.table import Table

from squad.cli._app import err_console
from squad.errors import IncompleteAnswer, InvalidOutput, RecipeError, SquadError, UserError, leaf_errors

if TYPE_CHECKING:
    from squad.engine.info import EngineInfo
    from squad.recipes import RecipeRun

__all__ = ["json_errors", "print_result", "keep_finished", "write_out", "esc"]


def json_errors(command: Any) -> Any:
    """``squad run --json``: a run that fails still prints one JSON document on stdout,
    ``{"ok": false, "error": {"message", "type", "exit_code", and file/line/column/field for a
    recipe error}, "recipe", "output": null, "finished": {step: record}, "errors", "warnings"}``,
    then fails as without ``--json`` (the error line on stderr, the same exit code)."""
    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (typer.Exit, SystemExit):
            raise  # what the command decided itself (its output is printed)
        except BaseException as exc:
            if kwargs.get("as_json"):
                typer.echo(json.dumps(_error_json(exc, kwargs.get("recipe")), indent=2, default=str))
            raise

    return wrapper


def _error_json(exc: BaseException, recipe: Path | None) -> dict[str, Any]:
    """The ``--json`` document of a run that failed with ``exc`` (:func:`json_errors`)."""
    kept = getattr(exc, "squad_kept", None) or {}
    error = exc
    if isinstance(exc, BaseExceptionGroup):
        leaves = leaf_errors(exc)
        error = next((e for e in leaves if isinstance(e, SquadError)), leaves[0] if leaves else exc)
    if isinstance(error, KeyboardInterrupt):
        code, message = 130, "interrupted"
    else:
        code, message = (2 if isinstance(error, UserError) else 1), (str(error) or type(error).__name__)
    detail: dict[str, Any] = {"message": message, "type": type(error).__name__, "exit_code": code}
    if isinstance(error, RecipeError):
        detail.update({k: getattr(error, k, None) for k in ("file", "line", "column", "field")})
        detail["problem"] = error.problem
    return {"ok": False, "recipe": kept.get("recipe"), "file": str(recipe) if recipe is not None else None,
            "error": detail, "failed": message, "output": None, "finished": kept.get("finished", {}),
            "errors": kept.get("errors", []), "warnings": kept.get("warnings", [])}


def write_out(out: Path | None, text: str) -> None:
    """Write ``text`` to ``--out`` (after it was printed); a failure names the path and says the
    text is on stdout. Raises :class:`SquadError` (exit 1: the path was fine when the run began)."""
    if out is None:
        return
    try:
        out.write_text(text + ("" if text.endswith("\n") else "\n"), encoding="utf-8")
    except OSError as exc:
        raise SquadError(f"could not write the output to --out {out} ({exc.strerror or exc}); it is printed "
                             "above on stdout") from None


def keep_finished(loaded: Any, record: RecipeRun, exc: BaseException, *, out: Path | None,
                   as_json: bool) -> dict[str, Any] | None:
    """A run that failed or was interrupted: print the outputs of the steps that finished
    (stdout) and write them to ``--out`` headed by the failure, so no finished work is lost.
    With ``as_json``, nothing is printed here: the returned record (recipe, finished steps,
    errors, warnings) goes into the one JSON document :func:`json_errors` prints."""
    done = [(s.id, record.steps[s.id]) for s in loaded.flow
            if s.id in record.steps and not record.steps[s.id].get("error")]
    cut = _cut_answer(exc)
    if cut and not (done and done[-1][1].get("output") == cut[1]):  # a non-answer the recipe made a
        step = next((sid for sid, r in record.results if r.error is cut[3]), None)  # failure, an invalid one
        done.append((f"{step or cut[0]} ({cut[2]}, the failing step)", {"output": cut[1]}))
    kept = {"recipe": loaded.name, "finished": {sid: step for sid, step in done}, "errors": record.errors,
            "warnings": [{"step": sid, "warning": text} for sid, text in record.warnings],
            "run": record.journal.run if record.journal is not None else None}
    if record.journal is not None and not as_json:  # every call that finished is in its journal
        err_console.print(f"[yellow]resume[/] it (only the calls that did not finish run again): squad run "
                          f"{esc(str(loaded.path))} --resume {esc(record.journal.run)} (with the same parameters)",
                          soft_wrap=True)
    if not done:
        return kept if as_json else None
    why = "interrupted" if isinstance(exc, KeyboardInterrupt) else _first_error(exc)
    if as_json:
        text = json.dumps({**kept, "ok": False, "output": None, "failed": why}, indent=2, default=str)
    else:
        body = "\n\n".join(f"## step {sid}\n{step['output']}" for sid, step in done)
        text = (f"# the run did not finish: {why}\n# the {len(done)} step(s) that finished, "
                f"with their outputs:\n\n{body}")
        typer.echo(text)
    err_console.print(f"[yellow]kept[/] the output of {len(done)} finished step(s) on stdout"
                      + (f" and in {esc(str(out))}" if out is not None else ""), soft_wrap=True)
    try:
        write_out(out, text)
    except SquadError as error:
        err_console.print(f"[red]error:[/] {esc(str(error))}", soft_wrap=True)
    return kept if as_json else None


def _cut_answer(exc: BaseException) -> tuple[str, str, str, BaseException] | None:
    """(agent, text, what, error) of the answer that ended the run: the cut text of an
    :class:`~squad.errors.IncompleteAnswer` (``"cut"``), the raw text of an
    :class:`~squad.errors.InvalidOutput` (``"invalid"``)."""
    leaves = leaf_errors(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    for leaf in leaves:
        seen: BaseException | None = leaf
        while seen is not None:  # the recipe runner may wrap it (raise ... from)
            if isinstance(seen, IncompleteAnswer) and seen.partial.strip():
                return (seen.agent or "agent", seen.partial, "cut", seen)
            if isinstance(seen, InvalidOutput) and seen.raw.strip():
                return (seen.agent or "output", seen.raw, "invalid", seen)
            seen = seen.__cause__
    return None


def _first_error(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        leaves = leaf_errors(exc)
        exc = next((e for e in leaves if isinstance(e, SquadError)), leaves[0] if leaves else exc)
    return str(exc) or type(exc).__name__


def _engine_json(info: EngineInfo | None) -> dict[str, Any] | None:
    if info is None:
        return None
    return {"slots": info.slots, "n_ctx": info.n_ctx, "pool": info.pool, "base_url": info.base_url}


def _summary(rows: list[Any], result: RecipeRun, lost: Sequence[dict[str, Any]] = ()) -> None:
    """The per-agent table and the engine lines; with several engines an ``engine`` column
    (:func:`~squad.events.summary.engine_labels`) and a line per engine lost mid-run."""
    from squad.events.summary import engine_labels, engine_legend  # start-up speed: only once a run ends

    table = Table(title="agents", title_justify="left", show_edge=False)
    on_ray = bool(result.workers)
    labels = engine_labels([*(r.get("engine") for r in rows), *(e["engine"] for e in lost)]) if not on_ray else {}
    several = len(labels) > 1
    for col in ("step", "agent", "state", "queued s", "first token s", "tokens", "tok/s", "slot",
                *(("engine",) if several else ()), *(("worker",) if on_ray else ())):
        table.add_column(col, justify="right" if col not in ("step", "agent", "state", "worker", "engine") else "left",
                         min_width=max(map(len, labels.values())) if col == "engine" else None)  # never cut
    style = {"ok": "green", "truncated": "yellow", "empty": "yellow"}
    for r in rows:
        color = style.get(r["outcome"], "red") if r["state"] == r["outcome"] else "red"
        table.add_row(
            r["step"], r["agent"], f"[{color}]{esc(str(r['state'])[:60])}[/]", f"{r['queued_s']:.2f}",
            "-" if r["first_token_s"] is None else f"{r['first_token_s']:.2f}",
            f"{r['prompt_tokens']}+{r['completion_tokens']}",
            "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:.1f}",
            "-" if r["slot"] is None else str(r["slot"]),
            *((labels.get(r.get("engine") or "", "-"),) if several else ()),
            *((esc(str(r.get("worker") or "-")) + (" (retried)" if r.get("retried") else ""),) if on_ray else ()),
        )
    err_console.print(table)
    for w in result.workers:
        err_console.print(f"worker {esc(w['id'])}: {w['items']} item(s), engine {esc(w['engine'])} on its node "
                          f"({w['slots']} slots, {w['n_ctx']:,} tokens per request; planned for "
                          f"{w['share']:.2g} of the node's KV memory, {w['memory'] / 2**30:.2f} GiB)")
    for r in rows:
        if r.get("retried"):
            err_console.print(f"[yellow]{esc(r['agent'])} retried on {esc(str(r.get('worker')))}:[/] "
                              f"{esc(r['retried'])}")
    if several and (legend := engine_legend(labels)):
        err_console.print(esc(legend), soft_wrap=True)
    if result.info is not None and "engines" in result.info.sources:  # several engines (squad.chat.routing)
        err_console.print(esc(result.info.sources["engines"]))
    elif result.info is not None:
        which = f" {result.info.base_url} (the one left)" if lost else ""
        err_console.print(f"engine{esc(which)}: {result.info.slots} slots sharing a pool of {result.info.pool:,} "
                          f"tokens, {result.info.n_ctx:,} per request (" + (
                              "read back from /props)" if result.info.engine_kind.llama_server
                              else f"as the {result.info.kind} server reported them or squad assumed: "
                                   "squad engine info --url shows where each came from)"))
    for e in lost:
        err_console.print(f"[yellow]engine {esc(e['engine'])} lost at {e['t']:.1f}s:[/] {esc(e['reason'])}",
                          soft_wrap=True)
    for sid, message in result.errors:
        err_console.print(f"[yellow]step {sid} failed (policy collect):[/] {esc(message)}")
    for sid, note in result.notes:
        err_console.print(f"[yellow]step {sid}:[/] {esc(note)}")


def esc(text: str) -> str:
    """``text`` with rich markup escaped, to print as it is."""
    return escape(text)


def print_result(result: RecipeRun, rows: list[Any], *, name: str, as_json: bool, quiet: bool, out: Path | None,
                 lost: Sequence[dict[str, Any]], mcp_warnings: Sequence[str], trace_path: Path,
                 on_ray: bool) -> None:
    """Print a finished run: ``--json``'s document, or the output (stdout), the summary and the
    warnings (stderr); write the output to ``--out``. Raises ``typer.Exit(1)`` when steps failed."""
    if as_json:
        text = json.dumps({
            "ok": not result.errors, "recipe": name, "output": result.output, "value": result.value,
            "steps": result.steps, "agents": rows, "errors": result.errors, "notes": result.notes,
            "warnings": [{"step": sid, "warning": text} for sid, text in result.warnings],
            "engine": _engine_json(result.info), "engines_lost": list(lost), "mcp_warnings": list(mcp_warnings),
            **({"workers": result.workers} if on_ray else {}),
            "run": result.journal.run if result.journal is not None else None,
            "resumed": [{"step": sid, "agent": label} for sid, label in result.resumed],
        }, indent=2, default=str)
        typer.echo(text)
        write_out(out, result.output)
        if result.errors:
            raise typer.Exit(1)
        return
    typer.echo(result.output)
    write_out(out, result.output)
    if not quiet:
        _summary(rows, result, lost)
        for warning in mcp_warnings:  # said live too; again below the table, where a long run ends
            err_console.print(f"[yellow]warning[/] {esc(warning)}", soft_wrap=True)
        err_console.print(f"trace: {esc(str(trace_path))}  (squad trace show / squad trace plot)")
        if result.resumed:  # what this run did not send again
            err_console.print(f"resumed run {esc(result.journal.run if result.journal else '?')}: "
                              f"{len(result.resumed)} call(s) answered from its journal, not sent again: "
                              + esc(", ".join(label for _, label in result.resumed)), soft_wrap=True)
    if result.errors:
        err_console.print(f"[red]{len(result.errors)} step(s) failed[/] (policy collect let the run finish): "
                          + esc("; ".join(f"{sid}: {msg}" for sid, msg in result.errors)))
        raise typer.Exit(1)
