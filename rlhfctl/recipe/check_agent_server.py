"""Validation of ``rollout.agent_server``: the program imports and can be called, the tool-call format has a parser,
the port range has a free port for every rollout rank, and the agent rollout it drives is on (exit 2 from
``validate`` and ``train``, naming the key, before any worker starts).

The program is imported with the function the workers use (:func:`rlhfctl.agents.endpoint.program.load_program`),
so both report the same line. Ports are probed on *this* host, the driver's; a rank on another host that finds its
range taken fails at its first rollout with the same key.
"""

from __future__ import annotations

import socket

from rlhfctl.recipe.errors import Issue, RecipeError, did_you_mean, error, warning
from rlhfctl.recipe.specs import Recipe

__all__ = ["check_agent_server", "free_ports"]

_KEY = "rollout.agent_server"


def check_agent_server(recipe: Recipe) -> list[Issue]:
    """Errors naming the ``rollout.agent_server`` (or clashing ``rollout.multi_turn``) key of each problem; nothing
    without a program."""
    server = recipe.rollout.settings.agent_server
    if not server.program:
        return []
    if not recipe.rollout.agent:
        return [error(f"{_KEY}.program", (
            f"{_KEY}.program: needs rollout.multi_turn.enable: true (rollout.multi_turn.max_turns and max_response_tokens "
            "bound each program's trajectory)"))]
    # the endpoint package: imported only for recipes with a program, off the CLI's path otherwise
    from rlhfctl.agents.endpoint.program import load_program
    from rlhfctl.agents.tool_calls import tool_call_parsers

    issues: list[Issue] = []
    multi_turn = recipe.rollout.multi_turn
    for name in ("tools", "environment", "agent_loop"):
        if multi_turn[name]:
            issues.append(error(f"rollout.multi_turn.{name}", (
                f"rollout.multi_turn.{name}: unused when {_KEY}.program drives the rollout (the program runs its own "
                f"tools and loop); remove it, or remove {_KEY}.program")))
    try:
        load_program(str(server.program))
    except RecipeError as problem:
        issues.append(error(problem.key_path, str(problem)))
    fmt = str(server.tool_format)
    if fmt not in tool_call_parsers():  # after the program's import, which may register a parser
        issues.append(error(f"{_KEY}.tool_format", (
            f"{_KEY}.tool_format: no tool-call parser {fmt!r} (registered: {', '.join(tool_call_parsers())})"
            f"{did_you_mean(fmt, tool_call_parsers())}; register one with rlhfctl.agents.register_tool_call_parser "
            "in your program's module")))
    issues += _port_issues(recipe)
    if server.queue_size < server.max_concurrency:
        issues.append(warning(f"{_KEY}.queue_size", (
            f"{_KEY}.queue_size: {server.queue_size} is below max_concurrency {server.max_concurrency}: when every "
            "running program asks at once, some are answered HTTP 429 and must retry")))
    return issues


def _port_issues(recipe: Recipe) -> list[Issue]:
    ports = recipe.rollout.settings.agent_server.port_range
    if ports is None:
        return []
    first, last = int(ports[0]), int(ports[1])
    key = f"{_KEY}.port_range"
    if first > last:
        return [error(key, f"{key}: [{first}, {last}] is empty; write [first, last] with first <= last")]
    rollout = recipe.rollout
    pool = rollout.pool if rollout.on_own_pool and rollout.pool is not None else recipe.roles["actor"].pool
    ranks = recipe.pools[pool].world_size if pool in recipe.pools else 1
    free = free_ports(first, last, ranks)
    if free < ranks:
        return [error(key, (
            f"{key}: {free} of ports {first}..{last} are free on 127.0.0.1, and each of the {ranks} rollout rank(s) "
            "serves on one; widen the range or set it to null (a free port the OS picks)"))]
    return []


def free_ports(first: int, last: int, enough: int) -> int:
    """How many ports of ``first..last`` can be bound on 127.0.0.1 now, counting up to ``enough``."""
    found = 0
    for port in range(first, last + 1):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's server binds
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        found += 1
        if found >= enough:
            break
    return found
