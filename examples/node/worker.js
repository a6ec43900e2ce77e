#!/usr/bin/env node
'use strict';
// A fastlane worker in Node.js, written from proto/fastlane/v1/workers.proto: one
// WorkerService.Connect stream to one node, reconnected with backoff whenever it ends.
//
// On the stream: a Hello (with the credits: the runs it will take), then, once the node's Welcome
// has said how often to heartbeat, clock probes (a few at once, then one per heartbeat interval),
// heartbeats for every attempt in flight (with its progress and checkpoint when they change),
// results (with the credits they free) and further credits. From the node: assignments, acks,
// cancels (withdrawals among them) and clock echoes.
//
// What outlives a connection: the attempts in flight and the results the node has not
// acknowledged. A result stays until its ack, and is sent again right after the Hello of every
// new connection: an ack means durable, and a node that went away before writing it has lost it.
//
// A run sent ahead (Assignment.start_at) is held until that instant of the node's clock, turned
// into this worker's by the estimated offset, and never started before it (clock.js).
//
//   node worker.js [--server HOST:PORT] [--concurrency N] [--worker-id ID] [--lag-file FILE]
//                  [--events FILE] [--drain-timeout SECONDS]

const crypto = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const { parseArgs } = require('node:util');
const api = require('./fastlane');
const { ClockEstimator, StartTimer, WallClock } = require('./clock');
const exampleHandlers = require('./handlers');

const OUTCOME = {
  SUCCEEDED: 'ATTEMPT_OUTCOME_SUCCEEDED',
  FAILED: 'ATTEMPT_OUTCOME_FAILED',
  PERMANENT_FAILURE: 'ATTEMPT_OUTCOME_PERMANENT_FAILURE',
  TIMED_OUT: 'ATTEMPT_OUTCOME_TIMED_OUT',
  CANCELLED: 'ATTEMPT_OUTCOME_CANCELLED',
};

// Every field this worker sends or reads: checked when it starts (see fastlane.js), so that an
// API change fails it at once, not at the first run that would use the field.
const USES = {
  'fastlane.v1.ConnectRequest': ['hello', 'credit', 'heartbeats', 'results', 'clock_probe', 'drain'],
  'fastlane.v1.Hello': ['worker_id', 'job_types', 'credits', 'tenant'],
  'fastlane.v1.CreditGrant': ['credits'],
  'fastlane.v1.Heartbeats': ['beats'],
  'fastlane.v1.RunHeartbeat': ['run_id', 'lease_token', 'started', 'progress', 'checkpoint'],
  'fastlane.v1.Results': ['results', 'credits'],
  'fastlane.v1.RunResult': [
    'run_id', 'lease_token', 'outcome', 'error_code', 'error_message', 'started_at', 'finished_at',
    'error_traceback', 'output',
  ],
  'fastlane.v1.ClockProbe': ['probe_id', 'sent_at', 'uncertainty', 'offset'],
  'fastlane.v1.ConnectResponse': ['welcome', 'assignments', 'acks', 'cancel', 'clock_echo'],
  'fastlane.v1.Welcome': ['node_id', 'heartbeat_interval', 'takes_credits_with_results', 'prompt_results', 'takes_drain'],
  'fastlane.v1.Assignments': ['assignments'],
  'fastlane.v1.Assignment': [
    'run_id', 'job_id', 'job_type', 'tenant', 'attempt', 'payload', 'scheduled_for', 'idempotency_key',
    'lease_token', 'lease_ttl', 'checkpoint', 'timeout', 'released_at', 'start_at', 'awaited',
  ],
  'fastlane.v1.ResultAcks': ['acks'],
  'fastlane.v1.ResultAck': ['run_id', 'lease_token'],
  'fastlane.v1.CancelRuns': ['runs', 'reason', 'unstarted_only'],
  'fastlane.v1.ClockEcho': ['probe_id', 'probe_sent_at', 'node_time'],
  'fastlane.v1.AttemptOutcome': Object.values(OUTCOME),
};
const REQUEST = 'fastlane.v1.ConnectRequest';

