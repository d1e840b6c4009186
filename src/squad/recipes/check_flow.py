"""A recipe's flow checked: its steps, their templates and @mentions, each template rendered once.

:class:`FlowChecks` builds each :class:`~squad.recipes.model.Step` from its spec: step ids unique,
only earlier steps read, ``map:`` references, ``split: chunks`` sources, template syntax and
variables (``params.*``, ``steps.ID.output``/``outputs``/``value``, ``item``/``index`` in a map),
@mentions only from prompts to the main agent (only the template's own text,
:func:`squad.templates.mark_tags`). :meth:`FlowChecks.render_all` then renders every template
with the parameter values and stand-ins (field case F19). Each problem is a
:class:`~squad.errors.RecipeError` at its file, line and field.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any

from squad.chat.structured import OutputSchema
from squad.errors import UserError
from squad.names import NAME_RULE, name_problem, normalize
from squad.recipes.check_agents import RawAgents, unknown_agent
from squad.recipes.load import Located, Path_, field_path
from squad.recipes.model import Recipe, Step
from squad.recipes.params import stand_in
from squad.recipes.spec import NonAnswersSpec, ParamSpec, StepSpec
from squad.runtime.agent import Agent, sub_agent_names
from squad.runtime.mention import parse_mentions
from squad.runtime.outcome import Handling, Outcome
from squad.templates import AnyValue, check_template, mark_tags, render_template, template_paths

__all__ = ["FlowChecks", "handling", "ids_in"]

_STEP_FIELDS = ("output", "outputs")


class FlowChecks:
    """Checking templates and steps for a loader of one recipe (``located``), once its
    parameters (``specs``), agents and main agent are known."""

    located: Located
    specs: Mapping[str, ParamSpec]
    used_params: set[str]
    agents: dict[str, Agent]
    main: str
    ids: set[str]
    _all_ids: set[str]
    with_schema: dict[str, tuple[str, OutputSchema]]
    non_answers: dict[Outcome, Handling]

    def check_instructions(self, agent: Agent, src: Located, base: Path_) -> None:
        path = (*base, "instructions")
        self._check_refs(agent.instructions, src, path, roots={"name", "description", "agents", "params"},
                         done=set(), in_map=False)

    def _check_refs(self, source: str, src: Located, path: Path_, *, roots: set[str], done: set[str],
                    in_map: bool) -> None:
        line, column = src.where(path)
        loc = {"file": src.file, "line": line, "column": column}
        where = field_path(path)
        check_template(source, where=where, loc=loc)  # syntax, unknown filters/tests: before any model call
        for ref in sorted(template_paths(source, where=where, loc=loc)):
            root = ref[0]
            if root not in roots:
                allowed = sorted(roots)
                hint = difflib.get_close_matches(root, allowed, n=1)
                did = f"; did you mean '{hint[0]}'?" if hint else ""
                if root in ("item", "index"):
                    did = "; item and index exist only in a map step"
                if root == "chunks":
                    did = "; chunks exists only in a map step with split: chunks"
                raise src.error(f"undefined template variable '{root}'{did} (templates here may use: "
                                f"{', '.join(allowed)})", path)
            if root == "params" and len(ref) > 1:
                self._param_ref(ref[1], src, path)
            if root == "steps" and len(ref) > 1:
                self._step_ref(ref, src, path, done)

    def _param_ref(self, name: str, src: Located, path: Path_) -> None:
        if name not in self.specs:
            hint = difflib.get_close_matches(name, list(self.specs), n=1)
            did = f"; did you mean '{hint[0]}'?" if hint else ""
            have = ", ".join(sorted(self.specs)) or "none"
            raise src.error(f"undefined template variable 'params.{name}'{did} (declared parameters: {have}); declare "
                            "it under params: or fix the name", path)
        self.used_params.add(name)

    def _step_ref(self, ref: tuple[str, ...], src: Located, path: Path_, done: set[str]) -> None:
        sid = ref[1]
        if sid not in done:
            if sid in self.ids or sid in self._all_ids:
                raise src.error(f"step '{sid}' has not finished at this point; a step may use only steps before it: "
                                f"move this step after '{sid}'", path)
            hint = difflib.get_close_matches(sid, list(self.ids) + list(self._all_ids), n=1)
            did = f"; did you mean '{hint[0]}'?" if hint else ""
            raise src.error(f"unknown step id '{sid}' in steps.{sid}{did}", path)
        kind, schema = self.with_schema.get(sid, (None, None))
        if len(ref) > 2 and ref[2] not in _STEP_FIELDS and (schema is None or ref[2] != "value"):
            value = ", and value (its answer's parsed JSON)" if schema is not None else ""
            why = ("; give that step a schema: to use its parsed JSON as value" if ref[2] in ("value", "values")
                    and schema is None else "")
            raise src.error(f"steps.{sid}.{ref[2]}: a step has output (text) and outputs (list){value}{why}", path)
        if len(ref) > 3 and ref[2] == "value" and schema is not None and kind is not None:
            self._value_key(sid, kind, schema.schema, ref[3:], src, path)

    def _value_key(self, sid: str, kind: str, schema: Mapping[str, Any], keys: tuple[str, ...], src: Located,
                   path: Path_) -> None:
        """``steps.SID.value.KEY...`` must name properties the step's schema declares (when it
        lists ``properties`` and does not set ``additionalProperties``: a key it never names is a
        typo); a map's value is a list, indexed first."""
        for key in keys:
            if kind == "map":  # the list of items' values: an index first
                kind = "call"
                if key.isdigit():
                    continue
                raise src.error(f"steps.{sid}.value is a list (one value per item of the map): index it first, "
                                f"e.g. steps.{sid}.value[0].{key}", path)
            if schema.get("type") == "array":
                items = schema.get("items")
                schema = items if isinstance(items, Mapping) else {}
                if key.isdigit():
                    continue
            props = schema.get("properties")
            if not isinstance(props, Mapping) or schema.get("additionalProperties", False) not in (False, None):
                return  # the schema does not say which keys there are
            if key not in props:
                have = ", ".join(props) or "none"
                raise src.error(f"steps.{sid}.value has no key '{key}': the step's schema declares {have}", path)
            schema = props[key] if isinstance(props[key], Mapping) else {}

    def build_steps(self, specs: list[StepSpec], path: Path_, done: set[str]) -> list[Step]:
        if path == ("flow",):
            self._all_ids = self._declared_ids(specs)
        steps = []
        for i, spec in enumerate(specs):
            step = self._step(spec, (*path, i), done, self.non_answers)
            steps.append(step)
            done |= ids_in(step)
        return steps

    def _declared_ids(self, specs: list[StepSpec]) -> set[str]:
        out: set[str] = set()
        for s in specs:
            if s.id:
                out.add(s.id)
            out |= self._declared_ids(s.parallel or [])
        return out

    def _step(self, spec: StepSpec, path: Path_, done: set[str], inherited: Mapping[Outcome, Handling]) -> Step:
        sid = spec.id or "step-" + "-".join(str(p + 1) for p in path if isinstance(p, int))
        if sid in self.ids:
            raise self.located.error(f"duplicate step id '{sid}'; step ids must be unique: rename one", (*path, "id"))
        self.ids.add(sid)
        non_answers = handling(inherited, spec.non_answers)
        if spec.kind == "parallel":
            children = []
            for j, child in enumerate(spec.parallel or []):
                children.append(self._step(child, (*path, "parallel", j), set(done), non_answers))
            return Step(id=sid, kind="parallel", steps=tuple(children), policy=spec.policy or "collect",
                        non_answers=non_answers)
        agent = spec.agent or self.main
        if agent not in self.agents:
            raise unknown_agent(agent, self.agents, (*path, "agent"), self.located)
        over: tuple[str, ...] = ()
        if spec.kind == "map":
            over = self._map_ref(spec.map or "", (*path, "map"), done)
            if over[0] == "params":
                self._map_param(over[1], spec.split, (*path, "map"))
            if spec.split == "chunks":
                self._chunk_source(over, (*path, "map"))
        prompt_path = (*path, "prompt")
        roots = {"params", "steps"} | ({"item", "index"} if spec.kind == "map" else set())
        roots |= {"chunks"} if spec.split == "chunks" else set()
        self._check_refs(spec.prompt or "", self.located, prompt_path, roots=roots, done=done,
                         in_map=spec.kind == "map")
        if spec.shared is not None:
            if spec.kind == "call" and "parallel" not in path:
                raise self.located.error("shared: puts context first for the agents of a fan-out: use it on a map "
                                         "step or a step inside a parallel block", (*path, "shared"))
            if agent == self.main:
                raise self.located.error("shared: applies to a step of a sub-agent (agent: NAME), not one the main "
                                         "agent takes with its @mentions", (*path, "shared"))
            self._check_refs(spec.shared, self.located, (*path, "shared"), roots=roots, done=done,
                             in_map=spec.kind == "map")
        mentions = self._mentions(spec.prompt or "", agent, prompt_path)
        line, column = self.located.where(prompt_path)
        loc = {"file": self.located.file, "line": line, "column": column, "field": field_path(prompt_path)}
        if spec.kind == "map":  # where the map: reference is, for a warning about its items
            map_line, map_column = self.located.where((*path, "map"))
            loc.update(map_line=map_line, map_column=map_column, map_field=field_path((*path, "map")))
        schema = None if spec.schema_ is None else self.check_schema(spec.schema_, (*path, "schema"))
        if schema is not None:
            self.with_schema[sid] = (spec.kind, schema)
        return Step(id=sid, kind=spec.kind, agent=agent, to_main=spec.agent is None, prompt=spec.prompt or "",
                    mentions=mentions, over=over, split=spec.split or "lines",
                    chunk_tokens=spec.chunk_tokens, overlap=spec.overlap or 0,
                    concurrency=spec.concurrency, non_answers=non_answers, schema=schema, shared=spec.shared or "",
                    loc=loc)

    def _map_param(self, name: str, split: str | None, path: Path_) -> None:
        """A map over a parameter needs items: a list parameter, or a text one with ``split``."""
        kind = self.specs[name].type
        if kind not in ("list", "string", "file"):
            raise self.located.error(
                f"map over parameter '{name}': a parameter of type {kind} has no items; use a list parameter "
                f"(type: list), or a text one with split: lines, json or chunks", path)
        if kind != "list" and split is None:
            raise self.located.error(
                f"map over parameter '{name}' (type {kind}) needs split: lines, json or chunks to cut it into items; "
                f"add one, or declare the parameter type: list", path)

    def _chunk_source(self, over: tuple[str, ...], path: Path_) -> None:
        """``split: chunks`` cuts a text: a string or file parameter, or ``steps.ID.output``."""
        if over[0] == "params" and self.specs[over[1]].type not in ("string", "file"):
            raise self.located.error(
                f"split: chunks cuts a text, but parameter '{over[1]}' is a {self.specs[over[1]].type}; "
                "use a string or file parameter, or drop split: chunks", path)
        if over[0] == "steps" and over[-1] == "outputs":
            raise self.located.error(
                f"split: chunks cuts a text, but steps.{over[1]}.outputs is a list; map over steps.{over[1]}.output",
                                     path)

    def _map_ref(self, ref: str, path: Path_, done: set[str]) -> tuple[str, ...]:
        text = ref.strip().removeprefix("{{").removesuffix("}}").strip()
        parts = tuple(normalize(text).split("."))
        shape = (len(parts) == 2 and parts[0] in ("params", "steps")) or (
            len(parts) == 3 and parts[0] == "steps" and parts[2] in _STEP_FIELDS)
        if not shape:
            raise self.located.error(
                f"map: expected params.NAME, steps.ID.output or steps.ID.outputs, got {ref!r}", path)
        if (problem := name_problem(parts[1])) is not None:
            raise self.located.error(f"map: expected params.NAME, steps.ID.output or steps.ID.outputs, got {ref!r}: "
                                     f"{parts[1]!r} is not a name, {problem} ({NAME_RULE})", path)
        if parts[0] == "params":
            self._param_ref(parts[1], self.located, path)
        else:
            self._step_ref(parts, self.located, path, done)
        return parts

    def _mentions(self, prompt: str, agent: str, path: Path_) -> tuple[str, ...]:
        """@mentions in a prompt. Only prompts to the main agent dispatch sub-agents (as
        ``Squad.run`` does): to its ``agents``, or to every other agent if it lists none. Only
        the template's own text counts: what a ``{{ ... }}`` puts in is data at run time
        (:func:`squad.templates.mark_tags`)."""
        parsed = parse_mentions(mark_tags(prompt), list(self.agents))
        for unknown in parsed.unknown:
            raise self.located.error(unknown.message(), path)
        allowed = sub_agent_names(self.agents[agent], self.agents, self.main) if agent == self.main else []
        for name in parsed.agents:
            if agent != self.main:
                raise self.located.error(
                    f"only prompts to the main agent ('{self.main}') can @mention sub-agents; drop "
                    f"agent: '{agent}' from this step or write '{name}' without @", path)
            if name not in allowed:
                raise self.located.error(
                    f"the main agent '{agent}' cannot @mention '{name}': add it to agents.{agent}.agents", path)
        for problem in parsed.problems():  # idle mentions: nothing but the mention addressed to the agent
            raise self.located.error(problem, path)
        return tuple(parsed.agents)

    def render_all(self, recipe: Recipe, raw: RawAgents, unset: set[str]) -> None:
        """Render every template once, before anything runs: instructions with the parameters,
        each step's prompt with the parameters, earlier steps' outputs stood in for by a string
        and a map's ``item`` by one. Raises the first :class:`RecipeError`, at its field."""
        params = {**recipe.params, **{n: stand_in(recipe.param_specs[n]) for n in unset}}
        for name, agent in recipe.agents.items():
            _, src, base = raw[name]
            path = (*base, "instructions")
            line, column = src.where(path)
            subs = [recipe.agents[n] for n in sub_agent_names(agent, recipe.agents, recipe.main)]
            variables = {"name": agent.name, "description": agent.description, "params": params,
                         "agents": [{"name": a.name, "description": a.description} for a in subs]}
            render_template(agent.instructions, variables, where=field_path(path),
                            loc={"file": src.file, "line": line, "column": column})
        standing = dataclasses.replace(recipe, params=params)
        outputs: dict[str, dict[str, Any]] = {}
        for step in recipe.flow:
            _render_step(standing, step, outputs)

    def check_schema(self, schema: dict[str, Any], path: Path_) -> OutputSchema:
        """``schema`` (at ``path``) as an :class:`OutputSchema`; a :class:`RecipeError` there
        when it is not a valid JSON schema."""
        try:
            return OutputSchema.of(schema)
        except UserError as exc:
            raise self.located.error(str(exc), path) from None


