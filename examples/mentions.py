"""A main agent @mentions three sub-agents on one planned local engine.

squad plans the engine for this squad (lead + 3 sub-agents at once -> 4 slots, context =
the sum of their budgets), launches llama-server with that plan, runs the three
sub-agents in parallel, hands their answers back to the lead in one message, and prints
every answer with its timings.

    .venv/bin/python examples/mentions.py            # default model (SmolLM2-135M)
    .venv/bin/python examples/mentions.py --model PATH.gguf
"""

from __future__ import annotations

import argparse

import anyio

from squad import Agent, Event, Squad

SUB = dict(budget=512, max_tokens=40, sampling={"temperature": 0.3, "seed": 1, "repeat_penalty": 1.2})

AGENTS = [
    Agent(
        name="lead",
        description="plans a small web service and merges the team's advice",
        instructions="You are {{ name }}, a tech lead. Your team: "
        "{% for a in agents %}{{ a.name }} ({{ a.description }}); {% endfor %}"
        "Answer in two short sentences.",
        budget=1024,
        max_tokens=48,
        agents=["security", "style", "tests"],
        sub_agent_tools=False,
        sampling={"temperature": 0.3, "seed": 1, "repeat_penalty": 1.3},
    ),
    Agent(name="security", description="security review", instructions="You are a security reviewer. One sentence.",
          **SUB),
    Agent(name="style", description="code style", instructions="You are a Python style reviewer. One sentence.", **SUB),
    Agent(name="tests", description="test planning", instructions="You are a test engineer. One sentence.", **SUB),
]

TEXT = (
    "@security @style @tests We are adding a login endpoint that takes a username and a "
    "password. Give one piece of advice each."
)


def show(event: Event) -> None:
    if event.kind in ("engine.planned", "squad.ready", "mention.dispatched", "mention.queued", "answer.cut"):
        print(f"  [{event.kind}] {event.agent or ''} {event.data}")


async def main(model: str | None, threads: int) -> None:
    async with Squad(AGENTS, model=model, threads=threads, on_event=show) as sq:
        print(f"engine: slots={sq.info.slots} n_ctx={sq.info.n_ctx} at {sq.info.base_url}")
        result = await sq.run(TEXT)
    for sub in result.subs:
        print(f"\n@{sub.agent}: {sub.output.strip()}")
    print(f"\nlead: {result.output.strip()}")
    print("\ntimings:")
    print(result.summary())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model name or .gguf path (default: the default model)")
    parser.add_argument("--threads", type=int, default=2, help="llama-server threads (-t)")
    args = parser.parse_args()
    anyio.run(main, args.model, args.threads)
