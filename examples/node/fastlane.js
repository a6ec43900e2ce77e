'use strict';
// What client.js and worker.js share: the API loaded from the checked-in .proto files, strict
// message checks, where to connect and with which token, and protobuf times as nanoseconds.
//
// The .proto files are read at run time (no generated code), so this example always speaks the
// API as the repository defines it. protobufjs drops object keys it does not know and turns an
// unknown enum name into 0 without a word; an example that did the same would go on "working"
// after a field was renamed, sending messages the node reads as empty. So every message sent is
// checked against the loaded descriptors first (checkMessage), and every field read is checked to
// exist when the API is loaded (expectFields): a change of the API under the example fails loudly,
// naming the message and the field.

const fs = require('node:fs');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

// The repository's own .proto files; FASTLANE_PROTO_DIR points elsewhere (a test of what happens
// when the API changes under the example does).
const PROTO_DIR = process.env.FASTLANE_PROTO_DIR || path.resolve(__dirname, '..', '..', 'proto');
const PROTO_FILES = ['admin', 'common', 'jobs', 'runs', 'workers', 'workflows'].map((name) => `fastlane/v1/${name}.proto`);
const PACKAGE = 'fastlane.v1';
// The Python client's default (fastlane/rpc/channel.py: DEFAULT_SERVER).
const DEFAULT_ADDRESS = '127.0.0.1:7070';

const LOADER_OPTIONS = {
  includeDirs: [PROTO_DIR],
  keepCase: true, // the field names of the .proto files, as the checks below and the docs use them
  longs: String, // int64 and uint64 (lease tokens, probe ids, seconds) exactly, as decimal strings
  enums: String, // enum values by name: ATTEMPT_OUTCOME_SUCCEEDED, RUN_STATE_RUNNING...
  oneofs: true, // a oneof's set member named by a virtual field (ConnectResponse.body)
  // defaults stays off: an unset message or optional field must stay distinguishable from an empty
  // one (Assignment.checkpoint unset: none saved; start_at unset: start at once).
};

class ProtocolMismatch extends Error {
  constructor(message) {
    super(`${message}: the API in ${PROTO_DIR} no longer matches what this example speaks`);
    this.name = 'ProtocolMismatch';
  }
}

let loaded = null;

/** The API: { definition (descriptors by full name), services: { JobService, ... } }. */
function loadApi() {
  if (loaded === null) {
    for (const file of PROTO_FILES) {
      if (!fs.existsSync(path.join(PROTO_DIR, file))) throw new ProtocolMismatch(`${file} is missing`);
    }
    const definition = protoLoader.loadSync(PROTO_FILES, LOADER_OPTIONS);
    const services = grpc.loadPackageDefinition(definition).fastlane.v1;
    loaded = { definition, services };
  }
  return loaded;
}

function descriptor(typeName) {
  const { definition } = loadApi();
  const entry = definition[typeName];
  if (entry === undefined) throw new ProtocolMismatch(`there is no ${typeName}`);
  return entry;
}

// Descriptors name field types relative to the package ("Cron", "google.protobuf.Timestamp").
function resolveType(name) {
  const { definition } = loadApi();
  const bare = name.replace(/^\./, '');
  for (const candidate of [`${PACKAGE}.${bare}`, bare]) {
    if (definition[candidate] !== undefined) return candidate;
  }
  throw new ProtocolMismatch(`cannot resolve the type ${name}`);
}

function fieldsOf(typeName) {
  const entry = descriptor(typeName);
  if (!entry.format.includes('DescriptorProto') || entry.format.includes('Enum')) {
    throw new ProtocolMismatch(`${typeName} is not a message`);
  }
  return new Map(entry.type.field.map((field) => [field.name, field]));
}

function enumNames(typeName) {
  const entry = descriptor(typeName);
  if (!entry.format.includes('EnumDescriptorProto')) throw new ProtocolMismatch(`${typeName} is not an enum`);
  return new Set(entry.type.value.map((value) => value.name));
}

/**
 * Throw ProtocolMismatch unless every key of `message` (recursively) is a field of `typeName` and
 * every enum value a name of its enum. Returns the message, to check where it is sent.
 */
function checkMessage(typeName, message, where = typeName) {
  if (message === null || typeof message !== 'object' || Array.isArray(message)) {
    throw new ProtocolMismatch(`${where} must be a ${typeName} object`);
  }
  const fields = fieldsOf(typeName);
  for (const [key, value] of Object.entries(message)) {
    if (value === undefined) continue;
    const field = fields.get(key);
    if (field === undefined) throw new ProtocolMismatch(`${typeName} has no field ${key} (at ${where})`);
    const values = field.label === 'LABEL_REPEATED' ? value : [value];
    if (field.label === 'LABEL_REPEATED' && !Array.isArray(value)) {
      throw new ProtocolMismatch(`${where}.${key} is repeated: expected an array`);
    }
    values.forEach((item, index) => {
      const at = field.label === 'LABEL_REPEATED' ? `${where}.${key}[${index}]` : `${where}.${key}`;
      if (field.type === 'TYPE_MESSAGE') {
        checkMessage(resolveType(field.typeName), item, at);
      } else if (field.type === 'TYPE_ENUM') {
        const enumType = resolveType(field.typeName);
        if (!enumNames(enumType).has(item)) throw new ProtocolMismatch(`${item} is not a value of ${enumType} (at ${at})`);
      }
    });
  }
  return message;
}

