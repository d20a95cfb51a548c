"""netclaim's error hierarchy, raised from one place per boundary.

NetclaimError
├── ConfigError        bad input from a user or an admin (a file, a claim, a policy); never retried
├── PrerequisiteError  something the machine lacks (a program, root, a kernel feature); says what to install
└── TransientError     a peer is not ready or not reachable; the caller may retry
"""

from __future__ import annotations

from pydantic import ValidationError


class NetclaimError(Exception):
    """Base of every error netclaim raises on purpose."""


class ConfigError(NetclaimError):
    """Input that can never work as given; the message names the source and the field."""


class PrerequisiteError(NetclaimError):
    """A program, permission or kernel feature is missing; the message says what to install or do."""


class TransientError(NetclaimError):
    """A dependency is not ready yet; retrying later may succeed."""


def field_path(location: tuple[int | str, ...], prefix: str = "") -> str:
    """Render a pydantic error location as `a.b[0].c`."""
    path = prefix
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path = f"{path}.{part}" if path else part
    return path or "(root)"


def format_validation_error(source: str, err: ValidationError, prefix: str = "") -> str:
    """One line per problem: `<source>: <field path>: <message>`."""
    lines = []
    for problem in err.errors(include_url=False):
        location = tuple(p for p in problem["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        message = problem["msg"]
        if problem["type"] == "extra_forbidden":
            message = "unknown field"
        elif message.startswith("Value error, "):
            message = message.removeprefix("Value error, ")
        lines.append(f"{source}: {field_path(location, prefix)}: {message}")
    return "\n".join(lines)
