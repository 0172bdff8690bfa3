"""Schedules (KFP recurring runs): the cron check, create, find, pause, resume, delete.

Creating, listing, enabling, disabling and deleting are kfp.Client's own calls. The cron
expression is checked here before anything is sent, although the KFP API checks it too: the
API parses it with robfig/cron v1 (``cron.Parse``: seconds first, day of week optional), so a
5-field crontab line such as ``0 2 * * *`` is *accepted* there as "second 0, minute 2, every
hour" and the schedule fires 24 times a day; and its errors name neither the field nor the fix
(``End of range (25) above maximum (23): 25``). tests/test_ops.py shows both side by side.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kfp

from pipeline.ops.api import PAGE_SIZE, call, equals_filter, pages
from pipeline.ops.errors import AlreadyExistsError, CronError, NotFoundError, OpsError
from pipeline.ops.settings import MAX_CONCURRENCY_LIMIT

# KFP's scheduled workflow controller allows 1..10 concurrent runs per recurring run.

_MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_WEEKDAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
_CRON_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("second", 0, 59, {}),
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, {m: i + 1 for i, m in enumerate(_MONTHS)}),
    ("day of week", 0, 6, {d: i for i, d in enumerate(_WEEKDAYS)}),
)


def _cron_value(field: str, text: str, low: int, high: int, names: Mapping[str, int]) -> int:
    """Return the number `text` stands for in cron field `field`, checked against its range."""
    upper = text.upper()
    if upper in names:
        return names[upper]
    if not text.isdigit():
        raise CronError(f"cron {field} field: {text!r} is not a number")
    value = int(text)
    if not low <= value <= high:
        raise CronError(f"cron {field} field: {value} is out of range {low}-{high}")
    return value


def _check_cron_field(field: str, text: str, low: int, high: int, names: Mapping[str, int]) -> None:
    """Check one cron field: ``*``, ``?``, ``a``, ``a-b``, ``*/n``, ``a/n``, ``a-b/n`` lists."""
    for part in text.split(","):
        if not part:
            raise CronError(f"cron {field} field {text!r} has an empty list item")
        span, slash, step = part.partition("/")
        if slash and (not step.isdigit() or int(step) == 0):
            raise CronError(f"cron {field} field: step {step!r} must be a positive number")
        if span in ("*", "?"):
            if span == "?" and field not in ("day of month", "day of week"):
                raise CronError(f"cron {field} field: '?' is only allowed in the day fields")
            continue
        first, dash, last = span.partition("-")
        start = _cron_value(field, first, low, high, names)
        if dash:
            end = _cron_value(field, last, low, high, names)
            if end < start:
                raise CronError(f"cron {field} field: range {span!r} runs backwards")


def validate_cron(expression: str) -> str:
    """Return `expression` normalised if it is a valid KFP cron expression, else raise.

    KFP (robfig/cron with seconds) takes 6 fields: ``SECOND MINUTE HOUR DAY-OF-MONTH MONTH
    DAY-OF-WEEK``, e.g. ``0 0 2 * * *`` for 02:00 every day. Each field takes ``*``, ``?``
    (day fields only), numbers, month/day names, ranges ``a-b``, steps ``/n`` and lists ``,``.
    """
    fields = expression.split()
    if len(fields) != 6:
        hint = ""
        if len(fields) == 5:
            hint = f"; KFP cron has a leading seconds field, did you mean '0 {' '.join(fields)}'?"
        raise CronError(
            f"cron expression {expression!r} has {len(fields)} fields, KFP needs 6: "
            f"SECOND MINUTE HOUR DAY-OF-MONTH MONTH DAY-OF-WEEK{hint}"
        )
    for text, (field, low, high, names) in zip(fields, _CRON_FIELDS, strict=True):
        _check_cron_field(field, text, low, high, names)
    return " ".join(fields)


def find_schedules(
    client: kfp.Client, name: str | None = None, namespace: str | None = None
) -> list[Any]:
    """Return the recurring runs (all, or those whose display name is `name`)."""

    def fetch(token: str) -> Any:
        kwargs: dict[str, Any] = {"page_token": token, "page_size": PAGE_SIZE}
        if name is not None:
            kwargs["filter"] = equals_filter("display_name", name)
        if namespace is not None:
            kwargs["namespace"] = namespace
        return call("list schedules", client.list_recurring_runs, **kwargs)

    found = list(pages(fetch, "recurring_runs"))
    return [r for r in found if name is None or r.display_name == name]


def resolve_schedule(client: kfp.Client, ref: str, namespace: str | None = None) -> Any:
    """Return the recurring run named `ref`, or else the one whose id is `ref`."""
    named = find_schedules(client, ref, namespace)
    if len(named) > 1:
        ids = ", ".join(r.recurring_run_id for r in named)
        raise OpsError(f"several schedules are named {ref!r} ({ids}); give the id instead")
    if named:
        return named[0]
    try:
        return call(f"get schedule {ref}", client.get_recurring_run, recurring_run_id=ref)
    except NotFoundError as exc:
        raise NotFoundError(f"no schedule named or with id {ref!r}") from exc


def create_schedule(
    client: kfp.Client,
    *,
    name: str,
    cron: str,
    pipeline_id: str,
    version_id: str,
    experiment_id: str,
    params: Mapping[str, Any],
    max_concurrency: int = 1,
    no_catchup: bool = True,
    enabled: bool = True,
    namespace: str | None = None,
    description: str | None = None,
    service_account: str | None = None,
) -> Any:
    """Create a recurring run of an uploaded pipeline version; the name must be unused."""
    expression = validate_cron(cron)
    if not 1 <= max_concurrency <= MAX_CONCURRENCY_LIMIT:
        raise OpsError(
            f"max_concurrency must be between 1 and {MAX_CONCURRENCY_LIMIT}, got {max_concurrency}"
        )
    if find_schedules(client, name, namespace):
        raise AlreadyExistsError(
            f"a schedule named {name!r} exists already; delete it first or pick another --name"
        )
    return call(
        f"create schedule {name!r}",
        client.create_recurring_run,
        experiment_id=experiment_id,
        job_name=name,
        description=description,
        cron_expression=expression,
        max_concurrency=max_concurrency,
        no_catchup=no_catchup,
        params=dict(params),
        pipeline_id=pipeline_id,
        version_id=version_id,
        enabled=enabled,
        service_account=service_account,
    )


def pause_schedule(client: kfp.Client, recurring_run_id: str) -> None:
    """Disable a recurring run (no new runs start; running ones go on)."""
    call(
        f"pause schedule {recurring_run_id}",
        client.disable_recurring_run,
        recurring_run_id=recurring_run_id,
    )


def resume_schedule(client: kfp.Client, recurring_run_id: str) -> None:
    """Enable a paused recurring run again."""
    call(
        f"resume schedule {recurring_run_id}",
        client.enable_recurring_run,
        recurring_run_id=recurring_run_id,
    )


def delete_schedule(client: kfp.Client, recurring_run_id: str) -> None:
    """Delete a recurring run (runs it started are kept)."""
    call(
        f"delete schedule {recurring_run_id}",
        client.delete_recurring_run,
        recurring_run_id=recurring_run_id,
    )
