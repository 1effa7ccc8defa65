"""What a serverless reward does with credentials, exposure and faults (127.0.0.1 only)."""

from __future__ import annotations

import asyncio
import time

import pytest
from rollart_reward_serverless.reward import (
    CircuitOpenError,
    ServerlessReward,
    ServerlessRewardOptions,
)
from rollart_reward_serverless.serve import serve_reward

from rollart_sdk.serverless import ServerlessError, serve_function
from rollart_sdk.serverless.deploy import check_exposure
from rollart_sdk.testing.reward import make_request


def test_serve_refuses_to_run_open_unless_told_and_only_on_loopback():
    with pytest.raises(SystemExit, match="no token"):
        check_exposure("127.0.0.1", None, insecure=False)
    with pytest.raises(SystemExit, match="--insecure on 0.0.0.0"):
        check_exposure("0.0.0.0", None, insecure=True)
    assert check_exposure("127.0.0.1", None, insecure=True) == []
    assert check_exposure("::1", "t", insecure=False) == []
    (warning,) = check_exposure("0.0.0.0", "t", insecure=False)
    assert "not a loopback address" in warning


def test_client_sends_the_token_from_the_environment(monkeypatch):
    monkeypatch.setenv("REWARD_TOKEN_T", "tok-123")
    with serve_reward("rule", {"mode": "success"}, token="tok-123") as endpoint:
        good = ServerlessReward(endpoint.url, timeout_s=10, token_env="REWARD_TOKEN_T")
        result = asyncio.run(good.score(make_request(info={"success": True})))
        assert result.reward == 1.0
        anonymous = ServerlessReward(endpoint.url, timeout_s=10, retries=0)
        with pytest.raises(ServerlessError, match="HTTP 401"):
            asyncio.run(anonymous.score(make_request(info={"success": True})))
        assert endpoint.calls == 1 and endpoint.rejected == 1
    assert "tok-123" not in repr(good._proxy._call)  # credentials never shown


def test_missing_credential_variable_is_named_at_construction(monkeypatch):
    monkeypatch.delenv("NO_SUCH_TOKEN_VAR", raising=False)
    with pytest.raises(ServerlessError, match="NO_SUCH_TOKEN_VAR not set"):
        ServerlessReward("http://127.0.0.1:9/", token_env="NO_SUCH_TOKEN_VAR")


def test_options_need_an_endpoint_or_a_deployment():
    with pytest.raises(ValueError, match="give url"):
        ServerlessRewardOptions()


def test_circuit_opens_after_repeated_failures_then_lets_a_trial_through():
    def broken(request):
        raise RuntimeError("backend down")

    with serve_function(broken) as endpoint:
        backend = ServerlessReward(endpoint.url, timeout_s=10, retries=0,
                                   breaker_failures=3, breaker_cooldown_s=0.5,
                                   outage_wait_s=0)  # fail at once (no waiting)
        for i in range(3):
            with pytest.raises(ServerlessError, match="HTTP 500"):
                asyncio.run(backend.score(make_request(trajectory_id=f"t{i}")))
        assert endpoint.calls == 3
        for i in range(5):  # open: fail at once naming the cause; the endpoint sees nothing
            with pytest.raises(CircuitOpenError, match="circuit open.*last error: .*HTTP 500"):
                asyncio.run(backend.score(make_request(trajectory_id=f"f{i}")))
        assert endpoint.calls == 3 and backend.breaker.opened == 1
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # after the cooldown one trial call goes through
            try:
                asyncio.run(backend.score(make_request(trajectory_id="trial")))
            except CircuitOpenError:
                time.sleep(0.1)
            except ServerlessError:
                break
        assert endpoint.calls == 4 and backend.breaker.opened == 2


def test_slow_and_malformed_answers_fail_the_call_never_score_zero():
    def slow(request):
        time.sleep(3)
        return {"reward": 1.0}

    with serve_function(slow) as endpoint:
        backend = ServerlessReward(endpoint.url, timeout_s=0.5, retries=1, backoff_s=0.01)
        with pytest.raises(ServerlessError, match="failed 2 time"):
            asyncio.run(backend.score(make_request()))
    with serve_function(lambda request: {"reward": "lots"}) as endpoint:
        backend = ServerlessReward(endpoint.url, timeout_s=5, retries=0)
        with pytest.raises(ServerlessError, match="non-number reward"):
            asyncio.run(backend.score(make_request()))


