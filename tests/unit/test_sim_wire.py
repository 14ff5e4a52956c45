"""The simulated device's wire codec: every message round-trips; malformed ones are refused by name."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enforcement.sim import messages
from workloads import simwire
from workloads.simwire import Codec, WireError

ALL_MESSAGES = (
    *simwire.CLIENT_REQUESTS,
    *simwire.CLIENT_REPLIES,
    *messages.ADMIN_REQUESTS,
    *[m for m in messages.ADMIN_REPLIES if m not in simwire.ERROR_REPLIES],
)


def _strategy(tp: Any) -> st.SearchStrategy[Any]:
    origin = typing.get_origin(tp)
    if origin is tuple:
        return st.lists(_strategy(typing.get_args(tp)[0]), max_size=3).map(tuple)
    if origin is dict:
        return st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3)
    if origin is not None:  # X | None
        inner = [a for a in typing.get_args(tp) if a is not type(None)][0]
        return st.none() | _strategy(inner)
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return st.builds(tp, **{f.name: _strategy(hints[f.name]) for f in dataclasses.fields(tp)})
    return {
        int: st.integers(-(2**62), 2**62),
        float: st.floats(allow_nan=False, allow_infinity=False),
        str: st.text(max_size=20),
        bool: st.booleans(),
    }[tp]


def test_message_type_tags_are_unique_across_both_sockets() -> None:
    Codec(ALL_MESSAGES)  # raises on a duplicate


@pytest.mark.parametrize("cls", ALL_MESSAGES, ids=lambda c: c.TYPE)
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_every_message_round_trips(cls: type[simwire.Message], data: st.DataObject) -> None:
    message = data.draw(_strategy(cls))
    codec = Codec(ALL_MESSAGES)
    line = codec.encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert codec.decode(line) == message


@pytest.mark.parametrize(
    ("line", "match"),
    [
        (b"{", "not JSON"),
        (b"[]", "JSON object"),
        (b'{"device": 0}', 'no "type"'),
        (b'{"type": "attach"}', "not served here"),
        (b'{"type": "alloc", "device": 0}', "missing field 'nbytes'"),
        (b'{"type": "alloc", "device": 0, "nbytes": true}', "alloc.nbytes: expected an integer"),
        (b'{"type": "alloc", "device": 0, "nbytes": 1.5}', "alloc.nbytes: expected an integer"),
        (b'{"type": "alloc", "device": 0, "nbytes": 1, "as": "x"}', "unknown field"),
        (b'{"type": "kernel", "device": 0, "seconds": "1"}', "kernel.seconds: expected a number"),
        (b'{"type": "hello", "token": 7}', "hello.token: expected a string"),
    ],
)
def test_malformed_client_requests_are_refused_with_the_field_named(line: bytes, match: str) -> None:
    with pytest.raises(WireError, match=match):
        simwire.CLIENT_REQUEST_CODEC.decode(line, "request")


def test_nested_fields_are_checked_with_their_path() -> None:
    bad = {
        "type": "attach",
        "spec": {"name": "a", "gpus": [{"gpu": "0", "hard_limit_mib": "1", "guarantee_mib": 1}]},
    }
    with pytest.raises(WireError, match=r"attach\.spec\.gpus\[0\]\.hard_limit_mib"):
        messages.ADMIN_REQUEST_CODEC.decode(json.dumps(bad).encode())


def test_an_attach_carries_the_shared_fault_domain_and_an_older_attach_without_it_means_no() -> None:
    spec = messages.ClientSpec(
        "a", (messages.ClientGpuSpec("0", 2, 1),), "time-slicing", {}, shared_fault_domain=True
    )
    codec = messages.ADMIN_REQUEST_CODEC
    assert codec.decode(codec.encode(messages.Attach(spec))) == messages.Attach(spec)
    older = {
        "type": "attach",
        "spec": {"name": "a", "gpus": [{"gpu": "0", "hard_limit_mib": 2, "guarantee_mib": 1}]},
    }
    decoded = codec.decode(json.dumps(older).encode())
    assert isinstance(decoded, messages.Attach) and decoded.spec.shared_fault_domain is False


def test_error_replies_raise_their_own_exception_type() -> None:
    reply = simwire.OomReply(
        message="m", device=0, requested_bytes=1, used_bytes=2, limit_bytes=2, reason=simwire.OOM_HARD_LIMIT
    )
    with pytest.raises(simwire.SimOutOfMemory) as exc:
        simwire.expect_reply(reply, simwire.AllocReply)
    assert exc.value.reply is reply
    assert set(simwire.EXCEPTION_FOR_REPLY) == set(simwire.ERROR_REPLIES)
