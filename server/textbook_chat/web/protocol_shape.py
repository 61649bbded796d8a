"""What ``web/sockets.py`` takes from uvicorn's private httptools protocol, checked before a server starts.

``GuardedProtocol`` subclasses ``uvicorn.protocols.http.httptools_impl.HttpToolsProtocol``, which is not uvicorn's
public API: a refactor upstream would break the server at import or, worse, leave it serving without read
deadlines. pyproject.toml pins uvicorn to the versions this was tested with; this check says what changed otherwise.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from concurrent.futures import ThreadPoolExecutor

import uvicorn
from uvicorn.protocols.http import httptools_impl
from uvicorn.server import ServerState

TESTED = "uvicorn 0.54"  # pyproject.toml: uvicorn[standard]>=0.54,<0.55

# The protocol's methods GuardedProtocol overrides (and calls through super()), with their parameters.
METHODS = {
    "__init__": ("self", "config", "server_state", "app_state", "_loop"),
    "connection_made": ("self", "transport"),
    "connection_lost": ("self", "exc"),
    "data_received": ("self", "data"),
    "on_message_begin": ("self",),
    "on_headers_complete": ("self",),
    "on_message_complete": ("self",),
    "send_400_response": ("self", "msg"),
}
# Attributes it reads, each set by the class that owns it: (class, attribute).
ATTRIBUTES = {
    "HttpToolsProtocol": ("transport", "client", "cycle", "loop", "server_state"),
    "RequestResponseCycle": ("response_complete",),
    "ServerState": ("default_headers",),
}


def shape_errors(
    protocol: type = httptools_impl.HttpToolsProtocol,
    cycle: type = httptools_impl.RequestResponseCycle,
    state: type = ServerState,
) -> list[str]:
    """What ``protocol`` (and its request cycle and server state) no longer has of what sockets.py relies on."""
    errors = []
    for name, wanted in METHODS.items():
        method = getattr(protocol, name, None)
        if not callable(method) or method is getattr(object, name, None):
            errors.append(f"{protocol.__name__}.{name}() is gone")
            continue
        found = tuple(inspect.signature(method).parameters)
        if found != wanted:
            errors.append(f"{protocol.__name__}.{name}{found} was {name}{wanted}")
    for owner, role in ((protocol, "HttpToolsProtocol"), (cycle, "RequestResponseCycle"), (state, "ServerState")):
        assigned = _self_attributes(owner)
        errors += [f"{owner.__name__} no longer sets self.{a}" for a in ATTRIBUTES[role] if a not in assigned]
    return errors


def require_shape(**classes: type) -> None:
    """Raise, naming what changed, when uvicorn's protocol is not the shape sockets.py was written against."""
    errors = shape_errors(**classes)
    if errors:
        raise RuntimeError(
            f"uvicorn {uvicorn.__version__}'s httptools protocol has changed ({'; '.join(errors)}): the server "
            f"would run without its read deadlines (web/sockets.py), so it does not start. Install the uvicorn "
            f"this release was tested with ({TESTED}): pip install 'uvicorn[standard]>=0.54,<0.55'"
        )


@functools.cache
def _self_attributes(cls: type) -> frozenset[str]:
    """Names assigned as ``self.NAME = ...`` (or annotated) anywhere in ``cls``'s own source; read once a process.

    Parsed on a thread of its own: CPython 3.11's parser can fail with "AST constructor recursion depth mismatch"
    when called deep in a running server's stack (a fresh thread starts with a fresh count)."""
    with ThreadPoolExecutor(max_workers=1) as parser:
        return parser.submit(_assigned_in, cls).result()


def _assigned_in(cls: type) -> frozenset[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    names = set()
    for node in ast.walk(tree):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for part in (part for target in targets for part in ast.walk(target)):  # tuples unpacked too
            if isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name) and part.value.id == "self":
                names.add(part.attr)
    return frozenset(names)