const NS_PER_MS = 1_000_000n;
const DEFAULT_HEARTBEAT_MS = 5000; // until a Welcome says otherwise
const BACKOFF_START_MS = 100;
const BACKOFF_CAP_MS = 2000;
const REFUSED_RETRY_MS = 30_000; // a node that refuses the token is asked again this rarely
// Results of runs ending within this window share one message (and one write at the node).
const RESULT_COALESCE_NS = 4n * NS_PER_MS;
const RESULT_COALESCE_ENOUGH = 256;
const QUICK_PROBES = 5; // right after each Welcome, for a usable estimate at once
const QUICK_PROBE_GAP_MS = 20;
const SILENT_NODE_PROBE_MS = 60_000; // a node that never echoes (an older one) is probed rarely
// A node sends runs at most a second ahead: a start_at further away says a clock (or the
// estimate of the node's) is off. The run is held all the same, never started early, and logged.
const MAX_HOLD_NS = 10_000_000_000n;
const MAX_ERROR_MESSAGE = 2000;
const MAX_TRACEBACK = 16_000; // the node keeps the last 16,000 characters
const MAX_OUTPUT_BYTES = 16 * 1024;
const MAX_CHECKPOINT_BYTES = 1 << 20;
// A node takes messages of its payload limit or the largest checkpoint, whichever is larger, plus
// an envelope, and ends a stream that sends more: batches are cut at the bound every node takes.
const MESSAGE_BUDGET = MAX_CHECKPOINT_BYTES;
const ABANDON_GRACE_MS = 2000; // after the drain timeout, for cancelled runs' results to be acked
const CHANNEL_OPTIONS = {
  // gRPC's own reconnect backoff grows to two minutes; hold it to this worker's schedule.
  'grpc.initial_reconnect_backoff_ms': BACKOFF_START_MS,
  'grpc.min_reconnect_backoff_ms': BACKOFF_START_MS,
  'grpc.max_reconnect_backoff_ms': BACKOFF_CAP_MS,
  // One assignment may carry a 1 MiB payload and a 1 MiB checkpoint, and a batch several.
  'grpc.max_receive_message_length': -1,
};
const ACCESS_REFUSED = new Set([16, 7]); // UNAUTHENTICATED, PERMISSION_DENIED

const SHUTDOWN = { outcome: OUTCOME.FAILED, code: 'WorkerShutdown', message: 'the worker stopped before the handler finished' };

/** What a handler's signal is aborted with: the attempt was cancelled, withdrawn or timed out. */
class Stopped extends Error {
  constructor(verdict) {
    super(verdict.message || 'stopped');
    this.name = 'Stopped';
    this.verdict = verdict;
  }
}

/** One attempt in flight: from its assignment to its result. */
class Slot {
  constructor(assignment, receivedNs) {
    this.assignment = assignment;
    this.runId = assignment.run_id;
    this.leaseToken = String(assignment.lease_token || '0');
    this.key = `${this.runId}/${this.leaseToken}`;
    this.receivedNs = receivedNs;
    this.nodeStartAtNs = api.timestampToNs(assignment.start_at); // node clock; null: not sent ahead
    this.startAtNs = null; // the instant to start, on this worker's clock; null: at once
    this.startedNs = null; // when the handler was entered
    this.cancelHold = null;
    this.abort = new AbortController();
    this.stopReason = null;
    this.timeoutTimer = null;
    this.progress = null;
    this.sentProgress = null;
    this.checkpoint = null;
    this.unsentCheckpoint = null;
    this.output = null;
    this.ctx = null; // what the handler is given (Worker._context)
  }

  /** Sent ahead and waiting for its instant: in flight, but no handler runs yet. */
  get held() {
    return this.startAtNs !== null && this.startedNs === null;
  }

  beat() {
    const beat = { run_id: this.runId, lease_token: this.leaseToken, started: !this.held };
    if (this.progress !== null && this.progress !== this.sentProgress) beat.progress = this.sentProgress = this.progress;
    if (this.unsentCheckpoint !== null) {
      beat.checkpoint = this.unsentCheckpoint;
      this.unsentCheckpoint = null;
    }
    return beat;
  }

  hasUnsentState() {
    return this.unsentCheckpoint !== null || (this.progress !== null && this.progress !== this.sentProgress);
  }

  /** A new connection may reach a node that never heard the last beat: everything goes again. */
  resync() {
    this.sentProgress = null;
    this.unsentCheckpoint = this.checkpoint;
  }
}

