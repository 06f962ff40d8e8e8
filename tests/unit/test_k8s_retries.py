"""How a failed Kubernetes call is retried, and how long the evidence re-read before a delete can take."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException
from urllib3 import HTTPHeaderDict
from urllib3 import exceptions as u3exc

from reaper.config import parse_settings
from reaper.k8s.client import RETRY_AFTER_CAP, answer, retryable
from reaper.k8s.evidence import reread_timeout


class _Response:
    """What ``ApiException`` reads from urllib3's response."""

    def __init__(self, status: int, headers: dict[str, str]) -> None:
        self.status, self.reason, self.data = status, "Reason", b"{}"
        self._headers = HTTPHeaderDict(headers)

    def getheaders(self) -> HTTPHeaderDict:
        return self._headers


def failed(status: int, **headers: str) -> ApiException:
    return ApiException(http_resp=_Response(status, {k.replace("_", "-"): v for k, v in headers.items()}))


@pytest.mark.parametrize(
    ("exc", "verdict"),
    [
        (failed(429, Retry_After="2"), 2.0),  # API Priority and Fairness: the server's own wait
        (failed(429, Retry_After=" 1 "), 1.0),
        (failed(503, Retry_After="3"), 3.0),  # a 5xx may carry one too (RFC 9110), as client-go reads it
        (failed(429, Retry_After="86400"), RETRY_AFTER_CAP),  # believed, within reason
        (failed(429), True),  # none: exponential backoff
        (failed(429, Retry_After="Wed, 21 Oct 2015 07:28:00 GMT"), True),  # an HTTP-date: backoff
        (failed(429, Retry_After="-1"), True),
        (failed(429, Retry_After="1.5"), True),  # not delay-seconds
        (failed(429, Retry_After="²"), True),  # a Unicode digit is no number of seconds
        (failed(500), True),
        (failed(504), True),
        (failed(404), False),
        (failed(409), False),
        (failed(403), False),
        (failed(400, Retry_After="1"), False),  # final whatever it says
        (ApiException(status=0, reason="SSL: CERTIFICATE_VERIFY_FAILED"), False),
        (u3exc.ReadTimeoutError(None, "/", "read timed out"), True),  # type: ignore[arg-type]  # no pool: the error is only classified
        (u3exc.ProtocolError("connection dropped"), True),
        (ValueError("the answer is not this one object"), False),
    ],
)
def test_retryable(exc: BaseException, verdict: bool | float) -> None:
    got = retryable(exc)
    assert got == verdict and type(got) is type(verdict)  # 0.0 and 1.0 are waits, never False or True


def test_a_retry_after_of_zero_is_a_wait_of_nothing_not_a_final_answer() -> None:
    got = retryable(failed(429, Retry_After="0"))
    assert got == 0.0 and got is not False


def test_answer_names_the_status_never_the_headers_or_body() -> None:
    assert answer(failed(429, Retry_After="1")) == "HTTP 429 Reason"
    assert answer(u3exc.ProtocolError("x")) == "ProtocolError"


def test_the_evidence_re_read_is_bounded_by_its_readers_timeouts() -> None:
    defaults = parse_settings({}, "test")
    assert reread_timeout(defaults) == 2 * 5 + 5  # NATS leases (connect and listing), the Mongo run store
    mongo = parse_settings({"k8s": {"lease_source": "mongo", "mongo_leases": {"timeout": "3s"}}}, "test")
    assert reread_timeout(mongo) == 3 + 5
    unread = {"k8s": {"lease_source": "none", "run_store": "none"}, "rules": {"sandbox_orphan": "report"}}
    nothing = parse_settings(unread, "test")
    assert reread_timeout(nothing) == 0
