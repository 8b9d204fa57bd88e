"""NATS helpers: connecting, and JSON request/reply with gpuledger's error envelope.

A reply is ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": {"code", "message"}}``,
where ``code`` is one of the codes in ``gpuledger_core.errors``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import ssl
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import nats
import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import AuthorizationError, NoRespondersError, SecureConnRequiredError
from nats.errors import TimeoutError as NatsTimeout

from gpuledger_common.natscreds import NONE, NatsCredentials
from gpuledger_common.settings import SettingsError, nats_servers, redact_url
from gpuledger_common.tasks import cancelled
from gpuledger_core import codec
from gpuledger_core.errors import FailedPrecondition, GpuledgerError, InvalidArgument, Unavailable, from_code

log = logging.getLogger(__name__)

SUBJECT_PREFIX = "gpuledger.v1"
Handler = Callable[[Any], Awaitable[Any]]
DRAIN_S = 5  # a stopping service's last messages: bounded well inside a pod's grace period (30 s)
SUBSCRIBED_S = 5  # how long a service waits for the server to confirm its subscriptions


class _AfterReply:
    """What waits for the answer to the request being handled: ``later`` runs once it is sent."""

    __slots__ = ("later", "replied")

    def __init__(self) -> None:
        self.later: list[Callable[[], None]] = []
        self.replied = False


_ANSWERING: contextvars.ContextVar[_AfterReply | None] = contextvars.ContextVar("answering", default=None)


def after_reply(work: Callable[[], None]) -> bool:
    """Run ``work`` once the request being handled in this context has its answer (True), or
    say there is none (False: the caller runs it now). Tasks the handler starts share its
    context; once the answer is out, later work is not held back."""
    answering = _ANSWERING.get()
    if answering is None or answering.replied:
        return False
    answering.later.append(work)
    return True


@contextlib.contextmanager
def answering() -> Iterator[Callable[[], None]]:
    """A request handled in this context: yields the call that runs what waited for its answer
    (call it once the answer is sent; it also runs on the way out, if not called before)."""
    answer = _AfterReply()
    token = _ANSWERING.set(answer)

    def replied() -> None:
        if answer.replied:
            return
        answer.replied = True
        for work in answer.later:
            try:
                work()
            except Exception:  # one failed follow-up must not keep the others back
                log.exception("work after a reply failed")
        answer.later.clear()

    try:
        yield replied
    finally:
        _ANSWERING.reset(token)
        replied()


async def connect(
    servers: str,
    name: str,
    *,
    connect_timeout: float = 5.0,
    stop: asyncio.Event | None = None,
    credentials: NatsCredentials = NONE,
) -> Client:
    """Connect to one of ``servers`` (a URL or a comma-separated list of them, as the
    ``nats_url`` setting has it), trying them in turn until one answers, and keep reconnecting
    forever, to any of them, if the server goes away later. Logs name the server actually
    reached, never the configured list alone. ``stop`` set while no server has answered yet
    ends the wait with ``Unavailable`` (a service told to stop while NATS is away).
    ``credentials``: the user, its password file and TLS (see ``natscreds``)."""
    try:
        pool = list(nats_servers(servers))
        options = credentials.connect_options()
    except SettingsError as err:
        field, _, problem = str(err).partition(": ")
        raise InvalidArgument(field, problem) from None
    shown = redact_url(",".join(pool))
    clients: list[Client] = []  # the client, once connected (the callbacks need it)
    last = ""  # the server of the current (or last) connection, as logs show it

    refused: list[Exception] = []  # a server turned the credentials down before any connection
    refusing = asyncio.Event()

    async def on_error(err: Exception) -> None:
        log.warning("nats error: %s", err)
        if not clients and refusal(err):
            refused.append(err)
            refusing.set()

    async def on_disconnect() -> None:
        if clients and clients[0].is_reconnecting:
            log.info("nats disconnected from %s; reconnecting to one of %s", last or "NATS", shown)
        else:
            log.info("nats disconnected from %s", last or "NATS")

    async def on_reconnect() -> None:
        nonlocal last
        last = server_of(clients[0]) if clients else ""
        log.info("nats reconnected to %s", last or "NATS")

    try:
        connecting = nats.connect(
            servers=pool,
            name=name,
            connect_timeout=connect_timeout,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            allow_reconnect=True,
            drain_timeout=DRAIN_S,
            error_cb=on_error,
            disconnected_cb=on_disconnect,
            reconnected_cb=on_reconnect,
            **options,
        )
        nc = await _unless_stopped(connecting, stop, shown, refusing)
    except Refused:
        raise Unavailable(f"NATS at {shown} refused this client: {refused[0]}") from refused[0]
    except Unavailable:
        raise
    except Exception as err:  # nats raises several unrelated types on a failed first connect
        raise Unavailable(f"cannot connect to NATS at {shown}: {err}") from err
    clients.append(nc)
    last = server_of(nc)
    log.info("nats connected to %s (of %s)", last, shown)
    return nc


class Refused(Exception):
    """A server refused the client's credentials or TLS: trying again will not help."""