class Worker {
  /**
   * @param {object} options
   * @param {string} options.address node address, HOST:PORT
   * @param {object} options.handlers job type -> async (ctx) => output
   * @param {number} [options.concurrency] the most attempts in flight at once
   * @param {string} [options.workerId]
   * @param {string} [options.eventsFile] a JSON line per thing that happens, for tests and demos
   * @param {number} [options.drainTimeoutMs] how long stop() waits for running handlers
   */
  constructor(options) {
    api.expectFields(USES);
    api.expectMethods('WorkerService', ['Connect']);
    this._address = options.address;
    this._handlers = options.handlers;
    this._jobTypes = Object.keys(this._handlers);
    this._concurrency = options.concurrency || 16;
    this._workerId = options.workerId || `${os.hostname()}-${process.pid}-${crypto.randomBytes(3).toString('hex')}`;
    this._drainTimeoutMs = options.drainTimeoutMs ?? 10_000;
    this._events = options.eventsFile ? fs.openSync(options.eventsFile, 'a') : null;
    const { services } = api.loadApi();
    this._stub = new services.WorkerService(this._address, api.channelCredentials(), CHANNEL_OPTIONS);
    this._clock = new WallClock();
    this._estimator = new ClockEstimator();
    this._starts = new StartTimer(this._clock);
    this._inFlight = new Map(); // key -> Slot
    this._unacked = new Map(); // key -> RunResult, until the node acknowledges it
    this._pending = []; // results not yet written to the current connection
    this._pendingCredits = 0;
    this._pendingAwaited = false;
    this._finalBeats = []; // last progress or checkpoint of finished runs, sent just before their results
    this._changed = new Set(); // keys due in the next prompt heartbeat
    this._beatWaiters = [];
    this._promptBeat = null;
    this._session = null;
    this._backoffMs = BACKOFF_START_MS;
    this._draining = false; // grant no more credits
    this._closed = false; // no reconnect, no new assignments
    this._stopping = null;
    this._reconnectTimer = null;
  }

  get workerId() {
    return this._workerId;
  }

  start() {
    log('info', `worker ${this._workerId} serving ${this._jobTypes.join(', ')}, ${this._concurrency} at once, on ${this._address}`);
    this._connect();
  }

  /** Stop gracefully: take no new work, let handlers finish (or stop them), report, disconnect. */
  stop() {
    if (this._stopping === null) this._stopping = this._drain();
    return this._stopping;
  }

  // -- one connection -----------------------------------------------------------------------

  _connect() {
    this._reconnectTimer = null;
    if (this._closed) return;
    const call = this._stub.Connect(api.callMetadata());
    const session = {
      call, welcomed: false, ended: false, error: null, nodeId: '', resent: 0, heartbeatMs: DEFAULT_HEARTBEAT_MS,
      creditsWithResults: false, promptResults: false, takesDrain: false, echoed: false, lastResultsNs: -RESULT_COALESCE_NS,
      heartbeatTimer: null, probeTimer: null, flushTimer: null, flushDue: null,
    };
    this._session = session;
    this._estimator.reset(); // the address may now reach another node, or the same one restarted
    call.on('data', (message) => this._guard(() => this._onMessage(session, message)));
    call.on('error', (error) => { session.error = error; }); // 'status' follows and ends the session
    call.on('status', (status) => this._guard(() => this._ended(session, status)));

    const credits = this._draining ? 0 : Math.max(0, this._concurrency - this._inFlight.size);
    this._send(session, { hello: { worker_id: this._workerId, job_types: this._jobTypes, credits, tenant: '' } });
    // The Hello's credits already count every finished run: nothing pending is granted again.
    this._pending = [];
    this._pendingCredits = 0;
    this._pendingAwaited = false;
    for (const slot of this._inFlight.values()) slot.resync();
    this._sendBeats(session, this._finalBeats.splice(0));
    const resend = [...this._unacked.values()];
    for (const batch of batches(resend)) this._send(session, { results: { results: batch } });
    session.resent = resend.length;
    if (resend.length > 0) this._event('resent', { run_ids: resend.map((result) => result.run_id) });
  }

  _ended(session, status) {
    if (session.ended) return;
    session.ended = true;
    clearTimeout(session.heartbeatTimer);
    clearTimeout(session.probeTimer);
    clearTimer(session.flushTimer);
    if (this._session === session) this._session = null;
    this._releaseBeatWaiters();
    const why = session.error ? `${statusName(session.error.code)}: ${session.error.details}` : `${statusName(status.code)}: ${status.details || 'the node ended the stream'}`;
    if (session.welcomed) log('info', `disconnected from ${this._address}: ${this._closed && status.code === 0 ? 'worker stopped' : why}`);
    this._event('disconnected', { reason: why });
    if (this._closed) return;
    if (session.welcomed) this._backoffMs = BACKOFF_START_MS;
    let pause = this._backoffMs / 2 + Math.random() * (this._backoffMs / 2);
    this._backoffMs = Math.min(this._backoffMs * 2, BACKOFF_CAP_MS);
    if (ACCESS_REFUSED.has(status.code)) {
      log('error', `${this._address} refused this worker (${why}): check FASTLANE_TOKEN; asking again in ${REFUSED_RETRY_MS / 1000} s`);
      pause = REFUSED_RETRY_MS;
    } else {
      log(session.welcomed ? 'info' : 'debug', `reconnecting to ${this._address} in ${Math.round(pause)} ms (after ${why})`);
    }
    this._reconnectTimer = setTimeout(() => this._guard(() => this._connect()), pause);
  }

