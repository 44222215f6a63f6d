"""Alternatives measured against what Healthplane uses, each beside its baseline in the same run
(docs/benchmarks.md, "Alternatives measured"):

1. consuming and acking from a JetStream durable consumer: faststream's NATS pull subscriber
   (``@broker.subscriber(..., stream=..., pull_sub=PullSub(batch_size=...))``, raw bytes in,
   its ack after the handler) against the shared pull loop (``PullLoop``) at the same batch
   size, for small records and for 4.3 KiB health reports: messages/s and client CPU per
   message, best of 3, the two taking turns on one server;
2. decoding a 4.3 KiB health report: msgspec (``wire.decode``) against a pydantic v2
   ``TypeAdapter`` over the same shape (generated from the wire Structs), best of 5 runs.

faststream is a bench-only extra (``pip install -e '.[bench]'``); without it the file skips.
"""

from __future__ import annotations

import asyncio
import time
import types
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Union, get_args, get_origin

import msgspec
import pydantic
import pytest
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig

from healthplane.contracts import wire
from healthplane.runtime.pull import Delivery, PullLoop
from healthplane.stack.natsserver import NatsServer
from healthplane_collector.agent import Collector, Settings
from healthplane_collector.sim import SimNode
from tests.bench import harness
from tests.bench.bus import CpuMeter, publish_all

faststream = pytest.importorskip(
    "faststream", reason="faststream is not installed: it is the bench-only extra, pip install -e '.[bench]'")
from faststream import AckPolicy as FsAckPolicy  # noqa: E402
from faststream.nats import JStream, NatsBroker, PullSub  # noqa: E402

# In-process services run as the test's own identity: on an open server, as the other
# component benches (what identities cost is tests/bench/test_auth_pipeline.py's).
pytestmark = pytest.mark.insecure

BATCH = 512  # what the services pull with (Processor batch=512)
ROUNDS = 3
# Whole batches (98 and 39 of 512): faststream's batch mode waits out ``PullSub.timeout`` (5 s)
# for a last, partial batch, which would be measured as throughput.
SMALL = 98 * BATCH  # 50,176
REPORTS = 39 * BATCH  # 19,968
T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
RUN_TIMEOUT_S = 600.0


# ---------------------------------------------------------------------------- payloads


async def _report_template() -> wire.HealthReport:
    """One collector's report of a simulated 8-GPU node (4.3 KiB), as in test_health_ingest."""
    node = SimNode("template")
    collector = Collector(Settings(node_id="template", cluster="bench", interval_s=3600), node, node.kmsg)
    collector.refresh_inventory()
    return await collector.collect("scheduled", T0)


def _reports(template: wire.HealthReport, count: int, prefix: str) -> list[tuple[str, bytes]]:
    fields = {f: getattr(template, f) for f in template.__struct_fields__}
    out = []
    for i in range(count):
        node_id = f"cn-{i:06d}"
        out.append((f"{prefix}.{node_id}", wire.encode(wire.HealthReport(
            **{**fields, "node_id": node_id, "hostname": node_id, "sent_at": T0 + timedelta(seconds=i)}))))
    return out


def _events(count: int, prefix: str) -> list[tuple[str, bytes]]:
    """Small records: CONDITION_RAISED node events as health-ingest emits them (~350 B)."""
    out = []
    for i in range(count):
        node_id = f"cn-{i % 10_000:06d}"
        when = T0 + timedelta(milliseconds=i)
        out.append((f"{prefix}.{node_id}", wire.encode(wire.NodeEvent(
            id=f"CONDITION_RAISED:{node_id}:{when.timestamp()}", node_id=node_id, cluster="bench",
            type="CONDITION_RAISED", occurred_at=when, message="Xid 79 on GPU 0 (fallen off the bus)",
            actor="health-ingest", condition=wire.ConditionChange(
                type="gpu_xid_errors", reason="GpuXidHardware", severity="critical",
                message="Xid 79 on GPU 0000:18:00.0")))))
    return out


# ---------------------------------------------------------------------------- consume and ack


async def _add_consumer(js: JetStreamContext, stream: str, durable: str) -> None:
    await js.add_consumer(stream, ConsumerConfig(durable_name=durable, ack_policy=AckPolicy.EXPLICIT,
                                                 max_ack_pending=20_000))