def refusal(err: Exception) -> bool:
    """Whether ``err`` is a refusal that no retry mends (wrong user or password, a server
    certificate the CA does not vouch for, TLS required and not offered)."""
    if isinstance(err, (AuthorizationError, SecureConnRequiredError, ssl.SSLCertVerificationError)):
        return True
    text = str(err).lower()
    return "authorization violation" in text or "certificate verify failed" in text


async def _unless_stopped(
    connecting: Awaitable[Client], stop: asyncio.Event | None, shown: str, refusing: asyncio.Event
) -> Client:
    """The connection, unless ``stop`` is set (``Unavailable``) or a server refuses the
    credentials (``Refused``) first."""
    attempt = asyncio.ensure_future(connecting)
    waits = [asyncio.ensure_future(refusing.wait())]
    if stop is not None:
        waits.append(asyncio.ensure_future(stop.wait()))
    await asyncio.wait({attempt, *waits}, return_when=asyncio.FIRST_COMPLETED)
    for wait in waits:
        wait.cancel()
    if not attempt.done():
        await cancelled(attempt)  # nats-py's connect loop can lose one cancellation
        if not attempt.cancelled() and attempt.exception() is None:
            await attempt.result().close()  # it connected just as it was told to stop
        if refusing.is_set():
            raise Refused()
        raise Unavailable(f"stopped before any NATS server of {shown} answered")
    return attempt.result()


async def subscribed(nc: Client) -> None:
    """Wait until the server has every subscription this client made so far (a PING answered
    after them), so that a service reports itself ready only once messages reach it. While NATS is
    away nothing is waited for: the client subscribes again when it reconnects."""
    if not nc.is_connected:
        return
    try:
        await nc.flush(timeout=SUBSCRIBED_S)
    except Exception as err:  # lost meanwhile: the reconnect subscribes again
        log.info("NATS did not confirm the subscriptions (%s); they are made again on reconnect", err)


def server_of(nc: Client) -> str:
    """The server the client is connected to now, password hidden; empty while disconnected."""
    url = nc.connected_url
    return redact_url(url.geturl()) if url is not None else ""


def encode(value: Any) -> bytes:
    """Compact JSON (orjson: the ledger's values and every request and reply pass through here)."""
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)


def decode(data: bytes, what: str = "body") -> Any:
    try:
        return orjson.loads(data)
    except ValueError as err:
        raise InvalidArgument(what, f"not valid JSON: {err}") from err


