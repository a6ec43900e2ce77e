#!/usr/bin/env node
'use strict';
// A fastlane client in Node.js: JobService, RunService and AdminService from the checked-in
// .proto files (see fastlane.js). A module (require('./client')) and a command:
//
//   node client.js [--server HOST:PORT] COMMAND ...     (node client.js --help lists them)
//
// The command prints one JSON document on stdout: the answer in protobuf's JSON mapping (enums
// by name, int64 as strings, Timestamps as RFC 3339, Durations as "1.5s", bytes as base64).

const { parseArgs } = require('node:util');
const grpc = require('@grpc/grpc-js');
const api = require('./fastlane');

const CALL_TIMEOUT_MS = 10_000;

// Every field this client sends or reads: checked when it starts (see fastlane.js).
const USES = {
  'fastlane.v1.CreateJobRequest': ['spec'],
  'fastlane.v1.JobSpec': ['tenant', 'name', 'job_type', 'schedule', 'payload', 'priority', 'retry', 'lease_ttl', 'timeout'],
  'fastlane.v1.Schedule': ['now', 'at', 'cron', 'interval'],
  'fastlane.v1.Cron': ['expression', 'timezone'],
  'fastlane.v1.Interval': ['every', 'anchor'],
  'fastlane.v1.RetryPolicy': ['max_attempts', 'backoff_base', 'backoff_cap'],
  'fastlane.v1.GetJobRequest': ['tenant', 'job_id'],
  'fastlane.v1.ListJobsRequest': ['tenant', 'page_size', 'page_token'],
  'fastlane.v1.DeleteJobRequest': ['tenant', 'job_id'],
  'fastlane.v1.TriggerJobRequest': ['tenant', 'job_id'],
  'fastlane.v1.ListRunsRequest': ['tenant', 'job_id', 'states', 'page_size', 'page_token'],
  'fastlane.v1.GetRunRequest': ['tenant', 'run_id'],
  'fastlane.v1.CancelRunRequest': ['tenant', 'run_id'],
  'fastlane.v1.RetryRunRequest': ['tenant', 'run_id'],
  'fastlane.v1.CreateJobResponse': ['job', 'created'],
  'fastlane.v1.GetJobResponse': ['job'],
  'fastlane.v1.ListJobsResponse': ['jobs', 'next_page_token'],
  'fastlane.v1.Job': ['job_id', 'spec', 'state', 'next_fire_at'],
  'fastlane.v1.TriggerJobResponse': ['run'],
  'fastlane.v1.ListRunsResponse': ['runs', 'next_page_token'],
  'fastlane.v1.GetRunResponse': ['run', 'attempts', 'checkpoint'],
  'fastlane.v1.CancelRunResponse': ['run'],
  'fastlane.v1.RetryRunResponse': ['run'],
  'fastlane.v1.Run': ['run_id', 'job_id', 'state', 'attempts', 'scheduled_for', 'cancel_requested'],
  'fastlane.v1.Attempt': ['attempt', 'outcome', 'error_code', 'started_at'],
  'fastlane.v1.RunState': ['RUN_STATE_SUCCEEDED', 'RUN_STATE_RUNNING', 'RUN_STATE_CANCELLED'],
  'fastlane.v1.GetClusterResponse': ['nodes', 'workers'],
};

/** Schedules, as JobSpec.schedule takes them. */
const schedules = {
  now: () => ({ now: {} }),
  at: (date) => ({ at: api.dateToTimestamp(date) }),
  cron: (expression, timezone = '') => ({ cron: { expression, timezone } }),
  interval: (everyMs, anchor = null) => ({
    interval: { every: api.nsToDuration(BigInt(Math.round(everyMs * 1e6))), ...(anchor ? { anchor: api.dateToTimestamp(anchor) } : {}) },
  }),
};

function seconds(value) {
  return api.nsToDuration(BigInt(Math.round(value * 1e9)));
}

/**
 * A JobSpec from friendlier parts: payload (any JSON value, or a Buffer as it is), retry
 * {maxAttempts, backoffSeconds, backoffCapSeconds}, leaseTtlSeconds, timeoutSeconds.
 */