  _onMessage(session, message) {
    const receivedNs = this._clock.nowNs(); // first: a clock echo's receipt time
    switch (message.body) {
      case 'welcome':
        this._welcome(session, message.welcome);
        break;
      case 'assignments':
        if (this._closed) return; // the stream is closing: the node treats these as a leaving worker's
        this._checkClockStep();
        for (const assignment of message.assignments.assignments || []) this._assign(assignment, receivedNs);
        break;
      case 'acks':
        for (const ack of message.acks.acks || []) this._unacked.delete(`${ack.run_id}/${ack.lease_token || '0'}`);
        break;
      case 'cancel':
        this._cancel(message.cancel);
        break;
      case 'clock_echo': {
        const sample = this._estimator.echo(message.clock_echo, receivedNs);
        if (sample === null) {
          log('debug', `ignored a clock echo (probe ${message.clock_echo.probe_id}): unknown, repeated or absurd`);
          break;
        }
        session.echoed = true;
        log('debug', `clock of ${this._address}: sample offset ${Number(sample.offsetNs) / 1e6} ms (round trip `
          + `${Number(sample.roundTripNs) / 1e6} ms); estimate ${Number(this._estimator.offsetNs) / 1e6} ms `
          + `± ${Number(this._estimator.uncertaintyNs) / 1e6} ms`);
        break;
      }
      default:
        log('warn', `ignoring an unexpected ${message.body} message from the node`);
    }
  }

  _welcome(session, welcome) {
    const intervalNs = api.durationToNs(welcome.heartbeat_interval);
    session.heartbeatMs = intervalNs > 0n ? Number(intervalNs / NS_PER_MS) : DEFAULT_HEARTBEAT_MS;
    session.creditsWithResults = Boolean(welcome.takes_credits_with_results);
    session.promptResults = Boolean(welcome.prompt_results);
    session.takesDrain = Boolean(welcome.takes_drain);
    if (this._draining) this._sendDrain(session); // reconnected while stopping
    session.nodeId = welcome.node_id || '?';
    const first = !session.welcomed;
    session.welcomed = true;
    if (!first) return;
    log('info', `connected to ${this._address} (node ${session.nodeId}, heartbeat every ${session.heartbeatMs} ms, `
      + `${this._inFlight.size} runs in flight, ${session.resent} unacknowledged results sent again)`);
    this._event('connected', { node_id: session.nodeId, in_flight: this._inFlight.size });
    // A node that restarted learns at once what runs here; then one full heartbeat per interval.
    if (this._inFlight.size > 0) this._fullBeat(session);
    const beat = () => {
      this._fullBeat(session);
      session.heartbeatTimer = setTimeout(() => this._guard(beat), session.heartbeatMs);
    };
    session.heartbeatTimer = setTimeout(() => this._guard(beat), session.heartbeatMs);
    let probes = 0;
    const probe = () => {
      this._probe(session);
      probes += 1;
      const gap = probes < QUICK_PROBES ? QUICK_PROBE_GAP_MS : session.echoed ? session.heartbeatMs : SILENT_NODE_PROBE_MS;
      session.probeTimer = setTimeout(() => this._guard(probe), gap);
    };
    probe();
    this._scheduleFlush(); // results that finished between the Hello and the Welcome
  }

  _send(session, message, written = undefined) {
    if (session.ended) return;
    api.checkMessage(REQUEST, message);
    session.call.write(message, written);
  }

  // -- attempts ------------------------------------------------------------------------------

  _assign(assignment, receivedNs) {
    const slot = new Slot(assignment, receivedNs);
    if (this._inFlight.has(slot.key) || this._unacked.has(slot.key)) {
      log('warn', `ignoring a repeated assignment of run ${slot.runId} (lease ${slot.leaseToken})`);
      return;
    }
    this._inFlight.set(slot.key, slot);
    const handler = this._handlers[assignment.job_type];
    // Made now, not when the handler starts: a held run's start then costs only the call (an
    // AbortSignal alone takes tens of microseconds to make on a cold path).
    slot.ctx = this._context(slot);
    if (handler === undefined) {
      this._finish(slot, { outcome: OUTCOME.FAILED, code: 'UnknownJobType', message: `no handler here for '${assignment.job_type}'` });
      return;
    }
    if (slot.nodeStartAtNs !== null) {
      // Translated once, here: the instant stays put if the estimate moves while the run is held.
      const startAt = slot.nodeStartAtNs - (this._estimator.offsetNs ?? 0n);
      const ahead = startAt - this._clock.nowNs();
      if (ahead > MAX_HOLD_NS) {
        log('warn', `run ${slot.runId}: start_at is ${Number(ahead / NS_PER_MS) / 1000} s ahead (at most `
          + `${Number(MAX_HOLD_NS / NS_PER_MS) / 1000} s expected): holding it until then; check this host's clock and the node's`);
      }
      slot.startAtNs = startAt;
      slot.cancelHold = this._starts.at(startAt, () => {
        slot.cancelHold = null;
        this._guard(() => this._begin(slot, handler));
      });
      return;
    }
    this._begin(slot, handler);
  }

