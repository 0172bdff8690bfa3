"""Calling kfp.Client with clear errors, and paging through its list calls.

Every KFP call of this package goes through :func:`call`, which turns HTTP and network errors
into :class:`~pipeline.ops.errors.OpsError` naming the operation and the status.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import kfp_server_api
import urllib3

from pipeline.ops.errors import AlreadyExistsError, NotFoundError, OpsError

PAGE_SIZE = 100


def error_detail(body: bytes | str | None) -> str:
    """Return the human part of a KFP error body (``{"error"|"message": ...}``), else the body."""
    if not body:
        return "(no details)"
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        parsed = json.loads(text)
    except ValueError:
        return text.strip()[:500]
    if isinstance(parsed, dict):
        for key in ("message", "error"):
            if parsed.get(key):
                return str(parsed[key])
    return text.strip()[:500]


def call(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call one KFP API function; turn HTTP and network errors into :class:`OpsError`.

    `what` names the operation in the message ("upload version 0.1.0-g1a2b3c4 of pipeline x").
    404 becomes :class:`NotFoundError` and 409 :class:`AlreadyExistsError`.
    """
    try:
        return fn(*args, **kwargs)
    except kfp_server_api.ApiException as exc:
        status = exc.status
        detail = error_detail(exc.body) if exc.body else (exc.reason or "(no details)")
        message = f"{what} failed: HTTP {status} {exc.reason or ''}".rstrip() + f": {detail}"
        if status == 404:
            raise NotFoundError(message, status) from exc
        if status == 409:
            raise AlreadyExistsError(message, status) from exc
        raise OpsError(message, status, transient=bool(status and status >= 500)) from exc
    except urllib3.exceptions.HTTPError as exc:
        raise OpsError(
            f"{what} failed: no answer from KFP ({type(exc).__name__}: {exc})", transient=True
        ) from exc


def equals_filter(key: str, value: str) -> str:
    """Return a KFP v2beta1 list filter selecting items whose `key` equals `value`."""
    # The same shape kfp.Client.get_pipeline_id sends (operation 1 is EQUALS).
    return json.dumps({"predicates": [{"operation": 1, "key": key, "stringValue": value}]})


def pages(fetch: Callable[[str], Any], items_attr: str) -> Iterator[Any]:
    """Yield every item of a paginated KFP list call; `fetch(page_token)` returns one page."""
    token = ""
    while True:
        page = fetch(token)
        yield from getattr(page, items_attr, None) or []
        token = getattr(page, "next_page_token", None) or ""
        if not token:
            return


def named(what: str, lister: Callable[..., Any], field: str, name: str, **kwargs: Any) -> list[Any]:
    """Every object `lister` pages through (under `field`) whose display name is `name`.

    The server is asked to filter by name; its answer is still checked for exact matches.
    kfp.Client's own name lookups (``get_pipeline_id``, ``get_experiment``) read one page only,
    take no namespace for pipelines, and signal "none" and "several" with the same ValueError.
    """
    found = pages(
        lambda token: call(
            f"look up {what}",
            lister,
            page_token=token,
            page_size=PAGE_SIZE,
            filter=equals_filter("display_name", name),
            **kwargs,
        ),
        field,
    )
    return [item for item in found if item.display_name == name]
