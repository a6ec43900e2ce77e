"""The loop-lag probe: lag is wake-up minus asked-for time; a stall is put down to GC only when GC took most of it."""

from __future__ import annotations

import asyncio
import gc
import time

from prometheus_client import CollectorRegistry, Counter, Histogram

from fastlane.runtime.stalls import CAUSES, MAX_SITES, STALL, GcPauses, LoopLagProbe, Pause


def instruments() -> tuple[CollectorRegistry, Histogram, Counter, Histogram]:
    registry = CollectorRegistry()
    lag = Histogram("lag_seconds", "", registry=registry)
    stalls = Counter("stalls_total", "", ["cause"], registry=registry)
    pauses = Histogram("gc_seconds", "", ["generation"], registry=registry)
    return registry, lag, stalls, pauses


def test_lag_is_the_wake_up_past_the_interval_and_never_negative() -> None:
    registry, lag, stalls, _ = instruments()
    probe = LoopLagProbe(lag=lag, stalls=stalls, interval=0.005)

    assert abs(probe.observe(asked=10.0, woke=10.0053) - 0.0003) < 1e-9
    assert probe.observe(asked=20.0, woke=20.004) == 0.0  # an early wake-up is no lag
    assert registry.get_sample_value("lag_seconds_count") == 2
    assert registry.get_sample_value("stalls_total", {"cause": "other"}) is None  # neither was a stall


def test_a_stall_is_put_down_to_gc_only_when_collections_took_most_of_it() -> None:
    registry, lag, stalls, _ = instruments()
    pauses = GcPauses()
    probe = LoopLagProbe(lag=lag, stalls=stalls, gc_pauses=pauses, interval=0.005)
    pauses._recent.append(Pause(ended=100.02, seconds=0.018, generation=2))

    probe.observe(asked=100.0, woke=100.025)  # 20 ms late, 18 ms of it collecting
    probe.observe(asked=200.0, woke=200.025)  # 20 ms late, no collection then

    assert registry.get_sample_value("stalls_total", {"cause": "gc"}) == 1
    assert registry.get_sample_value("stalls_total", {"cause": "other"}) == 1
    assert probe.worst[1] == "gc" and abs(probe.worst[0] - 0.020) < 1e-9  # the first of two equal stalls
    assert probe.worst[0] >= STALL


def test_gc_pauses_are_timed_by_generation_through_gc_callbacks() -> None:
    registry, _, _, histogram = instruments()
    pauses = GcPauses(histogram)
    pauses.install()
    try:
        before = time.perf_counter()
        gc.collect(2)
        after = time.perf_counter()
    finally:
        pauses.uninstall()
    assert registry.get_sample_value("gc_seconds_count", {"generation": "2"}) == 1
    assert 0 < pauses.within(before, after) <= after - before
    gc.collect(2)  # uninstalled: no longer counted
    assert registry.get_sample_value("gc_seconds_count", {"generation": "2"}) == 1


def test_a_stall_the_loop_thread_spent_waiting_for_a_cpu_is_put_down_to_cpu_wait() -> None:
    registry, lag, stalls, _ = instruments()
    pauses = GcPauses()
    probe = LoopLagProbe(lag=lag, stalls=stalls, gc_pauses=pauses, interval=0.005)

    probe.observe(asked=1.0, woke=1.025, site="fastlane.x:f", cpu_wait=0.012)  # 20 ms late, 12 waiting for a core
    probe.observe(asked=2.0, woke=2.025, site="fastlane.x:f", cpu_wait=0.004)  # mostly in f itself
    probe.observe(asked=3.0, woke=3.025, cpu_wait=None)  # where the kernel does not say
    pauses._recent.append(Pause(ended=4.02, seconds=0.018, generation=2))
    probe.observe(asked=4.0, woke=4.025, cpu_wait=0.015)  # a collection first: the collector is named

    counts = {cause: registry.get_sample_value("stalls_total", {"cause": cause})
              for cause in ("cpu_wait", "busy", "other", "gc")}
    assert counts == {"cpu_wait": 1, "busy": 1, "other": 1, "gc": 1}


