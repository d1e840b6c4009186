"""Attach to an engine that is already running instead of launching one.

Start an engine once (it stays up between scripts), then point squad at it:

    squad engine start --slots 4 --ctx 4096   # prints its URL; its API key is in the state file it names
    .venv/bin/python examples/attach.py --url http://127.0.0.1:8080 [--api-key KEY]

squad reads the engine's slots and context back from ``/props`` and admits only what
it can hold; it never reloads an engine it did not launch.
"""

from __future__ import annotations

import argparse

import anyio

from squad import Agent, Squad

AGENTS = [
    Agent(name="lead", instructions="Answer in one sentence.", budget=768, max_tokens=32,
          agents=["critic"], sub_agent_tools=False),
    Agent(name="critic", instructions="Criticise the idea in one sentence.", budget=512, max_tokens=32),
]


async def main(url: str, api_key: str | None) -> None:
    async with Squad(AGENTS, url=url, api_key=api_key) as sq:
        print(f"attached: slots={sq.info.slots} n_ctx={sq.info.n_ctx} (kv_unified={sq.info.kv_unified})")
        result = await sq.run("@critic Is a four-day work week a good idea?")
    print(f"\n@critic: {result.subs[0].output.strip()}")
    print(f"lead: {result.output.strip()}\n")
    print(result.summary())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="engine root URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--api-key", default=None, help="the engine's API key, if it has one")
    args = parser.parse_args()
    anyio.run(main, args.url, args.api_key)