/**
 * Throw ProtocolMismatch unless each message has each named field (and each enum each named
 * value): what the caller reads from the node's answers, checked once, up front.
 */
function expectFields(expected) {
  for (const [typeName, names] of Object.entries(expected)) {
    const format = descriptor(typeName).format;
    const known = format.includes('Enum') ? enumNames(typeName) : new Set(fieldsOf(typeName).keys());
    for (const name of names) {
      if (!known.has(name)) throw new ProtocolMismatch(`${typeName} has no ${format.includes('Enum') ? 'value' : 'field'} ${name}`);
    }
  }
}

/** Throw ProtocolMismatch unless the service has each named method. */
function expectMethods(serviceName, methods) {
  const service = descriptor(`${PACKAGE}.${serviceName}`);
  for (const method of methods) {
    if (service[method] === undefined) throw new ProtocolMismatch(`${serviceName} has no method ${method}`);
  }
}

/**
 * A decoded message as plain JSON, the way protobuf's JSON mapping writes it: Timestamps as
 * RFC 3339 with nanoseconds, Durations as "1.5s", bytes as base64, enums by name, int64 as strings.
 */
function toPlain(typeName, message) {
  if (message === null || message === undefined) return message;
  if (typeName === 'google.protobuf.Timestamp') return nsToIso(timestampToNs(message));
  if (typeName === 'google.protobuf.Duration') return formatDuration(durationToNs(message));
  const fields = fieldsOf(typeName);
  const plain = {};
  for (const [key, value] of Object.entries(message)) {
    const field = fields.get(key);
    if (field === undefined) continue; // the virtual oneof members (body, _progress)
    const convert = (item) => {
      if (field.type === 'TYPE_MESSAGE') return toPlain(resolveType(field.typeName), item);
      if (field.type === 'TYPE_BYTES') return Buffer.from(item).toString('base64');
      return item;
    };
    plain[key] = field.label === 'LABEL_REPEATED' ? value.map(convert) : convert(value);
  }
  return plain;
}

function formatDuration(ns) {
  const negative = ns < 0n;
  const magnitude = negative ? -ns : ns;
  const fraction = (magnitude % NS_PER_S).toString().padStart(9, '0').replace(/0+$/, '');
  return `${negative ? '-' : ''}${magnitude / NS_PER_S}${fraction ? `.${fraction}` : ''}s`;
}

// -- connecting ------------------------------------------------------------------------------

function resolveAddress(given) {
  return given || process.env.FASTLANE_ADDRESS || DEFAULT_ADDRESS;
}

/** Plain TCP, or TLS with the CA in FASTLANE_TLS_CA (a node serving --tls-cert). */
function channelCredentials() {
  const ca = process.env.FASTLANE_TLS_CA;
  return ca ? grpc.credentials.createSsl(fs.readFileSync(ca)) : grpc.credentials.createInsecure();
}

/**
 * The metadata of every call: the API token from FASTLANE_TOKEN as `authorization: Bearer ...`,
 * as the Python SDK sends it. Plain metadata rather than call credentials, which gRPC sends only
 * over TLS: a token must also work against a node on loopback without TLS.
 */
function callMetadata() {
  const metadata = new grpc.Metadata();
  const token = (process.env.FASTLANE_TOKEN || '').trim();
  if (token) metadata.set('authorization', `Bearer ${token}`);
  return metadata;
}

// -- times -----------------------------------------------------------------------------------
// Nanoseconds since the epoch as BigInt: exact sums, and no precision lost at 2^53.

const NS_PER_S = 1_000_000_000n;

function timestampToNs(stamp) {
  if (stamp === undefined || stamp === null) return null;
  return BigInt(stamp.seconds || 0) * NS_PER_S + BigInt(stamp.nanos || 0);
}

function nsToTimestamp(ns) {
  let seconds = ns / NS_PER_S;
  let nanos = ns % NS_PER_S;
  if (nanos < 0n) { // a Timestamp's nanos are never negative
    seconds -= 1n;
    nanos += NS_PER_S;
  }
  return { seconds: seconds.toString(), nanos: Number(nanos) };
}

function durationToNs(duration) {
  return timestampToNs(duration); // the same two fields; a negative Duration has both negative
}

function nsToDuration(ns) {
  // Seconds and nanos share the sign: BigInt division truncates toward zero, as that needs.
  return { seconds: (ns / NS_PER_S).toString(), nanos: Number(ns % NS_PER_S) };
}

function dateToTimestamp(date) {
  return nsToTimestamp(BigInt(date.getTime()) * 1_000_000n);
}

/** RFC 3339 in UTC with nanoseconds: "2030-01-01T00:00:00.000000000Z". */
function nsToIso(ns) {
  if (ns === null) return null;
  const stamp = nsToTimestamp(ns);
  const whole = new Date(Number(stamp.seconds) * 1000).toISOString().slice(0, 19);
  return `${whole}.${String(stamp.nanos).padStart(9, '0')}Z`;
}

module.exports = {
  DEFAULT_ADDRESS,
  PACKAGE,
  PROTO_DIR,
  ProtocolMismatch,
  callMetadata,
  channelCredentials,
  checkMessage,
  dateToTimestamp,
  durationToNs,
  expectFields,
  expectMethods,
  loadApi,
  nsToDuration,
  nsToIso,
  nsToTimestamp,
  resolveAddress,
  timestampToNs,
  toPlain,
};
