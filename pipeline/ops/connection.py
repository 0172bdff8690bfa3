"""Connecting to the KFP API: endpoint, namespace, credentials, a fast health check, timeouts.

The host, namespace and credentials are passed in explicitly as :class:`KfpSettings`; the CLI
fills them from flags or the usual environment variables at call time
(``KF_PIPELINES_ENDPOINT``, ``KF_PIPELINES_NAMESPACE``, ``KF_PIPELINES_TOKEN``,
``KF_PIPELINES_SA_TOKEN_PATH``). Nothing here reads the environment at import time.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kfp
import urllib3

from pipeline.ops.api import error_detail
from pipeline.ops.errors import OpsError
from pipeline.ops.settings import DEFAULT_REQUEST_TIMEOUT_S


@dataclass(frozen=True)
class KfpSettings:
    """How to reach and authenticate to the KFP API.

    host: API endpoint, e.g. ``http://localhost:8888`` (a port-forward of ``svc/ml-pipeline``)
        or ``https://kubeflow.example.com/pipeline``. ``None`` lets kfp.Client find the API
        itself: the in-cluster service when running in a pod, else the current kubeconfig
        context through the Kubernetes API server's service proxy.
    namespace: the user's profile namespace on a multi-user deployment; ``None`` on a
        single-user (standalone) deployment.
    token: a bearer token obtained outside the SDK (kfp.Client's ``existing_token``).
    sa_token_path: a projected service-account token file, re-read on every request (kfp's
        ``ServiceAccountTokenVolumeCredentials``); for pods talking to a multi-user KFP.
    request_timeout: seconds to wait for connect and for each response before giving up.
    """

    host: str | None = None
    namespace: str | None = None
    token: str | None = None
    sa_token_path: str | None = None
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT_S


def normalize_host(host: str) -> str:
    """Return `host` with a scheme (``https://`` when none is given) and no trailing slash."""
    host = host.strip()
    if not host:
        raise OpsError("the KFP host is empty; pass --host or set KF_PIPELINES_ENDPOINT")
    if not re.match(r"^https?://", host):
        host = "https://" + host
    return host.rstrip("/")


def _bearer_token(settings: KfpSettings) -> str | None:
    """Return the bearer token `settings` authenticate with, reading the token file if any."""
    if settings.token:
        return settings.token
    if settings.sa_token_path:
        try:
            return Path(settings.sa_token_path).read_text().strip()
        except OSError as exc:
            raise OpsError(
                f"cannot read the service-account token file {settings.sa_token_path}: {exc}"
            ) from exc
    return None


def check_health(settings: KfpSettings) -> dict[str, Any]:
    """GET ``/apis/v2beta1/healthz`` once, with a timeout, and return its JSON.

    kfp.Client calls healthz from its constructor (when no namespace is set) and from
    ``get_kfp_healthz`` with five retries five seconds apart and no timeout; this check fails
    fast, with a clear message, instead.
    """
    if not settings.host:
        raise OpsError("check_health needs a host")
    url = normalize_host(settings.host) + "/apis/v2beta1/healthz"
    request = urllib.request.Request(url, method="GET")
    token = _bearer_token(settings)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=settings.request_timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        detail = error_detail(exc.read())
        hint = " (check the token)" if exc.code in (401, 403) else ""
        raise OpsError(
            f"KFP at {settings.host} is not healthy: HTTP {exc.code} {exc.reason} from "
            f"{url}{hint}: {detail}"
        ) from exc
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise OpsError(f"cannot reach KFP at {settings.host} ({url}): {reason}") from exc
    try:
        parsed = json.loads(body or b"{}")
    except ValueError as exc:
        raise OpsError(
            f"{url} did not answer with JSON; is {settings.host} the KFP API endpoint "
            f"(not the UI)? got: {body[:200]!r}"
        ) from exc
    return parsed if isinstance(parsed, dict) else {}


def connect(settings: KfpSettings) -> kfp.Client:
    """Return a ``kfp.Client`` for `settings`, after a fast health check when a host is given.

    Every request the client makes afterwards times out after ``settings.request_timeout``.
    """
    if settings.host:
        check_health(settings)
    credentials = None
    if settings.sa_token_path and not settings.token:
        from kfp.client.set_volume_credentials import ServiceAccountTokenVolumeCredentials

        credentials = ServiceAccountTokenVolumeCredentials(path=settings.sa_token_path)
    try:
        with warnings.catch_warnings():
            # "This client only works with Kubeflow Pipeline v2.0.0-beta.2 and later versions."
            warnings.simplefilter("ignore", FutureWarning)
            client = kfp.Client(
                host=normalize_host(settings.host) if settings.host else None,
                namespace=settings.namespace or "kubeflow",
                existing_token=settings.token or None,
                credentials=credentials,
            )
    except (urllib3.exceptions.HTTPError, TimeoutError) as exc:
        raise OpsError(f"cannot connect to KFP at {settings.host or '(auto)'}: {exc}") from exc
    _set_request_timeout(client, settings.request_timeout)
    return client


def _set_request_timeout(client: kfp.Client, seconds: float) -> None:
    """Make every request of `client` time out after `seconds` (kfp.Client has no such option).

    All of kfp.Client's service APIs share one generated ``ApiClient``; its REST client takes a
    per-request ``_request_timeout`` that kfp.Client never passes, so it is filled in here.
    """
    rest = client._run_api.api_client.rest_client
    original = rest.request
    timeout = (float(seconds), float(seconds))  # (connect, read); a float alone is ignored

    def request(*args: Any, _request_timeout: Any = None, **kwargs: Any) -> Any:
        return original(*args, _request_timeout=_request_timeout or timeout, **kwargs)

    rest.request = request