  _begin(slot, handler) {
    slot.startedNs = this._clock.nowNs();
    if (slot.startAtNs !== null) this._markChanged(slot); // the node heard started=false until now
    const timeoutNs = api.durationToNs(slot.assignment.timeout);
    if (timeoutNs !== null && timeoutNs > 0n) {
      const seconds = Number(timeoutNs) / 1e9;
      slot.timeoutTimer = setTimeout(() => this._stopSlot(slot, {
        outcome: OUTCOME.TIMED_OUT, code: 'TimeoutError', message: `the handler ran past its timeout of ${seconds} s`,
      }), Math.ceil(Number(timeoutNs) / 1e6));
    }
    const { ctx } = slot;
    // The offset this start went by: the one a held run's instant was translated with (the
    // estimate may have moved since), else the estimate now.
    ctx.clockOffsetNs = slot.startAtNs !== null ? slot.nodeStartAtNs - slot.startAtNs : this._estimator.offsetNs;
    ctx.clockUncertaintyNs = this._estimator.uncertaintyNs;
    let running;
    try {
      running = Promise.resolve(handler(ctx));
    } catch (error) {
      running = Promise.reject(error);
    }
    this._event('started', {
      run_id: slot.runId, job_id: slot.assignment.job_id, job_type: slot.assignment.job_type, attempt: ctx.attempt,
      held: slot.startAtNs !== null, checkpoint: ctx.checkpoint === null ? null : ctx.checkpoint.toString('utf8'),
      scheduled_ns: String(ctx.scheduledForNs), started_ns: String(slot.startedNs),
    });
    running.then(
      (output) => this._guard(() => this._settle(slot, false, output)),
      (error) => this._guard(() => this._settle(slot, true, error ?? new Error(`rejected with ${error}`))),
    );
  }

  _settle(slot, failed, outcome) {
    clearTimeout(slot.timeoutTimer);
    const error = outcome;
    let verdict;
    if (!failed) {
      verdict = { outcome: OUTCOME.SUCCEEDED };
      slot.output = encodeOutput(slot.assignment.job_type, outcome);
    } else if (slot.stopReason !== null) {
      verdict = slot.stopReason; // the handler honoured its signal
    } else {
      verdict = {
        outcome: error.permanent ? OUTCOME.PERMANENT_FAILURE : OUTCOME.FAILED,
        code: error.name || error.constructor?.name || 'Error',
        message: String(error.message !== undefined ? error.message : error),
        traceback: error.stack ? String(error.stack).slice(-MAX_TRACEBACK) : '',
      };
    }
    this._finish(slot, verdict);
  }

  /** Stop an attempt: a held one at once, a running one through its handler's signal. */
  _stopSlot(slot, verdict) {
    if (slot.stopReason !== null || this._inFlight.get(slot.key) !== slot) return;
    slot.stopReason = verdict;
    if (slot.startedNs === null) {
      if (slot.cancelHold !== null) slot.cancelHold();
      this._finish(slot, verdict);
      return;
    }
    slot.abort.abort(new Stopped(verdict));
  }

  _cancel(cancel) {
    const verdict = { outcome: OUTCOME.CANCELLED, code: '', message: cancel.reason || '' };
    const refs = cancel.runs || [];
    this._event('cancel', { run_ids: refs.map((ref) => ref.run_id), unstarted_only: Boolean(cancel.unstarted_only) });
    for (const ref of refs) {
      const slot = this._inFlight.get(`${ref.run_id}/${ref.lease_token || '0'}`);
      // A withdrawal (unstarted_only) drops only runs still held for their instant.
      if (slot !== undefined && (slot.held || !cancel.unstarted_only)) this._stopSlot(slot, verdict);
    }
  }

  _finish(slot, verdict) {
    if (this._inFlight.get(slot.key) !== slot) return; // already reported
    this._inFlight.delete(slot.key);
    this._changed.delete(slot.key);
    clearTimeout(slot.timeoutTimer);
    if (slot.cancelHold !== null) slot.cancelHold();
    const finishedNs = this._clock.nowNs();
    if (slot.hasUnsentState()) this._finalBeats.push(slot.beat());
    const result = {
      run_id: slot.runId,
      lease_token: slot.leaseToken,
      outcome: verdict.outcome,
      started_at: api.nsToTimestamp(slot.startedNs ?? finishedNs),
      finished_at: api.nsToTimestamp(finishedNs),
    };
    if (verdict.code) result.error_code = verdict.code;
    if (verdict.message) result.error_message = verdict.message.slice(0, MAX_ERROR_MESSAGE);
    if (verdict.traceback) result.error_traceback = verdict.traceback;
    if (verdict.outcome === OUTCOME.SUCCEEDED && slot.output !== null) result.output = slot.output;
    this._unacked.set(slot.key, result);
    this._pending.push(result);
    this._pendingCredits += 1;
    this._pendingAwaited ||= Boolean(slot.assignment.awaited);
    this._event('ended', {
      run_id: slot.runId, job_type: slot.assignment.job_type, attempt: slot.assignment.attempt || 0,
      outcome: verdict.outcome, error_code: verdict.code || '', error_message: verdict.message || '',
      output: slot.output === null ? null : slot.output.toString('utf8'),
    });
    this._scheduleFlush();
  }

