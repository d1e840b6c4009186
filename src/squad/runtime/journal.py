"""Resumable runs: every finished call recorded as it finishes, and a run that redoes only the rest.

:class:`RunJournal` is one run's append-only journal, a JSON-lines file (0600, in a 0700 folder,
each line flushed and ``fsync``'d before the run goes on): a header naming what the run was
(``identity``: e.g. the recipe, each parameter and the model, each as a hash), then one line per
finished conversation, keyed by a hash of the call's inputs (:func:`call_key`: the operation,
the agent, the prompt as sent and the answer's schema). A run stopped by Ctrl-C, SIGTERM, a
crash or a lost engine keeps every line written before; a torn last line (a crash mid-write) is
ignored. :meth:`RunJournal.resume` opens it again, refusing (:class:`~squad.errors.UserError`)
when the identity differs, naming each part that changed, and appends to the same file. One
process at a time writes a journal: it holds the journal's lock (``.NAME.lock`` beside it, a
``flock`` through ``filelock``, which the kernel drops when the process dies, however it dies)
from :meth:`~RunJournal.create` or :meth:`~RunJournal.resume` to :meth:`~RunJournal.close`; a
second resume of a run that is still going is refused, naming the process that has it (each
``run`` and ``resume`` line records its writer's ``pid``).

:class:`Resumable` is a layer over a :class:`~squad.runtime.ops.SquadOps` (a ``Squad``): each
``run``, ``run_agent``, ``parallel`` pair and ``map`` item whose key the journal holds is answered
from it (``AgentResult.resumed``; an ``agent.resumed`` event), the others are sent to the squad
as before and recorded as each ends. Only answers are recorded (``ok``, ``truncated``, ``empty``
without an error): a failed or cancelled call is done again, and so is an answer the caller then
failed on (:meth:`Resumable.forget`: a ``void`` line, the last record of that key no longer held).
Two calls with the same key are
answered in the order they were recorded. The thinking (``reasoning``) and the conversation's
history are not recorded: what later steps read is the output.

Design: docs/recipes.md, "Resuming a run".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from squad.errors import UserError
from squad.events import AgentResumed, Event
from squad.runtime.blocks import Policy
from squad.runtime.ops import OnResult, SquadOps
from squad.runtime.outcome import Outcome
from squad.runtime.results import AgentResult, RunResult, Usage

__all__ = ["RunJournal", "Resumable", "call_key", "fingerprint", "lock_path", "VERSION"]

VERSION = 1
"""The journal format; a journal of another version is refused on resume."""


def fingerprint(value: Any) -> str:
    """A short stable hash of ``value`` (JSON with sorted keys; other objects by ``str``)."""
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def call_key(op: str, agent: str, prompt: str, schema: Any = None, shared: str | None = None) -> str:
    """The key of one call: a hash of its inputs (``op``: ``run``, ``agent``, ``parallel`` or
    ``map``; the agent's name, ``""`` for a main-agent turn; the prompt as sent; the answer's
    JSON schema, or None; the shared context put first in its system message, or None)."""
    return fingerprint([op, agent, prompt, _schema(schema)] + ([shared] if shared is not None else []))


def _each(shared: str | Sequence[str | None] | None, n: int) -> list[str | None]:
    """``shared`` as one text (or None) per call of ``n``."""
    return [shared] * n if shared is None or isinstance(shared, str) else list(shared)


def _schema(output_type: Any) -> Any:
    """What a call's ``output_type`` asks for, as plain data (a schema object's ``schema``, a
    pydantic model's JSON schema, a mapping as it is; None for none)."""
    if output_type is None:
        return None
    schema = getattr(output_type, "schema", None)
    if isinstance(schema, Mapping):
        return schema
    maker = getattr(output_type, "model_json_schema", None)
    if callable(maker):
        return maker()
    return output_type if isinstance(output_type, Mapping) else str(output_type)