def test_a_cancelled_trial_call_does_not_leave_the_circuit_open_for_good():
    """The half-open trial's caller is cancelled (the run's reward timeout): no verdict on
    the endpoint, so the next call after the cooldown is the trial again (it used to be
    refused with CircuitOpenError for the rest of the run)."""
    def slow(request):
        time.sleep(0.6)
        return {"reward": 1.0}

    with serve_function(slow) as endpoint:
        backend = ServerlessReward(endpoint.url, timeout_s=10, retries=0,
                                   breaker_failures=1, breaker_cooldown_s=0.2)
        backend.breaker.record(ok=False)  # one failure opens it (breaker_failures 1)
        assert backend.breaker.opened == 1
        time.sleep(0.3)  # past the cooldown: the next call is the half-open trial

        async def cancelled_trial():
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(backend.score(make_request(trajectory_id="t")), 0.1)

        asyncio.run(cancelled_trial())
        assert not backend.breaker.trial_running
        result = asyncio.run(backend.score(make_request(trajectory_id="next")))
        assert result.reward == 1.0 and backend.breaker.opened_at is None  # closed again


def test_an_answer_cut_short_is_a_serverless_error():
    """An endpoint that closes mid-answer (a restart): http.client.IncompleteRead, which is
    not an OSError, becomes the ServerlessError that retries and the breaker count."""
    import socket
    import threading

    from rollart_sdk.serverless import HttpJsonCaller

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(10)

    def answer_half():
        conn, _ = server.accept()
        with conn:
            conn.settimeout(10)
            # Read the whole request first: closing with unread bytes sends a reset, and
            # the client would see ECONNRESET instead of the short answer.
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length:
                body += conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{\"result\": {\"rew")
            conn.shutdown(socket.SHUT_WR)  # a clean end of stream mid-answer

    thread = threading.Thread(target=answer_half, daemon=True)
    thread.start()
    try:
        caller = HttpJsonCaller(f"http://127.0.0.1:{server.getsockname()[1]}/", timeout_s=10)
        with pytest.raises(ServerlessError, match="broke off its answer: IncompleteRead"):
            caller({"trajectory_id": "t"})
    finally:
        thread.join(timeout=10)
        server.close()


def test_a_hung_backend_call_is_cancelled_at_the_endpoints_timeout():
    """serve.py's loop bounds every score: past the timeout the coroutine is cancelled and
    the call fails (the HTTP caller then sees a 500), instead of a thread held for good."""
    from rollart_reward_serverless.serve import _Loop

    loop = _Loop()
    ended = []

    async def hang():
        try:
            await asyncio.sleep(60)
        finally:
            ended.append("cancelled")

    with pytest.raises(TimeoutError, match="did not answer within 0.2 s"):
        loop.run(hang(), 0.2)  # unbounded, it would return after 60 s instead of raising
    deadline = time.monotonic() + 5
    while not ended and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ended == ["cancelled"]
    assert loop.run(asyncio.sleep(0, result=7), 5) == 7  # the loop still serves


def test_calls_wait_out_an_outage_then_go_on():
    """HTTP 500 for a second: the circuit opens, the calls that come meanwhile wait for it
    instead of failing, and all succeed once a trial call does; the endpoint sees a few
    trial calls, not one per waiting call."""
    state = {"down_until": time.monotonic() + 1.0, "failed": 0}

    def switchable(request):
        if time.monotonic() < state["down_until"]:
            state["failed"] += 1
            raise RuntimeError("backend down")
        return {"reward": 1.0, "details": {}}

    async def many(backend):
        return await asyncio.gather(*(backend.score(make_request(trajectory_id=f"t{i}"))
                                      for i in range(20)))

    with serve_function(switchable) as endpoint:
        backend = ServerlessReward(endpoint.url, timeout_s=10, retries=2, backoff_s=0.01,
                                   breaker_failures=2, breaker_cooldown_s=0.2,
                                   outage_wait_s=30)
        t0 = time.monotonic()
        results = asyncio.run(many(backend))
    assert [r.reward for r in results] == [1.0] * 20
    assert time.monotonic() - t0 < 20
    # Each call's first attempt may have hit the outage; after that, only trials did.
    assert backend.breaker.opened >= 1 and state["failed"] <= 20 + 10, state


def test_refused_credentials_fail_at_once_with_the_401(monkeypatch):
    """A wrong token is not an outage: every call fails at once with the endpoint's 401
    and the variable to fix, never hidden behind an open circuit, never waiting."""
    from rollart_reward_serverless.reward import CredentialsRefused

    monkeypatch.setenv("REWARD_TOKEN_W", "wrong")
    with serve_reward("rule", {"mode": "success"}, token="right") as endpoint:
        backend = ServerlessReward(endpoint.url, timeout_s=10, token_env="REWARD_TOKEN_W",
                                   breaker_failures=1, outage_wait_s=60)
        t0 = time.monotonic()
        for i in range(4):
            with pytest.raises(CredentialsRefused, match=r"refused the credentials.*HTTP 401"
                               r".*check the token in \$REWARD_TOKEN_W"):
                asyncio.run(backend.score(make_request(trajectory_id=f"t{i}")))
        assert time.monotonic() - t0 < 5 and endpoint.rejected == 4
        assert backend.breaker.opened == 0