  // -- results -------------------------------------------------------------------------------

  _scheduleFlush() {
    const session = this._session;
    if (session === null || !session.welcomed || (this._pending.length === 0 && this._finalBeats.length === 0)) return;
    const now = this._clock.nowNs();
    const creditsLeft = this._concurrency - this._inFlight.size - this._pendingCredits;
    let waitNs;
    // At once when others wait on a result, when many are waiting, or when the node has no
    // credit left: a freed slot is then worth more than a write saved.
    if (this._pendingAwaited || this._pending.length >= RESULT_COALESCE_ENOUGH || creditsLeft <= 0) waitNs = 0n;
    // A node that asks for prompt results gets one after a quiet spell at once; one that does
    // not (a single-writer database) gets fewer, fuller messages.
    else if (session.promptResults) waitNs = bigMax(RESULT_COALESCE_NS - (now - session.lastResultsNs), 0n);
    else waitNs = RESULT_COALESCE_NS;
    const due = now + waitNs;
    if (session.flushTimer !== null && session.flushDue <= due) return;
    clearTimer(session.flushTimer);
    session.flushDue = due;
    const flush = () => this._guard(() => this._flush(session));
    session.flushTimer = waitNs === 0n
      ? { immediate: setImmediate(flush) }
      : { timeout: setTimeout(flush, Math.ceil(Number(waitNs) / 1e6)) };
  }

  _flush(session) {
    session.flushTimer = null;
    if (this._session !== session || !session.welcomed) return;
    session.lastResultsNs = this._clock.nowNs();
    // On the same stream just before the results: the node records a run's last checkpoint first.
    this._sendBeats(session, this._finalBeats.splice(0));
    const results = this._pending.splice(0);
    let credits = this._draining ? 0 : this._pendingCredits;
    this._pendingCredits = 0;
    this._pendingAwaited = false;
    const messages = batches(results).map((batch) => ({ results: { results: batch } }));
    if (credits > 0 && messages.length > 0 && session.creditsWithResults) {
      messages[messages.length - 1].results.credits = credits; // one message instead of two
      credits = 0;
    }
    for (const message of messages) this._send(session, message);
    if (credits > 0) this._send(session, { credit: { credits } });
  }

  // -- heartbeats ----------------------------------------------------------------------------

  _markChanged(slot) {
    this._changed.add(slot.key);
    const session = this._session;
    if (session === null || !session.welcomed || this._promptBeat !== null) return;
    // On the next turn of the loop: changes made together share one heartbeat.
    this._promptBeat = setImmediate(() => {
      this._promptBeat = null;
      this._guard(() => {
        if (this._session === null || !this._session.welcomed) return;
        const slots = [...this._changed].map((key) => this._inFlight.get(key)).filter(Boolean);
        this._changed.clear();
        this._sendBeats(this._session, slots.map((changed) => changed.beat()));
        this._releaseBeatWaiters();
      });
    });
  }

  _fullBeat(session) {
    this._changed.clear();
    this._sendBeats(session, [...this._inFlight.values()].map((slot) => slot.beat()));
    this._releaseBeatWaiters();
  }

  _sendBeats(session, beats) {
    for (const batch of batches(beats)) this._send(session, { heartbeats: { beats: batch } });
  }

  _releaseBeatWaiters() {
    for (const resolve of this._beatWaiters.splice(0)) resolve();
  }

  /** A heartbeat with the attempt's latest state, now; resolves once it is written. */
  _beatNow(slot) {
    return new Promise((resolve) => {
      const session = this._session;
      if (session === null || !session.welcomed) {
        resolve(); // the full heartbeat after the next Welcome carries it
        this._changed.add(slot.key);
        return;
      }
      this._beatWaiters.push(resolve);
      this._markChanged(slot);
    });
  }

  // -- the node's clock ----------------------------------------------------------------------

  _probe(session) {
    this._checkClockStep();
    const probe = this._estimator.probe(this._clock.nowNs());
    this._send(session, { clock_probe: probe }, () => this._estimator.sent(probe.probe_id, this._clock.nowNs()));
  }