async def request(nc: Client, subject: str, payload: Any, timeout: float = 5.0) -> Any:
    """Send a JSON request (an object gets the ``schema`` it is written in); return the result
    or raise the error the responder reported."""
    if isinstance(payload, dict) and "schema" not in payload:
        payload = {"schema": codec.SCHEMA, **payload}
    try:
        msg = await nc.request(subject, encode(payload), timeout=timeout)
    except NoRespondersError as err:
        raise Unavailable(f"nobody serves {subject}") from err
    except NatsTimeout as err:
        raise Unavailable(f"no answer on {subject} within {timeout:g}s") from err
    except Exception as err:  # connection closed, reconnecting, ...
        raise Unavailable(f"cannot reach NATS for {subject}: {err}") from err
    reply = decode(msg.data, "reply")
    if not isinstance(reply, dict) or "ok" not in reply:
        raise GpuledgerError(f"malformed reply on {subject}")
    if reply["ok"]:
        return reply.get("result")
    error = reply.get("error") or {}
    raise from_code(str(error.get("code", "internal")), str(error.get("message", "unknown error")))


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether ``subject`` is one that a subscription to ``pattern`` (``*``, ``>``) asked for."""
    want, got = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(got) > i
        if i >= len(got) or (token != "*" and token != got[i]):
            return False
    return len(got) == len(want)


def error_reply(err: Exception) -> dict[str, Any]:
    if isinstance(err, GpuledgerError):
        return {"ok": False, "error": {"code": err.code, "message": str(err)}, "schema": codec.SCHEMA}
    return {"ok": False, "error": {"code": "internal", "message": f"internal error: {err}"}, "schema": codec.SCHEMA}


class Responder:
    """Answers JSON requests on one subject, many at a time (up to ``concurrency``).

    nats-py runs a subscription's callbacks one after another; each request here gets its own
    task, owned by this object: ``close()`` stops taking requests and waits for those in flight.
    """

    def __init__(self, nc: Client, subject: str, handler: Handler, queue: str = "", concurrency: int = 64) -> None:
        self.nc, self.subject, self.handler, self.queue = nc, subject, handler, queue
        self._slots = asyncio.Semaphore(concurrency)
        self._tasks: set[asyncio.Task[None]] = set()
        self._sub: Subscription | None = None

    async def start(self) -> Responder:
        self._sub = await self.nc.subscribe(self.subject, queue=self.queue, cb=self._on_msg)
        await subscribed(self.nc)
        return self

    async def _on_msg(self, msg: Msg) -> None:
        if not subject_matches(self.subject, msg.subject):
            # A JetStream consumer made to deliver a stream's messages here (anyone allowed to
            # make one can aim it anywhere) keeps the stream's subject: not a request to us.
            log.warning("ignoring a message on %s delivered to %s", msg.subject, self.subject)
            return
        await self._slots.acquire()
        task = asyncio.create_task(self._answer(msg))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    async def _answer(self, msg: Msg) -> None:
        with answering() as replied:  # the ledger's events wait until the answer is on its way
            try:
                result = await self.handler(decode(msg.data))
                body = {"ok": True, "result": result, "schema": codec.SCHEMA}
            except GpuledgerError as err:
                body = error_reply(err)
            except Exception as err:
                log.exception("handler for %s failed", self.subject)
                body = error_reply(err)
            if msg.reply:
                data = self._fitting(encode(body))
                with contextlib.suppress(Exception):  # the asker may be gone; nothing to tell
                    await msg.respond(data)
            replied()

    def _fitting(self, data: bytes) -> bytes:
        """The answer, or a refusal that says why when it is over the server's ``max_payload``
        (nats-py refuses to publish it, and the asker would only have timed out)."""
        limit = self.nc.max_payload
        if not limit or len(data) <= limit:
            return data
        log.warning("an answer on %s is %d bytes, over the server's max_payload of %d", self.subject, len(data), limit)
        too_big = FailedPrecondition(
            f"the answer is {len(data):,} bytes, over the NATS server's max_payload of {limit:,}: "
            "ask for less (one node, one owner, or a smaller page_size)"
        )
        return encode(error_reply(too_big))

    async def close(self, timeout: float = 5.0) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