def _dump(r: AgentResult) -> dict[str, Any]:
    """What is kept of an answer: enough for later steps, the run table and the final output."""
    value = r.output_value
    dump = getattr(value, "model_dump", None)
    return {"agent": r.agent, "output": r.output, "value": dump(mode="json") if callable(dump) else value,
            "finish_reason": r.finish_reason, "max_tokens": r.max_tokens, "item": r.item,
            "usage": [r.usage.prompt_tokens, r.usage.completion_tokens], "slot": r.slot, "engine": r.engine,
            "tool_calls": [list(c) for c in r.tool_calls], "notes": list(r.notes),
            "cut_while_thinking": r.cut_while_thinking, "conversation": r.conversation}


def _load(d: Mapping[str, Any], run: str) -> AgentResult:
    prompt, completion = d.get("usage") or (0, 0)
    return AgentResult(agent=d["agent"], output=d.get("output", ""), output_value=d.get("value"),
                       finish_reason=d.get("finish_reason"), max_tokens=d.get("max_tokens"), item=d.get("item"),
                       usage=Usage(prompt_tokens=prompt, completion_tokens=completion), slot=d.get("slot"),
                       engine=d.get("engine"), tool_calls=[(c[0], c[1], c[2]) for c in d.get("tool_calls", [])],
                       notes=list(d.get("notes", [])), cut_while_thinking=bool(d.get("cut_while_thinking")),
                       conversation=d.get("conversation"), resumed=run)