function jobSpec({ name, jobType, schedule, payload, priority, retry, leaseTtlSeconds, timeoutSeconds, tenant = '' }) {
  const spec = { tenant, name, job_type: jobType, schedule };
  if (payload !== undefined && payload !== null) spec.payload = Buffer.isBuffer(payload) ? payload : Buffer.from(JSON.stringify(payload));
  if (priority) spec.priority = priority;
  if (retry) {
    spec.retry = {};
    if (retry.maxAttempts) spec.retry.max_attempts = retry.maxAttempts;
    if (retry.backoffSeconds) spec.retry.backoff_base = seconds(retry.backoffSeconds);
    if (retry.backoffCapSeconds) spec.retry.backoff_cap = seconds(retry.backoffCapSeconds);
  }
  if (leaseTtlSeconds) spec.lease_ttl = seconds(leaseTtlSeconds);
  if (timeoutSeconds) spec.timeout = seconds(timeoutSeconds);
  return spec;
}

/** Run states by their short name ("succeeded") or their enum name. */
function runState(name) {
  return name.startsWith('RUN_STATE_') ? name : `RUN_STATE_${name.toUpperCase()}`;
}

class Client {
  /** @param {{address?: string, tenant?: string}} options  tenant: empty for the token's own */
  constructor({ address, tenant = '' } = {}) {
    api.expectFields(USES);
    api.expectMethods('JobService', ['CreateJob', 'GetJob', 'ListJobs', 'DeleteJob', 'TriggerJob']);
    api.expectMethods('RunService', ['ListRuns', 'GetRun', 'CancelRun', 'RetryRun']);
    api.expectMethods('AdminService', ['GetCluster']);
    const { services } = api.loadApi();
    this.address = api.resolveAddress(address);
    this.tenant = tenant;
    const credentials = api.channelCredentials();
    this._jobs = new services.JobService(this.address, credentials);
    this._runs = new services.RunService(this.address, credentials);
    this._admin = new services.AdminService(this.address, credentials);
  }

  close() {
    for (const stub of [this._jobs, this._runs, this._admin]) stub.close();
  }

  // -- jobs ----------------------------------------------------------------------------------

  /** Idempotent on (tenant, name): {job, created}; created is false if the same spec existed. */
  createJob(spec) {
    return this._call(this._jobs, 'CreateJob', { spec: { ...spec, tenant: spec.tenant || this.tenant } });
  }

  async getJob(jobId) {
    return (await this._call(this._jobs, 'GetJob', { tenant: this.tenant, job_id: jobId })).job;
  }

  async listJobs({ pageSize = 100, pageToken = '' } = {}) {
    return this._call(this._jobs, 'ListJobs', { tenant: this.tenant, page_size: pageSize, page_token: pageToken });
  }

  async deleteJob(jobId) {
    await this._call(this._jobs, 'DeleteJob', { tenant: this.tenant, job_id: jobId });
  }

  async triggerJob(jobId) {
    return (await this._call(this._jobs, 'TriggerJob', { tenant: this.tenant, job_id: jobId })).run;
  }

  // -- runs ----------------------------------------------------------------------------------

  /** A page of runs, newest scheduled first: {runs, next_page_token}. */
  listRuns({ jobId = '', states = [], pageSize = 100, pageToken = '' } = {}) {
    return this._call(this._runs, 'ListRuns', {
      tenant: this.tenant, job_id: jobId, states: states.map(runState), page_size: pageSize, page_token: pageToken,
    });
  }

  /** {run, attempts, checkpoint}: the run, every attempt, and the last checkpoint saved (a Buffer, if any). */
  getRun(runId) {
    return this._call(this._runs, 'GetRun', { tenant: this.tenant, run_id: runId });
  }

  /** A queued run never starts; a running one is told to stop (cancel_requested until it has). */
  async cancelRun(runId) {
    return (await this._call(this._runs, 'CancelRun', { tenant: this.tenant, run_id: runId })).run;
  }

  async retryRun(runId) {
    return (await this._call(this._runs, 'RetryRun', { tenant: this.tenant, run_id: runId })).run;
  }

  // -- the cluster ---------------------------------------------------------------------------

  cluster() {
    return this._call(this._admin, 'GetCluster', {});
  }

