// One kafkajs consumer-group member for tests/automq_py/clients/test_kafkajs_groups.py.
//
// usage: node groups.js BOOTSTRAP TOPIC GROUP MEMBER [DELAY_MS]
//
// A kafkajs consumer (clientId MEMBER) joins GROUP with the classic protocol, subscribes to
// TOPIC from the beginning and runs with kafkajs' auto-commit: resolved offsets are committed
// once COMMIT_THRESHOLD of them are pending, after each batch, before rejoining on a rebalance,
// and before leaving. DELAY_MS (default 0) is slept per record, so that rebalances happen
// while records are still being consumed.
// Prints one JSON line on stdout per event, as it happens:
//   {"event": "join", "member", "generation", "member_id", "leader", "partitions": [...]}
//   {"event": "record", "member", "generation", "partition", "offset", "key"}
//   {"event": "commit", "member", "generation", "offsets": {"<partition>": <next offset>}}
//   {"event": "crash", "member", "error", "restart"}
//   {"event": "stopped", "member"}
// The line "stop" on stdin (or stdin's end) disconnects the consumer (commit, LeaveGroup) and
// exits 0. kafkajs' own log goes to stderr at WARN and above.
'use strict';

const { Kafka, logLevel } = require('kafkajs');
// GROUP_JOIN's payload has no generation id: read it off the ConsumerGroup once joinAndSync()
// returns (kafkajs 2.2.4 is pinned in package-lock.json, so this internal path is stable).
const ConsumerGroup = require('kafkajs/src/consumer/consumerGroup');

const stderrLog = () => ({ namespace, label, log }) => {
  const { message, ...extra } = log;
  process.stderr.write(`kafkajs ${label} [${namespace}] ${message} ${JSON.stringify(extra)}\n`);
};

// pipes are written synchronously on Linux: a line printed before a SIGKILL is not lost
const emit = (line) => process.stdout.write(JSON.stringify(line) + '\n');
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
// a crashed member's uncommitted records, consumed again by the next owner: at most this many
const COMMIT_THRESHOLD = 50;

async function main() {
  const [bootstrap, topic, groupId, member, delayArg] = process.argv.slice(2);
  if (!member) throw new Error('usage: node groups.js BOOTSTRAP TOPIC GROUP MEMBER [DELAY_MS]');
  const delayMs = Number(delayArg || 0);

  let generation = null;
  let joined = null;
  const joinAndSync = ConsumerGroup.prototype.joinAndSync;
  ConsumerGroup.prototype.joinAndSync = async function patchedJoinAndSync(...args) {
    const result = await joinAndSync.apply(this, args);
    // records are fetched only after joinAndSync() returns, so each one carries its generation
    generation = this.generationId;
    emit({ event: 'join', member, generation, ...joined });
    return result;
  };

  const kafka = new Kafka({
    clientId: member,
    brokers: [bootstrap],
    logLevel: logLevel.WARN,
    logCreator: stderrLog,
  });
  const consumer = kafka.consumer({
    groupId,
    sessionTimeout: 6000,
    rebalanceTimeout: 10000,
    heartbeatInterval: 1000,
    maxWaitTimeInMs: 500,
    allowAutoTopicCreation: false,
  });
  consumer.on(consumer.events.GROUP_JOIN, ({ payload }) => {
    joined = {
      member_id: payload.memberId,
      leader: payload.isLeader,
      partitions: (payload.memberAssignment[topic] || []).slice().sort((a, b) => a - b),
    };
  });
  consumer.on(consumer.events.COMMIT_OFFSETS, ({ payload }) => {
    const offsets = {};
    for (const t of payload.topics) {
      if (t.topic !== topic) continue;
      for (const p of t.partitions) offsets[p.partition] = Number(p.offset);
    }
    emit({ event: 'commit', member, generation: payload.groupGenerationId, offsets });
  });
  consumer.on(consumer.events.CRASH, ({ payload }) => {
    const err = payload.error;
    const error = String(err && err.stack ? err.stack : err);
    emit({ event: 'crash', member, error, restart: payload.restart });
  });

  let stopping = null;
  const stop = () => {
    if (!stopping) {
      stopping = consumer.disconnect().then(
        () => {
          emit({ event: 'stopped', member });
          process.exit(0);
        },
        (err) => {
          console.error(`disconnect failed: ${err && err.stack ? err.stack : err}`);
          process.exit(1);
        }
      );
    }
    return stopping;
  };
  let pending = '';
  process.stdin.setEncoding('utf8');
  process.stdin.on('data', (chunk) => {
    pending += chunk;
    const lines = pending.split('\n');
    pending = lines.pop();
    if (lines.some((line) => line.trim() === 'stop')) stop();
  });
  process.stdin.on('end', stop);

  await consumer.connect();
  await consumer.subscribe({ topics: [topic], fromBeginning: true });
  await consumer.run({
    autoCommit: true,
    autoCommitThreshold: COMMIT_THRESHOLD,
    eachMessage: async ({ partition, message }) => {
      emit({
        event: 'record',
        member,
        generation,
        partition,
        offset: Number(message.offset),
        key: message.key.toString(),
      });
      if (delayMs > 0) await sleep(delayMs);
    },
  });
}

main().catch((err) => {
  console.error(err && err.stack ? err.stack : err);
  process.exit(1);
});
