'use strict';
// Time for the worker: the wall clock to the microsecond, the node's clock estimated from probe
// round trips, and a timer that starts held runs on their instant and never before it.

const { performance } = require('node:perf_hooks');
const { nsToDuration, nsToTimestamp, timestampToNs } = require('./fastlane');

// -- this process's wall clock --------------------------------------------------------------

const NS_PER_MS = 1_000_000n;
// Date.now() and the anchored clock differ by under a millisecond (Date.now() truncates); more
// than this either way and the wall clock itself was stepped (NTP, an operator).
const STEP_TOLERANCE_NS = 3n * NS_PER_MS;
const SPIN_FINISH_NS = 20_000; // the end of a spin, read on the exact clock

/**
 * The wall clock in nanoseconds. Node gives the wall clock only to the millisecond (Date.now()),
 * and a monotonic clock to the nanosecond (process.hrtime): this anchors the second to the first
 * at an instant Date.now() ticks over, which is a whole millisecond of the wall clock to within a
 * spin's step, so readings are good to about a microsecond. `checkStep` re-anchors after the wall
 * clock was stepped and says by how much, so the clock estimate can move with it.
 */
class WallClock {
  constructor() {
    this._base = 0n;
    this._anchor();
  }

  nowNs() {
    return process.hrtime.bigint() + this._base;
  }

  /** Busy-wait until the clock reads instantNs; returns the reading then. */
  spinUntil(instantNs) {
    // Most of the way on performance.now(), a double: each BigInt reading allocates, and a spin of
    // a millisecond or two on them alone left enough garbage for a scavenge (about a millisecond
    // here) every few runs, often just as one was due. The same monotonic clock as the anchor's;
    // the BigInt readings only have the last few microseconds, and the last say.
    const ahead = Number(instantNs - this.nowNs()) - SPIN_FINISH_NS;
    if (ahead > 0) {
      const until = performance.now() + ahead / 1e6;
      while (performance.now() < until) { /* spin */ }
    }
    const target = instantNs - this._base;
    let mono;
    do {
      mono = process.hrtime.bigint();
    } while (mono < target);
    return mono + this._base;
  }

  /** The step of the wall clock since the last check, in ns (0n: none). */
  checkStep() {
    const drift = BigInt(Date.now()) * NS_PER_MS - this.nowNs();
    if (drift > -STEP_TOLERANCE_NS && drift < STEP_TOLERANCE_NS) return 0n;
    const before = this._base;
    this._anchor();
    return this._base - before;
  }

  _anchor() {
    // Spins at most a millisecond, at start-up and after a step.
    const start = Date.now();
    let ms;
    let mono;
    do {
      mono = process.hrtime.bigint();
      ms = Date.now();
    } while (ms === start);
    this._base = BigInt(ms) * NS_PER_MS - mono;
  }
}

// -- the node's clock ------------------------------------------------------------------------

const SAMPLES_KEPT = 16;
const MAX_ROUND_TRIP_NS = 5_000_000_000n; // an echo later than this says nothing precise
const MAX_PENDING = 64; // probes awaiting their echo: a node that never echoes must not grow this

/**
 * The offset of the node's clock from this worker's, as workers.proto describes it: for a probe
 * sent at t0 (worker clock), echoed with the node's time tn, and received at t3,
 *   offset = tn - (t0 + t3) / 2, uncertainty = (t3 - t0) / 2,
 * keeping the sample with the shortest round trip of the recent ones (the newest on a tie: the
 * clocks may have drifted since an older one).
 */
class ClockEstimator {
  constructor() {
    this.reset();
    this._nextId = 1n;
  }

  reset() {
    this._samples = [];
    // probe id (string) -> { stamped: its sent_at, sent: when it left }, worker clock, ns
    this._pending = new Map();
    this.best = null; // { offsetNs, roundTripNs }
  }

  get offsetNs() {
    return this.best === null ? null : this.best.offsetNs;
  }

  get uncertaintyNs() {
    return this.best === null ? null : this.best.roundTripNs / 2n;
  }

  /** A ClockProbe sent at nowNs, carrying the current estimate: the node decides by it. */
  probe(nowNs) {
    for (const [id, probe] of this._pending) {
      if (nowNs - probe.sent > MAX_ROUND_TRIP_NS) this._pending.delete(id);
    }
    while (this._pending.size >= MAX_PENDING) this._pending.delete(this._pending.keys().next().value);
    const id = (this._nextId++).toString();
    this._pending.set(id, { stamped: nowNs, sent: nowNs });
    const probe = { probe_id: id, sent_at: nsToTimestamp(nowNs) };
    if (this.best !== null) {
      probe.uncertainty = nsToDuration(this.best.roundTripNs / 2n);
      probe.offset = nsToDuration(this.best.offsetNs);
    }
    return probe;
  }

