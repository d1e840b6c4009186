"""Structured output: an answer the engine is asked to give as JSON of a schema, parsed and
checked into a typed value.

An :class:`OutputSchema` comes from a pydantic model class, any type pydantic can validate
(``list[str]``, a dataclass, ...) or a JSON schema (a ``dict``), through :meth:`OutputSchema.of`
(``Agent(output_type=...)``, ``Squad.run(..., output_type=...)``, a recipe's ``output.schema``
and a step's ``schema``).

What is sent: ``response_format: {"type": "json_schema", "json_schema": {"name", "schema",
"strict": true}}`` (:meth:`OutputSchema.response_format`); llama-server turns the schema into
a grammar that constrains generation (``json_schema_to_grammar``, tools/server docs of
llama.cpp: ``response_format`` with ``json_schema.schema`` or ``json_object`` + ``schema``).

Measured on llama-server b11434 (SmolLM2-135M, squad's ChatML tool template): a request with
both ``tools`` and a ``response_format`` schema is accepted, but the schema's grammar wins:
the model writes JSON and never calls a tool, even with ``tool_choice: required``. So in a turn
with tools the schema is sent only in the *answering* round, without tools
(:func:`squad.runtime.turn.run_turn`): the tool rounds go unconstrained, and when the model answers
there in text that does not validate, that answer is dropped and the round is asked again
without tools, with the schema.

A grammar makes the answer JSON of the schema's shape; it does not enforce everything a
schema or a pydantic model can say (validators, ``multipleOf``, formats, cross-field rules).
So every answer is still parsed and validated (:meth:`OutputSchema.parse`): pydantic for a
type, ``jsonschema`` for a dict. A failed validation is asked again once with the error shown
to the model (:func:`retry_message`); a second failure raises
:class:`~squad.errors.InvalidOutput`, which keeps the raw text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from squad.errors import UserError

__all__ = ["OutputSchema", "OutputInvalid", "output_schema", "retry_message", "strip_fence", "RETRY_TOKENS"]

RETRY_TOKENS = 128
"""Tokens an auto budget keeps for the message that asks once more (its fixed words and the
error, pydantic's first three problems at most), on top of the missed answer's ``max_tokens``."""


class OutputInvalid(ValueError):
    """An answer that is not JSON or does not match the schema; ``str()`` says where and why."""


@dataclass(frozen=True, eq=False)
class OutputSchema:
    """The JSON schema an answer must match, and how it is turned into a value.

    - ``schema``: the JSON schema (a dict), sent to the engine;
    - ``name``: a name for it (``response_format.json_schema.name``: letters, digits, ``_``,
      ``-``, at most 64 characters);
    - ``adapter``: a pydantic ``TypeAdapter`` when it came from a type (validation gives an
      instance of that type), else None (validation with ``jsonschema`` gives the parsed JSON).
    """

    schema: dict[str, Any]
    name: str = "answer"
    adapter: Any = field(default=None, repr=False)

    @classmethod
    def of(cls, spec: OutputSchema | type | dict[str, Any] | Any) -> OutputSchema:
        """An :class:`OutputSchema` from a pydantic model class or other type pydantic can
        validate, or a JSON schema dict. Raises :class:`~squad.errors.UserError` for a dict
        that is not a valid JSON schema or a type pydantic cannot make a schema for."""
        if isinstance(spec, OutputSchema):
            return spec
        if isinstance(spec, dict):
            import jsonschema
            from jsonschema.validators import validator_for

            try:
                validator_for(spec).check_schema(spec)
            except jsonschema.SchemaError as exc:
                raise UserError("the output schema is not a valid JSON schema: "
                                f"{exc.message}; fix the schema") from None
            return cls(schema=spec, name=_name(str(spec.get("title") or "answer")))
        if not _is_type(spec):  # never a string: pydantic would evaluate it as Python code
            raise UserError(f"output_type must be a pydantic model class, a type such as list[str], or a JSON schema "
                            f"(a mapping, the only form a recipe can give), not {type(spec).__name__} {spec!r:.80}")
        from pydantic import PydanticSchemaGenerationError, PydanticUserError, TypeAdapter

        try:
            adapter = TypeAdapter(spec)
            schema = adapter.json_schema()
        except (PydanticSchemaGenerationError, PydanticUserError, TypeError, NameError) as exc:
            raise UserError(f"output_type {spec!r:.80} is not a type pydantic can validate "
                            f"({str(exc).splitlines()[0]}); "
                            "pass a pydantic model class or a JSON schema") from None
        return cls(schema=schema, name=_name(getattr(spec, "__name__", "") or "answer"), adapter=adapter)

    def response_format(self) -> dict[str, Any]:
        """The request's ``response_format`` field (OpenAI's ``json_schema`` shape, which
        llama-server reads)."""
        return {"type": "json_schema", "json_schema": {"name": self.name, "schema": self.schema, "strict": True}}

    def parse(self, text: str) -> Any:
        """``text`` as JSON, validated: an instance of the type, or the parsed JSON for a dict
        schema. A Markdown code fence around the JSON is allowed (a model writing free text
        in a tool round often adds one). Raises :class:`OutputInvalid` naming the first
        problem and where it is."""
        text = strip_fence(text)
        if self.adapter is not None:
            from pydantic import ValidationError

            try:
                return self.adapter.validate_json(text or '""')
            except ValidationError as exc:
                raise OutputInvalid(_pydantic_problems(exc)) from None
        import jsonschema

        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise OutputInvalid(f"not JSON ({exc.msg}: line {exc.lineno} column {exc.colno})") from None
        try:
            jsonschema.validate(value, self.schema)
        except jsonschema.ValidationError as exc:
            where = "/".join(str(p) for p in exc.absolute_path) or "the top level"
            raise OutputInvalid(f"at {where}: {exc.message}") from None
        return value

    def dump(self, value: Any) -> str:
        """``value`` as compact JSON text (what a sub-agent hands back, what a step's ``output`` is)."""
        if self.adapter is not None:
            return self.adapter.dump_json(value).decode("utf-8")
        return json.dumps(value, ensure_ascii=False)

    def _key(self) -> str:
        return json.dumps(self.schema, sort_keys=True, default=str)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OutputSchema) and self._key() == other._key() and self.name == other.name

    def __hash__(self) -> int:
        return hash((self.name, self._key()))