class RunJournal:
    """One run's journal (module docstring). ``path``: its file; ``run``: its id (the file's
    stem); ``identity``: what the run was; ``resumed``: True when opened by :meth:`resume`;
    ``held``: recorded calls not answered from it yet, by key."""

    def __init__(self, path: Path, identity: Mapping[str, str], *, resumed: bool = False,
                 held: Mapping[str, list[dict[str, Any]]] | None = None, lock: FileLock | None = None) -> None:
        self.path, self.identity, self.resumed = path, dict(identity), resumed
        self._lock = lock
        self.held: dict[str, list[dict[str, Any]]] = {k: list(v) for k, v in (held or {}).items()}
        self.recorded = sum(len(v) for v in self.held.values())
        """Calls the journal held when it was opened."""
        self._fd: int | None = None
        self.engine_model: str | None = None
        """The model the run's engine reported (:meth:`note_engine`), once known."""

    @property
    def run(self) -> str:
        return self.path.stem

    @classmethod
    def create(cls, directory: Path, identity: Mapping[str, str], *, name: str = "run") -> RunJournal:
        """A new journal in ``directory`` (made 0700), named ``NAME-YYYYmmdd-HHMMSS-PID.jsonl``;
        its header is written at once. Raises :class:`UserError` when it cannot be written."""
        _private_dir(directory)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = directory / f"{name}-{stamp}-{os.getpid()}.jsonl"
        n = 1
        while path.exists():  # two runs in one second of one process (tests, Python callers)
            n += 1
            path = directory / f"{name}-{stamp}-{os.getpid()}-{n}.jsonl"
        journal = cls(path, identity, lock=_take(path))
        journal._append({"kind": "run", "version": VERSION, "identity": journal.identity,
                         "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "pid": os.getpid()})
        return journal

    @classmethod
    def resume(cls, path: Path, identity: Mapping[str, str]) -> RunJournal:
        """The journal at ``path``, to resume that run. Raises :class:`UserError` when it is no
        journal, when ``identity`` differs from the run's (naming every part that changed), or when
        another process writes it (a run still going, or resumed twice at once: naming that process)."""
        _check(path, read_journal(path)[0], identity)
        lock = _take(path)
        try:
            header, held = read_journal(path)  # again under the lock: all the last writer wrote
            _check(path, header, identity)
            journal = cls(path, identity, resumed=True, held=held, lock=lock)
            journal.engine_model = header.get("engine")
            with contextlib.suppress(OSError), path.open("rb") as f:  # a torn last line: the next starts on its own
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    journal._append_raw(b"\n")
            journal._append({"kind": "resume", "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                             "held": journal.recorded, "pid": os.getpid()})
        except BaseException:
            lock.release()
            raise
        return journal

    def note_engine(self, model: str) -> None:
        """The engine is up and serves ``model`` (its file name or the name it reports): recorded
        for a new run; for a resumed one, refused (:class:`UserError`) when it is not the model
        the run had."""
        if self.engine_model is not None and self.engine_model != model:
            raise UserError(f"run {self.run} cannot be resumed: the model changed since it ran (it ran on "
                            f"{self.engine_model}, the engine now serves {model}); its recorded answers would not be "
                            "what this run asks. Use that model, or run again without --resume")
        if self.engine_model is None:
            self.engine_model = model
            self._append({"kind": "engine", "model": model})

    def take(self, key: str) -> AgentResult | None:
        """The recorded answer of the next call with ``key`` (marked ``resumed``), or None."""
        found = self.held.get(key)
        return _load(found.pop(0)["result"], self.run) if found else None

    def take_turn(self, key: str) -> RunResult | None:
        """The recorded main-agent turn with ``key`` (its sub-agents' answers too), or None."""
        found = self.held.get(key)
        if not found:
            return None
        record = found.pop(0)
        main = _load(record["result"], self.run)
        subs = [_load(s, self.run) for s in record.get("subs", [])]
        return RunResult(output=main.output, main=main, subs=subs)

    def record(self, key: str, result: AgentResult, subs: Sequence[AgentResult] = ()) -> None:
        """Append ``result`` (an answer: no error) as the call with ``key``, durably."""
        if result.error is not None or result.cancelled_reason is not None:
            return
        line: dict[str, Any] = {"kind": "call", "key": key, "label": result.label, "result": _dump(result)}
        if subs:
            line["subs"] = [_dump(s) for s in subs if s.error is None]
        self._append(line)

    def void(self, key: str) -> None:
        """The last answer recorded with ``key`` failed its step after all (``non_answers: {truncated: fail}``):
        a resume does that call again."""
        self._append({"kind": "void", "key": key})

    def __enter__(self) -> RunJournal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop writing: the file closed and its lock let go (another process may resume the run now)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if self._lock is not None:
            with contextlib.suppress(OSError):
                self._lock.release()
            self._lock = None

    def _append(self, line: Mapping[str, Any]) -> None:
        self._append_raw((json.dumps(line, ensure_ascii=False, default=str) + "\n").encode("utf-8"))

    def _append_raw(self, data: bytes) -> None:
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                os.fchmod(self._fd, 0o600)
            os.write(self._fd, data)
            os.fsync(self._fd)
        except OSError as exc:
            raise UserError(f"the run journal {self.path} cannot be written ({exc.strerror or exc}); set "
                            "SQUAD_STATE_DIR to a writable directory") from None


def _check(path: Path, header: Mapping[str, Any], identity: Mapping[str, str]) -> None:
    """Refuse (:class:`UserError`) to resume the journal at ``path`` (its ``header``) as ``identity``: another
    format, or a run of something else (naming every part that changed)."""
    if header.get("version") != VERSION:
        raise UserError(f"{path} is a run journal of another squad version ({header.get('version')}); it "
                        "cannot be resumed: run again without --resume")
    was = header.get("identity") or {}
    changed = [k for k in sorted(set(was) | set(identity)) if was.get(k) != identity.get(k)]
    if changed:
        raise UserError(f"run {path.stem} cannot be resumed: {_changes(changed, was, identity)} changed since "
                        "it ran; its recorded answers would not be what this run asks. Undo the change, or run "
                        "again without --resume")


def lock_path(path: Path) -> Path:
    """The lock file of the journal at ``path``: ``.NAME.lock`` beside it."""
    return path.with_name(f".{path.stem}.lock")


def _take(path: Path) -> FileLock:
    """The journal at ``path``'s lock, taken without waiting; :class:`UserError` naming the process that holds it
    (the ``pid`` of the journal's last ``run`` or ``resume`` line) when another one does."""
    lock = FileLock(lock_path(path), thread_local=False)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        pid = _writer(path)
        if pid == os.getpid():
            raise UserError(f"run {path.stem} is open for writing in this process (pid {pid}): close() the journal "
                            "that writes it (or use it in a with block) before resuming it") from None
        who = f"process {pid}" if pid is not None else "another process"
        raise UserError(f"run {path.stem} is being written by {who} (a run still going, or resumed in another "
                        f"terminal); two processes cannot resume one run at once. Wait for it to end (or stop it: "
                        f"kill {pid if pid is not None else 'PID'}), then resume again") from None
    except OSError as exc:
        raise UserError(f"the run journal's lock {lock_path(path)} cannot be made ({exc.strerror or exc}); set "
                        "SQUAD_STATE_DIR to a writable directory") from None
    return lock


def _writer(path: Path) -> int | None:
    """The pid the journal at ``path`` last recorded as its writer (its last ``run`` or ``resume`` line)."""
    pid = None
    with contextlib.suppress(OSError), path.open("rb") as f:
        for raw in f:
            with contextlib.suppress(ValueError):
                line = json.loads(raw)
                if isinstance(line, dict) and line.get("kind") in ("run", "resume") and isinstance(line.get("pid"),
                                                                                                     int):
                    pid = line["pid"]
    return pid


def read_journal(path: Path) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """``(header, recorded calls by key, in order)`` of the journal at ``path``; lines that do not
    parse (a torn last line) are skipped. Raises :class:`UserError` for a file that is not one."""
    try:
        lines = path.read_bytes().split(b"\n")
    except OSError as exc:
        raise UserError(f"no run journal at {path} ({exc.strerror or exc}); see `squad run --help` "
                        "for --resume") from None
    header: dict[str, Any] | None = None
    held: dict[str, list[dict[str, Any]]] = {}
    for raw in lines:
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(line, dict):
            continue
        if header is None:
            if line.get("kind") != "run":
                break
            header = line
        elif line.get("kind") == "call" and isinstance(line.get("key"), str) and isinstance(line.get("result"), dict):
            held.setdefault(line["key"], []).append(line)
        elif line.get("kind") == "void" and isinstance(line.get("key"), str) and held.get(line["key"]):
            held[line["key"]].pop()  # an answer its step's non_answers made a failure: done again
        elif line.get("kind") == "engine" and isinstance(line.get("model"), str):
            header.setdefault("engine", line["model"])
    if header is None:
        raise UserError(f"{path} is not a squad run journal; give a run id from the runs folder of squad's state "
                        "directory, or leave --resume's value out for the last run of the recipe")
    return header, held


def _changes(changed: Sequence[str], was: Mapping[str, str], now: Mapping[str, str]) -> str:
    """``the recipe, parameter 'code' and the model`` for people."""
    words = []
    for key in changed:
        kind, _, name = key.partition(":")
        what = f"parameter '{name}'" if kind == "param" else f"the {kind}" if not name else f"{kind} '{name}'"
        if key not in was:
            what += " (new)"
        elif key not in now:
            what += " (gone)"
        words.append(what)
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _private_dir(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        directory.chmod(0o700)
    except OSError as exc:
        raise UserError(f"the runs folder {directory} cannot be made ({exc.strerror or exc}); set "
                        "SQUAD_STATE_DIR to a writable directory") from None


class Resumable:
    """A :class:`~squad.runtime.ops.SquadOps` that records every finished call in ``journal`` and
    answers the calls it holds from it (module docstring). ``resumed``: the labels answered from
    the journal, in order."""

    def __init__(self, inner: SquadOps, journal: RunJournal) -> None:
        self.inner, self.journal = inner, journal
        self.resumed: list[str] = []
        self._keys: dict[int, str] = {}  # id of an answer recorded by run / run_agent -> its key

    def forget(self, result: AgentResult) -> None:
        """``result`` (an answer of :meth:`run` or :meth:`run_agent`) failed its step after all (its outcome is
        one the step's ``non_answers`` fails on): not an answer a resume may reuse."""
        key = self._keys.pop(id(result), None)
        if key is not None and result.resumed is None:
            self.journal.void(key)

    @property
    def shared_input(self) -> str:
        return self.inner.shared_input

    def emit(self, event: Event) -> None:
        self.inner.emit(event)

    def _said(self, result: AgentResult) -> AgentResult:
        self.resumed.append(result.label)
        self.inner.emit(AgentResumed(agent=result.agent, conversation=None, run=self.journal.run,
                                     outcome=result.outcome.value, item=result.item))
        return result

    async def run(self, text: str, *, output_type: Any = None) -> RunResult:
        key = call_key("run", "", text, output_type)
        turn = self.journal.take_turn(key)
        if turn is not None:
            for sub in turn.subs:
                self._said(sub)
            self._said(turn.main)
            return turn
        turn = await self.inner.run(text, output_type=output_type)
        self.journal.record(key, turn.main, turn.subs)
        self._keys[id(turn.main)] = key
        return turn

    async def run_agent(self, name: str, prompt: str, *, output_type: Any = None,
                        shared: str | None = None) -> AgentResult:
        key = call_key("agent", name, prompt, output_type, shared)
        done = self.journal.take(key)
        if done is not None:
            return self._said(done)
        result = await self.inner.run_agent(name, prompt, output_type=output_type, shared=shared)
        self.journal.record(key, result)
        self._keys[id(result)] = key
        return result

    def _recorder(self, keys: Sequence[str], todo: Sequence[int], failing: Collection[Outcome],
                  on_result: OnResult | None) -> OnResult:
        """The ``on_result`` of the calls ``todo`` still sends: records each answer under its key (a non-answer
        the caller fails on is done again), then tells ``on_result`` with the call's own index."""
        def done(j: int, result: AgentResult) -> None:
            if result.outcome not in failing:
                self.journal.record(keys[todo[j]], result)
            if on_result is not None:
                on_result(todo[j], result)
        return done

    async def parallel(self, calls: Iterable[tuple[str, str]], *, policy: Policy = "collect", check: bool = False,
                       fail_on: Collection[Outcome | str] = (), output_type: Any = None,
                       on_result: OnResult | None = None,
                       shared: str | Sequence[str | None] | None = None) -> list[AgentResult]:
        pairs = list(calls)
        shares = _each(shared, len(pairs))
        keys = [call_key("parallel", name, prompt, output_type, s) for (name, prompt), s in zip(pairs, shares)]
        failing = {Outcome(o) for o in fail_on}
        results: list[AgentResult | None] = [self.journal.take(k) for k in keys]
        todo = [i for i, r in enumerate(results) if r is None]
        for r in results:
            if r is not None:
                self._said(r)
        if todo:
            done = self._recorder(keys, todo, failing, on_result)
            fresh = await self.inner.parallel([pairs[i] for i in todo], policy=policy, check=check,
                                              fail_on=fail_on, output_type=output_type, on_result=done,
                                              shared=[shares[i] for i in todo])
            for i, result in zip(todo, fresh):
                results[i] = result
        return [r for r in results if r is not None]

    async def map(self, name: str, inputs: Iterable[str], *, max_concurrency: int | None = None,
                  fail_on: Collection[Outcome | str] = (), output_type: Any = None,
                  item_ids: Sequence[int] | None = None, on_result: OnResult | None = None,
                  shared: str | Sequence[str | None] | None = None) -> list[AgentResult]:
        prompts = list(inputs)
        shares = _each(shared, len(prompts))
        failing = {Outcome(o) for o in fail_on}
        ids = list(item_ids) if item_ids is not None else list(range(len(prompts)))
        keys = [call_key("map", name, prompt, output_type, s) for prompt, s in zip(prompts, shares)]
        results: list[AgentResult | None] = [self.journal.take(k) for k in keys]
        todo = [i for i, r in enumerate(results) if r is None]
        for i, r in enumerate(results):
            if r is not None:
                r.item = ids[i]
                self._said(r)
        if todo:
            done = self._recorder(keys, todo, failing, on_result)
            fresh = await self.inner.map(name, [prompts[i] for i in todo], max_concurrency=max_concurrency,
                                         fail_on=fail_on, output_type=output_type, item_ids=[ids[i] for i in todo],
                                         on_result=done, shared=[shares[i] for i in todo])
            for i, result in zip(todo, fresh):
                results[i] = result
        return [r for r in results if r is not None]