async def test_the_probe_reads_its_loop_threads_run_queue_wait_around_each_sleep(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    class FakeWaits:
        total = 0

        def total_ns(self) -> int:
            return FakeWaits.total

        def close(self) -> None:
            pass

    monkeypatch.setattr("fastlane.runtime.stalls.RunQueueWait", FakeWaits)
    registry, lag, stalls, _ = instruments()
    probe = LoopLagProbe(lag=lag, stalls=stalls, interval=0.001)
    task = asyncio.create_task(probe.run())
    async with asyncio.timeout(10):
        while not registry.get_sample_value("lag_seconds_count"):  # the probe is running
            await asyncio.sleep(0)
    FakeWaits.total += 30_000_000  # the kernel says: 30 ms runnable, not running
    time.sleep(0.03)  # the stimulus: hold the loop meanwhile
    async with asyncio.timeout(10):
        while not registry.get_sample_value("stalls_total", {"cause": "cpu_wait"}):
            await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)

    assert registry.get_sample_value("stalls_total", {"cause": "cpu_wait"}) >= 1
    assert probe.worst[1] == "cpu_wait"


async def test_the_probe_sees_a_blocked_loop() -> None:
    registry, lag, stalls, _ = instruments()
    probe = LoopLagProbe(lag=lag, stalls=stalls, interval=0.001)
    task = asyncio.create_task(probe.run())
    await asyncio.sleep(0.01)
    time.sleep(0.03)  # hold the loop, as a long callback would
    await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)

    assert probe.worst[0] >= 0.025
    assert registry.get_sample_value("stalls_total", {"cause": "other"}) >= 1


async def test_the_watchdog_names_the_function_that_held_the_loop() -> None:
    registry, lag, stalls, _ = instruments()
    sites = Counter("sites_total", "", ["site"], registry=registry)
    probe = LoopLagProbe(lag=lag, stalls=stalls, sites=sites, watchdog=True, interval=0.001)
    task = asyncio.create_task(probe.run())
    await asyncio.sleep(0.01)
    hold_the_loop(0.05)
    await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)

    assert probe.worst[1] == f"{__name__}:hold_the_loop"
    # The cause is one of a fixed few (for dashboards); the site has a family of its own.
    assert registry.get_sample_value("stalls_total", {"cause": "busy"}) == 1
    assert registry.get_sample_value("stalls_total", {"cause": f"{__name__}:hold_the_loop"}) is None
    assert registry.get_sample_value("sites_total", {"site": f"{__name__}:hold_the_loop"}) == 1


def hold_the_loop(seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:  # busy, as a long decode would be (a sleep releases the GIL too)
        pass


def test_stall_sites_are_bounded_in_number() -> None:
    registry, lag, stalls, _ = instruments()
    sites = Counter("sites_total", "", ["site"], registry=registry)
    probe = LoopLagProbe(lag=lag, stalls=stalls, sites=sites, interval=0.005)
    for index in range(MAX_SITES + 5):
        probe.observe(asked=float(index), woke=index + 0.02, site=f"module:f{index}")
    assert registry.get_sample_value("stalls_total", {"cause": "other"}) == 5
    assert registry.get_sample_value("stalls_total", {"cause": "busy"}) == MAX_SITES
    assert registry.get_sample_value("sites_total", {"site": "module:f0"}) == 1
    assert registry.get_sample_value("sites_total", {"site": f"module:f{MAX_SITES}"}) is None
    assert {sample.labels["cause"] for family in stalls.collect() for sample in family.samples} <= CAUSES


def test_a_stall_is_named_by_the_innermost_frame_of_fastlane_anywhere_in_the_package() -> None:
    # The probe lives in fastlane/runtime/: the frames it names are those of the whole package.
    import sys as _sys
    from pathlib import Path as _Path

    import fastlane
    from fastlane.runtime.stalls import site_of

    path = str(_Path(fastlane.__file__).parent / "engine" / "release.py")
    namespace: dict = {"__name__": "fastlane.engine.release", "sys": _sys}
    exec(compile("def release_on_time():\n    return sys._getframe()\n", path, "exec"), namespace)
    assert site_of(namespace["release_on_time"]()) == "fastlane.engine.release:release_on_time"
