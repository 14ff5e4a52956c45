"""The wire protocol of the simulated GPU device: typed messages, their JSON-lines codec, the transport.

Both ends of the simulated device import this one module: the device server on the node side
(``enforcement.sim``) and the clients inside simulated containers (``workloads.simclient``, the
simulated ``nvidia-smi``). It lives in ``workloads/`` rather than ``enforcement/`` because the
workload image carries nothing but the standard library and the ``workloads`` package; the node
side can always import the workload package (they ship in one distribution), the reverse is not
true. For the same reason it imports only the standard library.

Every request, reply and error is a frozen dataclass with a ``TYPE`` tag. On the wire a message is
one JSON object per line, ``{"type": TAG, **fields}``. A ``Codec`` is built from the explicit list
of message classes one socket serves, so a request that socket does not serve (an admin request
sent to the client socket, for instance) cannot even be decoded there. Decoding checks field names
and types against the dataclass annotations, so a malformed message is refused at the boundary
with a message naming the field, instead of surfacing later as an ``AttributeError``.

Errors travel as replies (``OomReply``, ``PressureReply``, ...); ``raise_for_reply`` turns one into
the matching ``SimError`` subclass on the client side, and the device model raises those same
exceptions in process, so in-process tests and socket clients see identical errors.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import threading
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from .plan import MiB as MiB  # the one definition; re-exported for the wire's users

# Environment of a simulated container. The node agent injects both; nothing else names them.
SIM_SOCKET_ENV = "GPUCONF_SIM_SOCKET"  # path of the node's client socket
SIM_TOKEN_ENV = "GPUCONF_SIM_TOKEN"  # the token the node side issued when it attached this container

PROTOCOL_VERSION = 1
# A message is a few hundred bytes; a snapshot of a busy node a few hundred KiB. Anything bigger is
# a broken or hostile peer, and reading it whole would let one client exhaust the server's memory.
MAX_LINE_BYTES = 4 << 20


COMPUTE_MODES = ("time-slicing", "sm-sharing")


class WireError(Exception):
    """A message that is not valid for the protocol: bad JSON, unknown type, wrong field."""


# --------------------------------------------------------------------------------------------------
# Messages
#
# Both sides declare their messages with the two declarators below, so that what a message is (a
# frozen dataclass, its wire tag set once, in its declaration) is written in one place: the node
# side's admin messages (``enforcement.sim.messages``) are declared exactly as the client's.

_T = TypeVar("_T")


@typing.dataclass_transform(frozen_default=True)
def record(cls: type[_T]) -> type[_T]:
    """Declare a plain value carried inside messages: a frozen dataclass."""
    return dataclass(frozen=True)(cls)


@typing.dataclass_transform(frozen_default=True)
def message(tag: str) -> Callable[[type[_T]], type[_T]]:
    """Declare a message: a frozen dataclass whose ``TYPE``, the tag on the wire, is ``tag``."""

    def declare(cls: type[_T]) -> type[_T]:
        cls.TYPE = tag  # type: ignore[attr-defined]
        return dataclass(frozen=True)(cls)

    return declare


@record
class Message:
    """Base of every message; subclasses set ``TYPE``, the tag written on the wire."""

    TYPE: ClassVar[str] = ""


# Client requests (the client socket serves these and nothing else).


@message("hello")
class Hello(Message):
    """First message of every client connection: binds the connection to the client the token names.

    The connection then plays the role of a CUDA context: allocations belong to it and are released
    when it closes, which is how a client that dies without freeing gets its memory back.
    """

    token: str
    protocol: int = PROTOCOL_VERSION
    cuda: bool = True
    """A CUDA process (its context costs device memory in the h200 fidelity); the simulated
    nvidia-smi asks through NVML and sends False."""


@message("alloc")
class Alloc(Message):
    device: int  # container-visible ordinal
    nbytes: int


@message("free")
class Free(Message):
    handle: int


TOUCH_PATTERN = 0xA5
"""The byte ``touch`` writes when the workload names none."""


@message("touch")
class Touch(Message):
    """Write ``pattern`` into every byte of an allocation (the device records what it holds)."""

    handle: int
    pattern: int = TOUCH_PATTERN


@message("verify")
class Verify(Message):
    """Read an allocation back and count the bytes that are not ``pattern`` (``cudaMemcpy`` to the host)."""

    handle: int
    pattern: int


@message("meminfo")
class MemInfo(Message):
    """Ask for the client's view of its devices (``cudaMemGetInfo``, NVML)."""


@message("kernel")
class Kernel(Message):
    """Run one busy kernel for ``seconds`` on a device; the reply carries when it really ran."""

    device: int
    seconds: float  # how long the kernel takes alone on a GPU it does not fill
    sm_fraction: float = 1.0  # the share of the GPU's SMs it occupies (h200 cost model)
    streams: int = 1  # copies run at once on streams of this context (a calibration asks for 2)