  _checkClockStep() {
    const jump = this._clock.checkStep();
    if (jump !== 0n) {
      this._estimator.stepped(jump);
      log('warn', `this worker's wall clock stepped ${Number(jump / 1000n) / 1000} ms: the node clock estimate moved with it`);
    }
  }

  // -- the handler's view --------------------------------------------------------------------

  _context(slot) {
    const a = slot.assignment;
    const payload = a.payload ? Buffer.from(a.payload) : Buffer.alloc(0);
    const scheduledForNs = api.timestampToNs(a.scheduled_for) ?? 0n;
    return {
      runId: slot.runId,
      jobId: a.job_id || '',
      jobType: a.job_type,
      tenant: a.tenant || '',
      attempt: a.attempt || 0,
      payload,
      json: () => (payload.length ? JSON.parse(payload.toString('utf8')) : null),
      scheduledForNs,
      scheduledFor: new Date(Number(scheduledForNs / NS_PER_MS)),
      idempotencyKey: a.idempotency_key || '',
      leaseToken: slot.leaseToken,
      checkpoint: a.checkpoint !== undefined && a.checkpoint !== null ? Buffer.from(a.checkpoint) : null,
      receivedAtNs: slot.receivedNs,
      get startedAtNs() { return slot.startedNs; },
      startAtNs: slot.nodeStartAtNs,
      get heldUntilNs() { return slot.startAtNs; },
      releasedAtNs: api.timestampToNs(a.released_at),
      clockOffsetNs: null, // as the handler starts: see _begin
      clockUncertaintyNs: null,
      signal: slot.abort.signal,
      nowNs: () => this._clock.nowNs(),
      reportProgress: (fraction) => {
        if (typeof fraction !== 'number' || !(fraction >= 0 && fraction <= 1)) throw new RangeError(`progress must be a number from 0 to 1, got ${fraction}`);
        slot.progress = fraction;
        this._markChanged(slot);
      },
      saveCheckpoint: (data) => {
        const bytes = Buffer.from(data);
        if (bytes.length > MAX_CHECKPOINT_BYTES) throw new RangeError(`checkpoint of ${bytes.length} bytes is over the limit of ${MAX_CHECKPOINT_BYTES}`);
        slot.checkpoint = slot.unsentCheckpoint = bytes;
        this._markChanged(slot);
      },
      heartbeat: () => this._beatNow(slot),
    };
  }

  // -- stopping ------------------------------------------------------------------------------

  async _drain() {
    log('info', `stopping: ${this._inFlight.size} runs in flight, ${this._unacked.size} results unacknowledged`);
    this._draining = true;
    if (this._session !== null && this._session.welcomed) this._sendDrain(this._session);
    if (!(await this._until(() => this._inFlight.size === 0, this._drainTimeoutMs))) {
      log('warn', `drain timeout (${this._drainTimeoutMs / 1000} s) passed with ${this._inFlight.size} runs in flight: stopping them`);
      for (const slot of [...this._inFlight.values()]) this._stopSlot(slot, SHUTDOWN);
      await this._until(() => this._inFlight.size === 0, ABANDON_GRACE_MS);
    }
    await this._until(() => this._unacked.size === 0, ABANDON_GRACE_MS);
    if (this._unacked.size > 0) log('warn', `${this._unacked.size} results were never acknowledged`);
    this._closed = true;
    clearTimeout(this._reconnectTimer);
    const session = this._session;
    if (session !== null) {
      session.call.end(); // the node ends its side in turn
      if (!(await this._until(() => session.ended, ABANDON_GRACE_MS))) session.call.cancel();
    }
    this._starts.close();
    this._stub.close();
    log('info', 'worker stopped');
  }

  /** Take back the credits granted on this stream: the node sends nothing more to a stopping worker. */
  _sendDrain(session) {
    if (session.takesDrain) this._send(session, { drain: {} });
  }

  _until(condition, timeoutMs) {
    return new Promise((resolve) => {
      const deadline = Date.now() + timeoutMs;
      const check = () => {
        if (condition()) resolve(true);
        else if (Date.now() >= deadline) resolve(false);
        else setTimeout(check, 20);
      };
      check();
    });
  }

  /** A message this example cannot build against the loaded protos is fatal, not a log line. */
  _guard(fn) {
    try {
      fn();
    } catch (error) {
      if (error instanceof api.ProtocolMismatch) {
        log('error', error.message);
        process.exit(3);
      }
      throw error;
    }
  }

  _event(event, fields) {
    if (this._events !== null) fs.writeSync(this._events, `${JSON.stringify({ event, at_ns: String(this._clock.nowNs()), ...fields })}\n`);
  }
}

