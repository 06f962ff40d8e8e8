"""The Compute clients' HTTP sessions: requests' environment read once, with the same proxies and CA bundle."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from reaper.gce.clients import compute_clients, sessions


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A proxy for HTTPS but not for the emulator's host, a CA bundle, and a netrc entry for both hosts."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
    netrc = tmp_path / "netrc"
    netrc.write_text("machine compute.googleapis.com login u password p\nmachine 127.0.0.1 login u password p\n")
    monkeypatch.setenv("NETRC", str(netrc))
    return bundle


def test_every_session_keeps_the_proxies_that_apply_to_its_endpoint_and_the_ca_bundle(environment: Path) -> None:
    real, emulated = compute_clients(), compute_clients(api_endpoint="http://127.0.0.1:8085")
    assert len(sessions(real)) == 4  # the listing's and the three SDK clients': a new SDK must not drop one
    for session in sessions(real):
        assert not session.trust_env and session.verify == str(environment)
        assert session.proxies["https"] == "http://proxy.example:3128"
    for session in sessions(emulated):  # NO_PROXY names the emulator's host
        assert not session.trust_env and "https" not in session.proxies and "http" not in session.proxies


def test_a_netrc_entry_for_the_endpoint_does_not_replace_the_bearer_token(environment: Path) -> None:
    # requests applies ~/.netrc (or $NETRC) as basic auth over any Authorization header when it trusts the
    # environment: the credentials' token would be replaced. Pinned against requests itself, so this fails if a
    # session is left trusting it.
    for session in sessions(compute_clients()):
        request = requests.Request("GET", "https://compute.googleapis.com/x", headers={"Authorization": "Bearer t"})
        assert session.prepare_request(request).headers["Authorization"] == "Bearer t"
    trusting = requests.Session()
    request = requests.Request("GET", "https://compute.googleapis.com/x", headers={"Authorization": "Bearer t"})
    assert trusting.prepare_request(request).headers["Authorization"].startswith("Basic ")