  _call(stub, method, request) {
    // Service definitions name their messages without the package: fastlane.v1 holds them all.
    const { requestType } = stub.constructor.service[method];
    api.checkMessage(`${api.PACKAGE}.${requestType.type.name}`, request);
    return new Promise((resolve, reject) => {
      stub[method](request, api.callMetadata(), { deadline: Date.now() + CALL_TIMEOUT_MS }, (error, response) => {
        if (error) reject(error);
        else resolve(response);
      });
    });
  }
}

/** The example's four schedules: {kind, job} for a job that runs now, at an instant, on cron and on an interval. */
async function createAll(client, options = {}) {
  const prefix = options.prefix || `node-example-${Math.floor(Date.now() / 1000)}`;
  const atInSeconds = options.atInSeconds ?? 5;
  const kinds = [
    // The instant is sent ahead to a worker whose clock the node knows: node.lag shows when it started.
    ['at', 'node.lag', schedules.at(new Date(Date.now() + atInSeconds * 1000))],
    ['now', 'node.echo', schedules.now()],
    ['cron', 'node.echo', schedules.cron(options.cron || '*/10 * * * * *', options.timezone || 'Europe/Paris')],
    ['interval', 'node.echo', schedules.interval((options.everySeconds || 10) * 1000)],
  ];
  const created = [];
  for (const [kind, jobType, schedule] of kinds) {
    const spec = jobSpec({ name: `${prefix}-${kind}`, jobType, schedule, payload: { kind } });
    const { job } = await client.createJob(spec);
    created.push({ kind, job });
  }
  return created;
}

// -- the command -----------------------------------------------------------------------------------

const USAGE = `usage: node client.js [--server HOST:PORT] COMMAND [options]

The node: --server, else $FASTLANE_ADDRESS, else ${api.DEFAULT_ADDRESS}; the API token (a node
running --auth): $FASTLANE_TOKEN; TLS: $FASTLANE_TLS_CA names the CA of the node's certificate.

commands:
  create-all [--prefix P] [--at-in SECONDS] [--cron EXPR] [--timezone ZONE] [--every SECONDS]
                       a job of each kind of schedule: now and cron and interval (node.echo), at
                       an instant (node.lag); defaults: 5 s from now, '*/10 * * * * *' in
                       Europe/Paris, every 10 s
  create --name N --type T (--now | --at RFC3339 | --cron EXPR [--timezone ZONE] | --every SECONDS)
         [--payload JSON] [--max-attempts N] [--backoff SECONDS] [--lease-ttl SECONDS]
         [--timeout SECONDS] [--priority N]
  jobs | get-job JOB_ID | delete-job JOB_ID | trigger JOB_ID
  runs [--job JOB_ID] [--state STATE]... [--limit N]     newest scheduled first
  get-run RUN_ID       the run, its attempts and its checkpoint
  cancel RUN_ID
  retry RUN_ID
  cluster              nodes and connected workers
`;

const OPTIONS = {
  server: { type: 'string' },
  tenant: { type: 'string', default: '' },
  prefix: { type: 'string' },
  'at-in': { type: 'string' },
  cron: { type: 'string' },
  timezone: { type: 'string' },
  every: { type: 'string' },
  name: { type: 'string' },
  type: { type: 'string' },
  now: { type: 'boolean' },
  at: { type: 'string' },
  payload: { type: 'string' },
  'max-attempts': { type: 'string' },
  backoff: { type: 'string' },
  'lease-ttl': { type: 'string' },
  timeout: { type: 'string' },
  priority: { type: 'string' },
  job: { type: 'string' },
  state: { type: 'string', multiple: true },
  limit: { type: 'string' },
  help: { type: 'boolean', short: 'h' },
};

class UsageError extends Error {}

function number(value, flag) {
  if (value === undefined) return undefined;
  const parsed = Number(value);
  if (!Number.isFinite(parsed)) throw new UsageError(`${flag} must be a number, got ${value}`);
  return parsed;
}

function scheduleOf(values) {
  const given = ['now', 'at', 'cron', 'every'].filter((flag) => values[flag] !== undefined);
  if (given.length !== 1) throw new UsageError('give exactly one of --now, --at, --cron and --every');
  if (values.now) return schedules.now();
  if (values.at !== undefined) {
    const date = new Date(values.at);
    if (Number.isNaN(date.getTime())) throw new UsageError(`--at must be an RFC 3339 instant, got ${values.at}`);
    return schedules.at(date);
  }
  if (values.cron !== undefined) return schedules.cron(values.cron, values.timezone || '');
  return schedules.interval(number(values.every, '--every') * 1000);
}