async def _pull_loop_run(nc, js: JetStreamContext, server: NatsServer, stream: str, count: int,  # type: ignore[no-untyped-def]
                         durable: str) -> tuple[float, tuple[float, float]]:
    """(messages/s, (client, server) CPU µs per message) of the shared pull loop receiving and
    acking every message of ``stream`` from a fresh durable consumer, doing nothing else."""
    await _add_consumer(js, stream, durable)
    seen, done = 0, asyncio.Event()

    async def handle(deliveries: list[Delivery]) -> None:
        nonlocal seen
        seen += len(deliveries)
        if seen >= count:
            done.set()

    loop = PullLoop(nc, stream, durable, handle, batch=BATCH)
    meter = CpuMeter(server).start()
    started = time.perf_counter()
    task = asyncio.create_task(loop.run())
    await asyncio.wait_for(done.wait(), RUN_TIMEOUT_S)
    rate = count / (time.perf_counter() - started)
    cpu = meter.per(count)
    loop.stop()
    await task
    await js.delete_consumer(stream, durable)
    return rate, cpu


async def _raw_body(msg: Any) -> bytes:
    """faststream's decoder replaced: the body as it came, no JSON parse."""
    return msg.body  # type: ignore[no-any-return]


async def _faststream_run(js: JetStreamContext, server: NatsServer, stream: str, subject: str, count: int,
                          durable: str, *, batch: bool) -> tuple[float, tuple[float, float]]:
    """The same through faststream's JetStream pull subscriber: its own connection, the same
    pre-created durable consumer, ``PullSub(batch_size=BATCH)``, raw bytes (the decoder
    replaced), ``AckPolicy.ACK`` (faststream acks each message after the handler returns), no
    access log (``logger=None``: its default logs two lines per message). ``batch=True`` is
    its batch mode: one handler call per fetched batch, every message acked after it."""
    await _add_consumer(js, stream, durable)
    broker = NatsBroker(server.url, logger=None)
    seen, done = 0, asyncio.Event()
    subscriber = broker.subscriber(
        subject, stream=JStream(name=stream, declare=False), durable=durable,
        pull_sub=PullSub(batch_size=BATCH, batch=batch), decoder=_raw_body, ack_policy=FsAckPolicy.ACK)

    if batch:
        @subscriber
        async def handle_batch(body: list[bytes]) -> None:
            nonlocal seen
            seen += len(body)
            if seen >= count:
                done.set()
    else:
        @subscriber
        async def handle(body: bytes) -> None:
            nonlocal seen
            seen += 1
            if seen >= count:
                done.set()

    await broker.connect()
    try:
        meter = CpuMeter(server).start()
        started = time.perf_counter()
        await broker.start()
        await asyncio.wait_for(done.wait(), RUN_TIMEOUT_S)
        rate = count / (time.perf_counter() - started)
        cpu = meter.per(count)
    finally:
        await broker.stop()
    # Every ack reached the server (they are fire-and-forget: give it a moment to apply them).
    for _ in range(100):
        info = await js.consumer_info(stream, durable)
        if info.num_ack_pending == 0 and info.num_pending == 0:
            break
        await asyncio.sleep(0.05)
    await js.delete_consumer(stream, durable)
    assert info.num_ack_pending == 0 and info.num_pending == 0, \
        f"faststream left {info.num_ack_pending} unacked, {info.num_pending} undelivered"
    return rate, cpu


async def _compare_consume(nc, js: JetStreamContext, server: NatsServer, name: str,  # type: ignore[no-untyped-def]
                           payloads: list[tuple[str, bytes]]) -> None:
    stream, prefix = f"ALT_{name.upper()}", f"alt.{name}"
    await js.add_stream(name=stream, subjects=[f"{prefix}.>"])
    await publish_all(nc, payloads)
    count = len(payloads)
    loop_runs, fs_runs, fs_batch_runs = [], [], []
    for round_ in range(ROUNDS):  # taking turns: a load spike on the shared machine hits both
        loop_runs.append(await _pull_loop_run(nc, js, server, stream, count, f"loop{round_}"))
        fs_runs.append(await _faststream_run(js, server, stream, f"{prefix}.>", count, f"fs{round_}", batch=False))
        fs_batch_runs.append(await _faststream_run(js, server, stream, f"{prefix}.>", count, f"fsb{round_}",
                                                   batch=True))
    size = sum(len(p) for _, p in payloads) // count

    def best(runs: list[tuple[float, tuple[float, float]]]) -> tuple[float, float, float]:
        return max(r for r, _ in runs), min(c[0] for _, c in runs), min(c[1] for _, c in runs)

    loop_rate, loop_client, loop_server = best(loop_runs)
    harness.record(f"alt.{name}.pull_loop_consume_ack_{size}B", loop_rate, "msg/s")
    harness.record(f"alt.{name}.pull_loop_client_cpu_per_msg", loop_client, "us")
    harness.record(f"alt.{name}.pull_loop_server_cpu_per_msg", loop_server, "us")
    for variant, runs in (("faststream_pullsub", fs_runs), ("faststream_pullsub_batch", fs_batch_runs)):
        rate, client, server_us = best(runs)
        harness.record(f"alt.{name}.{variant}_consume_ack_{size}B", rate, "msg/s", baseline=loop_rate)
        harness.record(f"alt.{name}.{variant}_client_cpu_per_msg", client, "us", baseline=loop_client)
        harness.record(f"alt.{name}.{variant}_server_cpu_per_msg", server_us, "us", baseline=loop_server)
    await js.delete_stream(stream)