@message("inject-fault")
class Fault(Message):
    """Make the device fault as an out-of-bounds kernel would (illegal address)."""

    device: int


# Client replies.


@record
class VisibleDevice:
    ordinal: int
    uuid: str
    name: str
    total_bytes: int  # the client's hard limit on this device: what its NVML shows as total
    guarantee_bytes: int


@message("hello-reply")
class HelloReply(Message):
    """The device's answer to a client's hello: who the client is and the devices it may use."""

    client: str
    node: str
    mode: str
    devices: tuple[VisibleDevice, ...]
    simulated: bool = True
    fidelity: str = "ideal"  # how closely the device imitates a real GPU: ideal, h200
    context_bytes: int = 0  # the device memory each CUDA process's context costs (h200)
    granularity_bytes: int = 1  # every allocation is charged in whole pages of this size


@message("alloc-reply")
class AllocReply(Message):
    handle: int
    device: int
    nbytes: int
    used_bytes: int  # the client's usage on that device after the allocation


@message("free-reply")
class FreeReply(Message):
    handle: int
    device: int
    nbytes: int
    used_bytes: int


@message("touch-reply")
class TouchReply(Message):
    handle: int
    nbytes: int


@message("verify-reply")
class VerifyReply(Message):
    handle: int
    nbytes: int
    mismatched_bytes: int
    """Bytes that do not hold the pattern asked about: never written with it, or overwritten since."""


@record
class DeviceMemory:
    ordinal: int
    uuid: str
    name: str
    total_bytes: int
    used_bytes: int
    free_bytes: int


@message("meminfo-reply")
class MemInfoReply(Message):
    devices: tuple[DeviceMemory, ...]


@message("kernel-reply")
class KernelReply(Message):
    device: int
    start: float  # wall-clock (time.time) when the kernel got the device
    end: float
    waited_s: float  # time spent queued behind other clients' kernels (time-slicing)
    shared_s: float = 0.0  # time during which another client's kernel ran on the same GPU
    work_s: float = 0.0  # the work done: solo kernel-seconds, times streams


# Error replies: any socket may send these.


@record
class ErrorReply(Message):
    message: str


@message("oom")
class OomReply(ErrorReply):
    """Out of memory. ``reason`` is one of ``OOM_REASONS``."""

    device: int
    requested_bytes: int
    used_bytes: int  # the client's usage on the device when the allocation was refused
    limit_bytes: int  # the client's hard limit on the device
    reason: str


OOM_HARD_LIMIT = "hard-limit"  # the allocation would cross the client's hard limit
OOM_DEVICE_FULL = "device-full"  # the GPU has no free memory and the client is beyond its guarantee
# Within its guarantee on a full GPU, but no other client is above its guarantee: the guarantees on
# this GPU add up to more than it holds, which only an overcommitting scheduler can cause.
OOM_GUARANTEE_UNSATISFIABLE = "guarantee-unsatisfiable"
OOM_REASONS = (OOM_HARD_LIMIT, OOM_DEVICE_FULL, OOM_GUARANTEE_UNSATISFIABLE)


@message("pressure")
class PressureReply(ErrorReply):
    """Refused for now: the GPU is full, the client is within its guarantee, others must be evicted.

    The device records the pressure (the node agent's evictor reads it over the admin socket) and
    refuses rather than blocking; the client retries after the candidates have been evicted.
    """

    device: int
    uuid: str
    requested_bytes: int
    used_bytes: int
    guarantee_bytes: int
    shortfall_bytes: int
    candidates: tuple[str, ...]  # clients above their guarantee on this GPU, largest overage first


@message("fault")
class FaultReply(ErrorReply):
    """A sticky device fault: every later call of this client fails the same way, as in CUDA."""

    device: int
    uuid: str
    origin: str  # the client whose kernel faulted


@message("gone")
class GoneReply(ErrorReply):
    """The client was detached (container stopped) or evicted; its memory is gone."""

    reason: str


@message("denied")
class DeniedReply(ErrorReply):
    """Bad token, or an operation this socket does not serve to this peer."""


@message("bad-request")
class BadRequestReply(ErrorReply):
    """The request was not valid on this socket (unknown type, wrong field, no hello)."""


@message("mode-conflict")
class ModeConflictReply(ErrorReply):
    """A GPU holding clients of one compute mode was asked to take a client of the other mode."""

    uuid: str
    client: str
    mode: str
    other_client: str
    other_mode: str


@message("internal-error")
class InternalErrorReply(ErrorReply):
    """The device server failed while serving the request; a bug on the node side."""


