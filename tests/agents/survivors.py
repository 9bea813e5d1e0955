"""Find a sandbox's processes from the host by a name they give themselves, as PIDs inside mean nothing outside."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

NAME_ME = "open('/proc/self/comm', 'w').write({token!r})"
"""Code that renames the process running it (its ``comm``, at most 15 characters) to ``token``."""


def new_token() -> str:
    """A name no other process on the host has."""
    return "sbx" + uuid.uuid4().hex[:12]


def named(token: str) -> list[int]:
    """Host PIDs of live (not zombie) processes named ``token``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            comm = Path(f"/proc/{entry}/comm").read_text().strip()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if comm == token and state != "Z":
            found.append(int(entry))
    return found


def wait_for_named(token: str, count: int = 1, within_s: float = 10.0) -> list[int]:
    """Wait until ``count`` processes named ``token`` run (the positive control of a survivor check)."""
    deadline = time.monotonic() + within_s
    while len(found := named(token)) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return found