_OUTPUT_STAND_IN = "1"
"""A step's output while validating: a string (``| int`` gives 1, never a division by zero)."""


def _render_step(recipe: Recipe, step: Step, outputs: dict[str, dict[str, Any]]) -> None:
    """Render ``step`` with ``outputs`` of the steps before it (a parallel block's steps do not
    see each other), then stand in for the outputs of it and its children."""
    if step.kind == "parallel":
        for child in step.steps:
            _render_step(recipe, child, dict(outputs))
    else:
        extra: dict[str, Any] = {}
        if step.kind == "map":
            extra = {"item": _OUTPUT_STAND_IN, "index": 0}
            if step.split == "chunks":
                extra["chunks"] = 1
        recipe.render_prompt(step, outputs, **extra)
        recipe.render_shared(step, outputs, **extra)
    for sid in ids_in(step):
        outputs[sid] = {"output": _OUTPUT_STAND_IN, "outputs": [_OUTPUT_STAND_IN], "error": None,
                        "value": AnyValue.many(_OUTPUT_STAND_IN) if step.kind == "map" else AnyValue(_OUTPUT_STAND_IN)}


def ids_in(step: Step) -> set[str]:
    out = {step.id}
    for s in step.steps:
        out |= ids_in(s)
    return out


def handling(inherited: Mapping[Outcome, Handling], spec: NonAnswersSpec | None) -> dict[Outcome, Handling]:
    """``inherited`` with the outcomes ``spec`` (a ``non_answers:`` section) sets replaced."""
    out = dict(inherited)
    if spec is not None:
        out.update({Outcome(name): value for name, value in spec.model_dump().items() if value is not None})
    return out
