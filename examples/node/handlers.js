'use strict';
// The example's handlers, by job type. A handler is `async (ctx) => output`: returning succeeds
// the attempt (the output, if any, is sent as JSON: a workflow step's result), throwing fails it
// and the job's retry policy decides what follows, and throwing an error with `permanent: true`
// fails the run for good. ctx is described in worker.js (makeContext).

const fs = require('node:fs');

/** Resolves after ms, or rejects with the signal's reason once the attempt is told to stop. */
function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal.aborted) {
      reject(signal.reason);
      return;
    }
    const timer = setTimeout(() => {
      signal.removeEventListener('abort', stopped);
      resolve();
    }, ms);
    function stopped() {
      clearTimeout(timer);
      reject(signal.reason);
    }
    signal.addEventListener('abort', stopped, { once: true });
  });
}

class FlakyError extends Error {
  constructor(message) {
    super(message);
    this.name = 'FlakyError';
  }
}

class Interrupted extends Error {
  constructor(message) {
    super(message);
    this.name = 'Interrupted';
  }
}

/** Succeeds with what it was given; payload {"sleep_ms": N} makes it take that long first. */
async function echo(ctx) {
  const payload = ctx.json() || {};
  if (payload.sleep_ms) await sleep(payload.sleep_ms, ctx.signal);
  return { echo: payload, run_id: ctx.runId, attempt: ctx.attempt };
}

/** Fails its first attempt, so the node retries the run; succeeds on the next. */
async function flaky(ctx) {
  if (ctx.attempt === 1) throw new FlakyError('the first attempt fails on purpose');
  return { attempt: ctx.attempt };
}

/**
 * Counts steps, saving each as a checkpoint. An attempt resumes after the step its checkpoint
 * names. With payload {"interrupt_after": K}, the first attempt stops with an error once step K
 * is saved (and its heartbeat sent): the retry shows that the checkpoint reached the node and
 * came back with the new attempt.
 */
async function checkpoint(ctx) {
  const payload = ctx.json() || {};
  const steps = payload.steps || 3;
  const resumedFrom = ctx.checkpoint === null ? 0 : JSON.parse(ctx.checkpoint.toString('utf8')).step;
  for (let step = resumedFrom + 1; step <= steps; step += 1) {
    await sleep(payload.step_ms || 50, ctx.signal);
    ctx.saveCheckpoint(Buffer.from(JSON.stringify({ step })));
    ctx.reportProgress(step / steps);
    if (ctx.attempt === 1 && step === payload.interrupt_after) {
      await ctx.heartbeat(); // the checkpoint is on its way to the node before the failure is
      throw new Interrupted(`interrupted after step ${step}`);
    }
  }
  return { resumed_from: resumedFrom, steps };
}

/**
 * Runs until it is cancelled (or for payload.max_seconds, default an hour), reporting progress;
 * it ends when its signal says so, which the worker reports as cancelled. Longer than its lease:
 * the worker's heartbeats keep the lease alive.
 */
async function slow(ctx) {
  const payload = ctx.json() || {};
  const seconds = payload.max_seconds || 3600;
  for (let tick = 1; tick <= seconds * 2; tick += 1) {
    await sleep(500, ctx.signal);
    ctx.reportProgress(tick / (seconds * 2));
  }
  return { ran_seconds: seconds };
}

/**
 * Records, as its first act, when it was entered, for start-lag measurements: one JSON line per
 * run in the file named by FASTLANE_LAG_FILE (worker.js --lag-file). Times in ns since the epoch:
 * entered_ns on this worker's wall clock, entered_node_ns on its estimate of the node's clock
 * (what a run sent ahead is started by: the estimate it was held with), started_ns when the worker set about calling it,
 * received_ns when its assignment arrived, scheduled_ns and start_at_ns as the node sent them, and
 * held_until_ns: start_at on this worker's clock, the instant the run was held until.
 */
function lagRecorder(file) {
  const fd = file ? fs.openSync(file, 'a') : null;
  return async function lag(ctx) {
    const enteredNs = ctx.nowNs();
    if (fd === null) return undefined;
    const offset = ctx.clockOffsetNs;
    const line = {
      run_id: ctx.runId,
      job_id: ctx.jobId,
      attempt: ctx.attempt,
      scheduled_ns: String(ctx.scheduledForNs),
      entered_ns: String(enteredNs),
      started_ns: String(ctx.startedAtNs),
      entered_node_ns: String(enteredNs + (offset || 0n)),
      received_ns: String(ctx.receivedAtNs),
      start_at_ns: ctx.startAtNs === null ? null : String(ctx.startAtNs),
      held_until_ns: ctx.heldUntilNs === null ? null : String(ctx.heldUntilNs),
      clock_offset_ns: offset === null ? null : String(offset),
      clock_uncertainty_ns: ctx.clockUncertaintyNs === null ? null : String(ctx.clockUncertaintyNs),
    };
    fs.writeSync(fd, `${JSON.stringify(line)}\n`); // one write per line: a reader never sees half of one
    return undefined;
  };
}

function handlers({ lagFile } = {}) {
  return {
    'node.echo': echo,
    'node.flaky': flaky,
    'node.checkpoint': checkpoint,
    'node.slow': slow,
    'node.lag': lagRecorder(lagFile),
  };
}

module.exports = { handlers, sleep };