ERROR_REPLIES: tuple[type[ErrorReply], ...] = (
    OomReply,
    PressureReply,
    FaultReply,
    GoneReply,
    DeniedReply,
    BadRequestReply,
    ModeConflictReply,
    InternalErrorReply,
)
CLIENT_REQUESTS: tuple[type[Message], ...] = (Hello, Alloc, Free, Touch, Verify, MemInfo, Kernel, Fault)
CLIENT_REPLIES: tuple[type[Message], ...] = (
    HelloReply,
    AllocReply,
    FreeReply,
    TouchReply,
    VerifyReply,
    MemInfoReply,
    KernelReply,
    *ERROR_REPLIES,
)


# --------------------------------------------------------------------------------------------------
# Exceptions: one per error reply, so callers catch what they mean.


class SimError(Exception):
    """An error reply from the simulated device, raised. ``reply`` holds the typed details."""

    reply: ErrorReply

    def __init__(self, reply: ErrorReply) -> None:
        super().__init__(reply.message)
        self.reply = reply


class SimOutOfMemory(SimError):
    reply: OomReply


class SimPressure(SimError):
    reply: PressureReply


class SimFault(SimError):
    reply: FaultReply


class SimGone(SimError):
    reply: GoneReply


class SimDenied(SimError):
    reply: DeniedReply


class SimBadRequest(SimError):
    reply: BadRequestReply


class SimModeConflict(SimError):
    reply: ModeConflictReply


class SimInternalError(SimError):
    reply: InternalErrorReply


class SimConnectionError(Exception):
    """The device socket could not be reached, or the server went away mid-conversation."""


EXCEPTION_FOR_REPLY: Mapping[type[ErrorReply], type[SimError]] = {
    OomReply: SimOutOfMemory,
    PressureReply: SimPressure,
    FaultReply: SimFault,
    GoneReply: SimGone,
    DeniedReply: SimDenied,
    BadRequestReply: SimBadRequest,
    ModeConflictReply: SimModeConflict,
    InternalErrorReply: SimInternalError,
}


def error(reply: ErrorReply) -> SimError:
    """The exception that carries ``reply``; ``raise error(OomReply(...))`` reads as it should."""
    return EXCEPTION_FOR_REPLY[type(reply)](reply)


M = TypeVar("M", bound=Message)


def expect_reply(reply: Message, expected: type[M]) -> M:
    """Return ``reply`` if it is an ``expected``; raise the matching ``SimError`` if it is an error."""
    if isinstance(reply, ErrorReply):
        raise error(reply)
    if not isinstance(reply, expected):
        raise WireError(f"expected a {expected.TYPE!r} reply, got {reply.TYPE!r}")
    return reply


# --------------------------------------------------------------------------------------------------
# Codec


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def to_plain(value: Any) -> Any:
    """A dataclass tree as JSON-ready builtins (faster than ``dataclasses.asdict``: no deep copies)."""
    names = _FIELD_NAMES.get(type(value))
    if names is None and dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = _FIELD_NAMES[type(value)] = tuple(f.name for f in dataclasses.fields(value))
    if names is not None:
        return {name: to_plain(getattr(value, name)) for name in names}
    if isinstance(value, list | tuple):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    return value


# Decoding checks every value against its annotation. The checks are compiled once per type into a
# converter, ``(value, where) -> value``, because a message is decoded on every call of every client.
Converter = Callable[[Any, str], Any]
_CONVERTERS: dict[Any, Converter] = {}


def _kind_error(where: str, expected: str, value: Any) -> WireError:
    return WireError(f"{where}: expected {expected}, got {value!r}"[:300])


def _to_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _kind_error(where, "an integer", value)
    return value


def _to_float(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _kind_error(where, "a number", value)
    return float(value)


def _to_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _kind_error(where, "a string", value)
    return value


def _to_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise _kind_error(where, "true/false", value)
    return value


_PRIMITIVES: dict[Any, Converter] = {int: _to_int, float: _to_float, str: _to_str, bool: _to_bool}


def _compile(tp: Any) -> Converter:
    if tp in _PRIMITIVES:
        return _PRIMITIVES[tp]
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        inner_types = [a for a in args if a is not type(None)]
        if len(inner_types) != 1 or type(None) not in args:
            raise TypeError(f"unsupported union {tp!r}: only X | None")
        inner = converter(inner_types[0])
        return lambda v, where: None if v is None else inner(v, where)
    if origin is tuple:
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"unsupported tuple {tp!r}: only tuple[X, ...]")
        item = converter(args[0])

        def to_tuple(v: Any, where: str) -> tuple[Any, ...]:
            if not isinstance(v, list):
                raise _kind_error(where, "a list", v)
            return tuple(item(x, f"{where}[{i}]") for i, x in enumerate(v))

        return to_tuple
    if origin is dict:
        key, val = converter(args[0]), converter(args[1])

        def to_dict(v: Any, where: str) -> dict[Any, Any]:
            if not isinstance(v, dict):
                raise _kind_error(where, "an object", v)
            return {key(k, where): val(x, f"{where}.{k}") for k, x in v.items()}

        return to_dict
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):

        def to_dataclass(v: Any, where: str) -> Any:
            if not isinstance(v, dict):
                raise _kind_error(where, "an object", v)
            return build(tp, v, where)

        return to_dataclass
    raise TypeError(f"unsupported field type {tp!r}")