  /**
   * The probe left at nowNs: the transport took it. grpc-js hands a message to its socket a few
   * hundred microseconds after write() on a quiet stream (its callback says when), and that delay
   * is this worker's, not the wire's: counted in the round trip it lengthens only the way out, and
   * skews the estimate toward a node ahead by half of it, so runs held by it would start early.
   */
  sent(probeId, nowNs) {
    const probe = this._pending.get(probeId);
    if (probe !== undefined && nowNs >= probe.sent) probe.sent = nowNs;
  }

  /** Take a ClockEcho received at receivedNs; the sample, or null if the echo is ignored. */
  echo(echo, receivedNs) {
    const id = String(echo.probe_id || '0');
    const probe = this._pending.get(id);
    this._pending.delete(id);
    if (probe === undefined || !echo.node_time) return null;
    if (echo.probe_sent_at && timestampToNs(echo.probe_sent_at) !== probe.stamped) return null;
    const { sent } = probe;
    const roundTrip = receivedNs - sent;
    if (roundTrip < 0n || roundTrip > MAX_ROUND_TRIP_NS) return null;
    const sample = { offsetNs: timestampToNs(echo.node_time) - (sent + receivedNs) / 2n, roundTripNs: roundTrip };
    this._samples.push(sample);
    if (this._samples.length > SAMPLES_KEPT) this._samples.shift();
    this.best = this._samples.reduce((best, kept) => (kept.roundTripNs <= best.roundTripNs ? kept : best));
    return sample;
  }

  /** This worker's wall clock jumped by jumpNs: every sample and pending probe moves with it. */
  stepped(jumpNs) {
    this._samples = this._samples.map((s) => ({ offsetNs: s.offsetNs - jumpNs, roundTripNs: s.roundTripNs }));
    if (this.best !== null) this.best = { offsetNs: this.best.offsetNs - jumpNs, roundTripNs: this.best.roundTripNs };
    for (const probe of this._pending.values()) probe.sent += jumpNs; // the stamp is what the node echoes
  }
}

// -- starting held runs on their instant ------------------------------------------------------

// Node's timers count whole milliseconds of a loop time that is itself truncated, so they may
// ring up to a millisecond early and are often one or two late. The timer is set this much before
// the earliest instant, and the last stretch is spun on the wall clock: a run never starts early,
// and rarely more than a few microseconds late, at the price of spinning up to SPIN_NS per wake.
const WAKE_EARLY_NS = 2n * NS_PER_MS;
const SPIN_NS = 3n * NS_PER_MS;

/** Calls functions at instants of the wall clock: never before, as soon after as the loop allows. */
class StartTimer {
  constructor(clock) {
    this._clock = clock;
    this._due = []; // { instantNs, fn, done }, earliest first
    this._timer = null;
    this._immediate = null;
  }

  /** Call fn once the clock reads instantNs or later; returns a function that cancels the call. */
  at(instantNs, fn) {
    const entry = { instantNs, fn, done: false };
    let low = 0;
    let high = this._due.length;
    while (low < high) { // after every entry due at the same instant: calls keep their order
      const middle = (low + high) >> 1;
      if (this._due[middle].instantNs <= instantNs) low = middle + 1;
      else high = middle;
    }
    this._due.splice(low, 0, entry);
    if (low === 0) this._arm();
    return () => {
      if (entry.done) return;
      entry.done = true;
      const index = this._due.indexOf(entry);
      if (index >= 0) this._due.splice(index, 1);
      if (index === 0) this._arm();
    };
  }

  get waiting() {
    return this._due.length;
  }

  close() {
    this._due = [];
    this._disarm();
  }

  _arm() {
    this._disarm();
    if (this._due.length === 0) return;
    const wait = this._due[0].instantNs - this._clock.nowNs() - WAKE_EARLY_NS;
    // setImmediate for an instant already close: the rest of the message that brought it is read first.
    if (wait <= 0n) this._immediate = setImmediate(() => this._ring());
    else this._timer = setTimeout(() => this._ring(), Number(wait / NS_PER_MS));
  }

  _disarm() {
    if (this._timer !== null) clearTimeout(this._timer);
    if (this._immediate !== null) clearImmediate(this._immediate);
    this._timer = null;
    this._immediate = null;
  }

  _ring() {
    this._timer = null;
    this._immediate = null;
    for (;;) {
      let now = this._clock.nowNs();
      const first = this._due[0];
      if (first === undefined) return;
      if (first.instantNs > now) {
        if (first.instantNs - now > SPIN_NS) break;
        now = this._clock.spinUntil(first.instantNs);
      }
      // Everything due by now starts in this one callback, none waiting for another wake.
      while (this._due.length > 0 && this._due[0].instantNs <= now) {
        const entry = this._due.shift();
        entry.done = true;
        try {
          entry.fn();
        } catch (error) {
          process.emitWarning(error);
        }
      }
    }
    this._arm();
  }
}

module.exports = { ClockEstimator, StartTimer, WallClock };