// -- helpers -------------------------------------------------------------------------------------

/** As few arrays as keep each message under the budget (normally one). */
function batches(items) {
  const out = [];
  let batch = [];
  let size = 0;
  for (const item of items) {
    const itemSize = 64 + (item.checkpoint?.length || 0) + (item.output?.length || 0) + (item.error_traceback?.length || 0) + (item.error_message?.length || 0);
    if (batch.length > 0 && size + itemSize > MESSAGE_BUDGET) {
      out.push(batch);
      batch = [];
      size = 0;
    }
    batch.push(item);
    size += itemSize;
  }
  if (batch.length > 0) out.push(batch);
  return out;
}

/** What a handler returned, as JSON for a workflow's next steps; dropped (never failing the run) if not JSON or too large. */
function encodeOutput(jobType, returned) {
  if (returned === undefined || returned === null) return null;
  let encoded;
  try {
    encoded = Buffer.from(JSON.stringify(returned), 'utf8');
  } catch (error) {
    log('warn', `the ${jobType} handler returned a value that is not JSON (${error.message}): its output is dropped`);
    return null;
  }
  if (encoded.length > MAX_OUTPUT_BYTES) {
    log('warn', `the ${jobType} handler returned ${encoded.length} bytes of output, over the limit of ${MAX_OUTPUT_BYTES}: dropped`);
    return null;
  }
  return encoded;
}

function clearTimer(timer) {
  if (timer === null) return;
  if (timer.immediate) clearImmediate(timer.immediate);
  if (timer.timeout) clearTimeout(timer.timeout);
}

function bigMax(a, b) {
  return a > b ? a : b;
}

const STATUS_NAMES = Object.fromEntries(Object.entries(require('@grpc/grpc-js').status).map(([name, code]) => [code, name]));

function statusName(code) {
  return STATUS_NAMES[code] || String(code);
}

const LEVELS = { debug: 10, info: 20, warn: 30, error: 40 };
const LOG_LEVEL = LEVELS[(process.env.FASTLANE_LOG_LEVEL || 'info').toLowerCase()] ?? LEVELS.info;

function log(level, message) {
  if (LEVELS[level] >= LOG_LEVEL) process.stderr.write(`${new Date().toISOString()} ${level.toUpperCase()} ${message}\n`);
}

// -- the command -----------------------------------------------------------------------------------

function main(argv) {
  const { values } = parseArgs({
    args: argv,
    options: {
      server: { type: 'string' },
      concurrency: { type: 'string', default: '16' },
      'worker-id': { type: 'string' },
      'lag-file': { type: 'string' },
      events: { type: 'string' },
      'drain-timeout': { type: 'string', default: '10' },
      help: { type: 'boolean', short: 'h' },
    },
  });
  if (values.help) {
    process.stdout.write(`usage: node worker.js [--server HOST:PORT] [--concurrency N] [--worker-id ID]
                      [--lag-file FILE] [--events FILE] [--drain-timeout SECONDS]

Runs the example handlers (node.echo, node.flaky, node.checkpoint, node.slow, node.lag) for a
fastlane node: --server, else $FASTLANE_ADDRESS, else ${api.DEFAULT_ADDRESS}. The API token, if
the node runs with --auth, comes from $FASTLANE_TOKEN. node.lag writes one line per run to
--lag-file (else $FASTLANE_LAG_FILE); --events (else $FASTLANE_EVENTS_FILE) gets a JSON line per
handler start and end, connection and cancel.
`);
    return;
  }
  const concurrency = Number(values.concurrency);
  if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 100_000) {
    throw new RangeError(`--concurrency must be an integer from 1 to 100000, got ${values.concurrency}`);
  }
  const worker = new Worker({
    address: api.resolveAddress(values.server),
    handlers: exampleHandlers.handlers({ lagFile: values['lag-file'] || process.env.FASTLANE_LAG_FILE }),
    concurrency,
    workerId: values['worker-id'],
    eventsFile: values.events || process.env.FASTLANE_EVENTS_FILE,
    drainTimeoutMs: Number(values['drain-timeout']) * 1000,
  });
  let signals = 0;
  const stop = (signal) => {
    signals += 1;
    if (signals > 1) process.exit(1); // a second signal: stop now
    log('info', `${signal}: draining`);
    worker.stop().then(() => process.exit(0), (error) => {
      log('error', `stopping failed: ${error.stack || error}`);
      process.exit(1);
    });
  };
  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));
  worker.start();
}

if (require.main === module) {
  try {
    main(process.argv.slice(2));
  } catch (error) {
    process.stderr.write(`worker.js: ${error.message}\n`);
    process.exit(error instanceof api.ProtocolMismatch ? 3 : 2);
  }
}

module.exports = { OUTCOME, Worker };