def output_schema(output_type: Any) -> OutputSchema | None:
    """``output_type`` (``Agent.output_type``, ``Squad.run(output_type=...)``) as an
    :class:`OutputSchema`, None staying None (:meth:`OutputSchema.of` for the rest)."""
    return None if output_type is None else OutputSchema.of(output_type)


def retry_message(problem: str) -> str:
    """The user message that asks once more after an answer failed validation."""
    problem = problem if len(problem) <= 300 else problem[:297] + "..."
    return (f"Your answer did not match the required JSON schema: {problem}. "
            "Answer again with only the JSON, matching the schema.")


def _is_type(spec: Any) -> bool:
    """A class, or a parametrized or special form (``list[int]``, ``Annotated[...]``,
    ``int | None``, ``Literal[...]``); never a string or a ``ForwardRef`` (pydantic evaluates
    those as Python expressions)."""
    import typing

    if isinstance(spec, (str, bytes, typing.ForwardRef)):
        return False
    return isinstance(spec, type) or typing.get_origin(spec) is not None


def strip_fence(text: str) -> str:
    """The text inside the first Markdown code fence of ``text`` (```` ```json ... ``` ````),
    else ``text`` stripped."""
    m = re.search(r"```(?:json)?\s*\n(.*?)```", text, re.DOTALL)
    return m.group(1).strip() if m else text.strip()


def _name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", text)[:64] or "answer"


def _pydantic_problems(exc: Any) -> str:
    """The first three of pydantic's errors, each ``at LOC: MSG``."""
    parts = []
    for err in exc.errors()[:3]:
        loc = "/".join(str(p) for p in err.get("loc", ())) or "the top level"
        parts.append(f"at {loc}: {err.get('msg')}")
    more = len(exc.errors()) - 3
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