function argument(positionals, what) {
  if (positionals.length < 2) throw new UsageError(`${positionals[0]} needs ${what}`);
  return positionals[1];
}

async function command(client, positionals, values) {
  const plain = (type, message) => api.toPlain(`${api.PACKAGE}.${type}`, message);
  switch (positionals[0]) {
    case 'create-all': {
      const created = await createAll(client, {
        prefix: values.prefix, atInSeconds: number(values['at-in'], '--at-in'), cron: values.cron,
        timezone: values.timezone, everySeconds: number(values.every, '--every'),
      });
      return { jobs: created.map(({ kind, job }) => ({ kind, ...plain('Job', job) })) };
    }
    case 'create': {
      if (!values.name || !values.type) throw new UsageError('create needs --name and --type');
      const spec = jobSpec({
        name: values.name,
        jobType: values.type,
        schedule: scheduleOf(values),
        payload: values.payload === undefined ? undefined : JSON.parse(values.payload),
        priority: number(values.priority, '--priority'),
        retry: values['max-attempts'] || values.backoff
          ? { maxAttempts: number(values['max-attempts'], '--max-attempts'), backoffSeconds: number(values.backoff, '--backoff') }
          : undefined,
        leaseTtlSeconds: number(values['lease-ttl'], '--lease-ttl'),
        timeoutSeconds: number(values.timeout, '--timeout'),
      });
      return plain('CreateJobResponse', await client.createJob(spec));
    }
    case 'jobs':
      return plain('ListJobsResponse', await client.listJobs({ pageSize: number(values.limit, '--limit') || 100 }));
    case 'get-job':
      return plain('Job', await client.getJob(argument(positionals, 'a job id')));
    case 'delete-job':
      await client.deleteJob(argument(positionals, 'a job id'));
      return { deleted: positionals[1] };
    case 'trigger':
      return plain('Run', await client.triggerJob(argument(positionals, 'a job id')));
    case 'runs':
      return plain('ListRunsResponse', await client.listRuns({
        jobId: values.job || '', states: values.state || [], pageSize: number(values.limit, '--limit') || 100,
      }));
    case 'get-run':
      return plain('GetRunResponse', await client.getRun(argument(positionals, 'a run id')));
    case 'cancel':
      return plain('Run', await client.cancelRun(argument(positionals, 'a run id')));
    case 'retry':
      return plain('Run', await client.retryRun(argument(positionals, 'a run id')));
    case 'cluster':
      return plain('GetClusterResponse', await client.cluster());
    default:
      throw new UsageError(positionals.length ? `unknown command ${positionals[0]}` : 'no command given');
  }
}

async function main(argv) {
  let parsed;
  try {
    parsed = parseArgs({ args: argv, options: OPTIONS, allowPositionals: true });
  } catch (error) {
    process.stderr.write(`client.js: ${error.message}\n\n${USAGE}`);
    return 2;
  }
  const { values, positionals } = parsed;
  if (values.help) {
    process.stdout.write(USAGE);
    return 0;
  }
  const client = new Client({ address: values.server, tenant: values.tenant });
  try {
    const answer = await command(client, positionals, values);
    process.stdout.write(`${JSON.stringify(answer, null, 2)}\n`);
    return 0;
  } catch (error) {
    if (error instanceof UsageError) {
      process.stderr.write(`client.js: ${error.message}\n\n${USAGE}`);
      return 2;
    }
    if (error.code !== undefined && error.details !== undefined) {
      const name = Object.keys(grpc.status).find((key) => grpc.status[key] === error.code) || error.code;
      process.stderr.write(`client.js: ${name}: ${error.details}\n`);
      return 1;
    }
    throw error;
  } finally {
    client.close();
  }
}

if (require.main === module) {
  main(process.argv.slice(2)).then((code) => { process.exitCode = code; }, (error) => {
    process.stderr.write(`client.js: ${error.stack || error}\n`);
    process.exitCode = error instanceof api.ProtocolMismatch ? 3 : 1;
  });
}

module.exports = { Client, createAll, jobSpec, runState, schedules };