async def test_consume_small_records(nats_server: NatsServer, nc, js: JetStreamContext) -> None:  # type: ignore[no-untyped-def]
    await _compare_consume(nc, js, nats_server, "small", _events(SMALL, "alt.small"))


async def test_consume_health_reports(nats_server: NatsServer, nc, js: JetStreamContext) -> None:  # type: ignore[no-untyped-def]
    await _compare_consume(nc, js, nats_server, "report", _reports(await _report_template(), REPORTS, "alt.report"))


# ---------------------------------------------------------------------------- decode


_MODELS: dict[type, type[pydantic.BaseModel]] = {}
_PYDANTIC_CONFIG = pydantic.ConfigDict(strict=True, frozen=True)  # msgspec's decoders are strict too


def _pydantic_type(tp: Any) -> Any:
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return _pydantic_model(tp)
    origin, args = get_origin(tp), get_args(tp)
    if origin is list:
        return list[_pydantic_type(args[0])]  # type: ignore[misc]
    if origin is dict:
        return dict[_pydantic_type(args[0]), _pydantic_type(args[1])]  # type: ignore[misc]
    if origin in (Union, types.UnionType):
        return Union[tuple(_pydantic_type(a) for a in args)]  # noqa: UP007
    assert origin in (None, Literal), tp
    return tp  # str, int, bool, datetime, None, Literal[...]


def _pydantic_model(struct: type[msgspec.Struct]) -> type[pydantic.BaseModel]:
    """The pydantic v2 model of a wire Struct, field for field: same camelCase keys, types,
    optionality and defaults (a default Struct becomes its model's default instance)."""
    found = _MODELS.get(struct)
    if found is not None:
        return found
    fields: dict[str, Any] = {}
    for f in msgspec.structs.fields(struct):
        kind = _pydantic_type(f.type)
        if f.default is not msgspec.NODEFAULT:
            if isinstance(f.default, msgspec.Struct):
                assert f.default == type(f.default)(), f"{struct.__name__}.{f.name}"
                field = pydantic.Field(default_factory=_pydantic_model(type(f.default)), alias=f.encode_name)
            else:
                field = pydantic.Field(default=f.default, alias=f.encode_name)
        elif f.default_factory is not msgspec.NODEFAULT:
            field = pydantic.Field(default_factory=f.default_factory, alias=f.encode_name)
        else:
            field = pydantic.Field(alias=f.encode_name)
        fields[f.name] = (kind, field)
    model = pydantic.create_model(struct.__name__, __config__=_PYDANTIC_CONFIG, **fields)
    _MODELS[struct] = model
    return model


def _best_us(decode: Callable[[bytes], Any], data: bytes, runs: int = 5, count: int = 20_000) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        for _ in range(count):
            decode(data)
        best = min(best, (time.perf_counter() - started) / count * 1e6)
    return best


async def test_decode_health_report() -> None:
    data = wire.encode(await _report_template())
    adapter = pydantic.TypeAdapter(_pydantic_model(wire.HealthReport))
    decoded = wire.decode(wire.HealthReport, data)
    # The same report, typed: pydantic's object written back decodes to msgspec's.
    assert wire.decode(wire.HealthReport, adapter.dump_json(adapter.validate_json(data), by_alias=True)) == decoded

    msgspec_us = _best_us(lambda d: wire.decode(wire.HealthReport, d), data)
    pydantic_us = _best_us(adapter.validate_json, data)
    harness.record(f"alt.decode.msgspec_health_report_{len(data)}B", msgspec_us, "us")
    harness.record(f"alt.decode.pydantic_health_report_{len(data)}B", pydantic_us, "us", baseline=msgspec_us)