def converter(tp: Any) -> Converter:
    """The (cached) converter for annotated type ``tp``."""
    conv = _CONVERTERS.get(tp)
    if conv is None:
        conv = _CONVERTERS[tp] = _compile(tp)
    return conv


_FIELDS: dict[type, tuple[tuple[str, Converter, bool], ...]] = {}


def _fields(cls: type) -> tuple[tuple[str, Converter, bool], ...]:
    spec = _FIELDS.get(cls)
    if spec is None:
        hints = typing.get_type_hints(cls)
        spec = _FIELDS[cls] = tuple(
            (
                f.name,
                converter(hints[f.name]),
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            )
            for f in dataclasses.fields(cls)
        )
    return spec


def build(cls: type[Any], data: Mapping[str, Any], where: str = "") -> Any:
    """Construct dataclass ``cls`` from a mapping; unknown or missing fields are errors."""
    spec = _fields(cls)
    prefix = f"{where}." if where else ""
    kwargs = {}
    for name, conv, required in spec:
        if name in data:
            kwargs[name] = conv(data[name], prefix + name)
        elif required:
            raise WireError(f"{where or cls.__name__}: missing field {name!r}")
    if len(kwargs) != len(data):
        unknown = sorted(set(data) - {name for name, _c, _r in spec})
        raise WireError(f"{where or cls.__name__}: unknown field(s) {', '.join(unknown)}")
    return cls(**kwargs)


class Codec:
    """Encodes any message; decodes only the message types it was built with."""

    def __init__(self, message_types: Iterable[type[Message]]) -> None:
        self._types: dict[str, type[Message]] = {}
        for t in message_types:
            if not t.TYPE:
                raise ValueError(f"{t.__name__} has no TYPE tag")
            if t.TYPE in self._types:
                raise ValueError(f"duplicate message type tag {t.TYPE!r}")
            self._types[t.TYPE] = t

    def knows(self, tag: str) -> bool:
        return tag in self._types

    @staticmethod
    def encode(message: Message) -> bytes:
        plain = to_plain(message)
        plain["type"] = message.TYPE
        return json.dumps(plain, separators=(",", ":")).encode() + b"\n"

    def decode(self, line: bytes, what: str = "message") -> Message:
        try:
            data = json.loads(line)
        except (UnicodeDecodeError, ValueError) as exc:
            raise WireError(f"{what} is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise WireError(f"{what} must be a JSON object")
        tag = data.pop("type", None)
        if not isinstance(tag, str):
            raise WireError(f'{what} has no "type"')
        cls = self._types.get(tag)
        if cls is None:
            raise WireError(f"{what} type {tag!r} is not served here")
        return build(cls, data, tag)


CLIENT_REQUEST_CODEC = Codec(CLIENT_REQUESTS)
CLIENT_REPLY_CODEC = Codec(CLIENT_REPLIES)


# --------------------------------------------------------------------------------------------------
# Transport


class Connection:
    """One Unix-socket connection carrying request/reply pairs, one at a time.

    A lock serialises requests so that threads sharing a connection cannot interleave lines. The
    connection remembers the pid that opened it: after ``fork`` the child must not write on its
    parent's socket (both would read each other's replies), so callers check ``owned_by_me``.
    """

    def __init__(self, path: str, reply_codec: Codec, timeout: float | None = None) -> None:
        self.path = path
        self._codec = reply_codec
        self._lock = threading.Lock()
        self.pid = os.getpid()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError as exc:
            sock.close()
            raise SimConnectionError(f"cannot connect to the simulated GPU device at {path}: {exc}") from None
        self._sock = sock
        self._reader = sock.makefile("rb")

    @property
    def owned_by_me(self) -> bool:
        return self.pid == os.getpid()

    def request(self, message: Message) -> Message:
        data = Codec.encode(message)
        with self._lock:
            try:
                self._sock.sendall(data)
                line = self._reader.readline(MAX_LINE_BYTES + 1)
            except OSError as exc:
                raise SimConnectionError(f"simulated GPU device at {self.path}: {exc}") from None
        if not line:
            raise SimConnectionError(f"simulated GPU device at {self.path} closed the connection")
        if len(line) > MAX_LINE_BYTES:
            raise SimConnectionError(f"simulated GPU device at {self.path} sent an oversized reply")
        return self._codec.decode(line, "reply")

    def close(self) -> None:
        try:
            self._reader.close()
        finally:
            self._sock.close()
