"""The calls of one launch request (broker.attempts.launch_tries), which one offer's launch and a
several-shape request share: how many, after which waits, and which errors call again."""
from __future__ import annotations

import pytest

from broker.attempts import launch_tries
from providers.base import CapacityError, ProviderError, ThrottledError


def run(tries: int, errors: list[Exception], backoff_s: float = 0.5):
    """Calls until one does not raise; each raises the next of ``errors`` while any are left."""
    sleeps: list[float] = []
    calls = []
    for call in launch_tries(tries, backoff_s, sleeps.append, lease="l-1", provider="aws"):
        with call:
            calls.append(call.retry_state.attempt_number)
            if errors:
                raise errors.pop(0)
    return calls, sleeps


def throttled() -> ThrottledError:
    return ThrottledError("slow down", provider="aws", code="RequestLimitExceeded")


def test_a_retryable_error_calls_again_after_a_doubling_wait():
    calls, sleeps = run(4, [throttled(), throttled(), throttled()])
    assert calls == [1, 2, 3, 4] and sleeps == [0.5, 1.0, 2.0]


def test_the_last_calls_retryable_error_is_raised_as_it_is():
    err = throttled()
    with pytest.raises(ThrottledError) as got:
        run(2, [throttled(), err])
    assert got.value is err


@pytest.mark.parametrize("err", [CapacityError("none left", provider="aws", code="InsufficientInstanceCapacity"),
                                 ValueError("not a cloud error")])
def test_any_other_error_is_raised_at_the_first_call(err):
    sleeps: list[float] = []
    calls = []
    with pytest.raises(type(err)) as got:
        for call in launch_tries(5, 0.5, sleeps.append, lease="l-1", provider="aws"):
            with call:
                calls.append(1)
                raise err
    assert got.value is err and calls == [1] and sleeps == []


def test_no_tries_configured_is_still_one_call():
    with pytest.raises(ProviderError):
        run(0, [throttled()])
    assert run(0, []) == ([1], [])
