// kafkajs consumer-group join timer for bench/group_join.py.
//
// usage: node group_join.js BROKERS TOPIC GROUP [TIMEOUT_MS [SESSION_TIMEOUT_MS]]
//
// BROKERS is a comma-separated bootstrap list; TOPIC must exist. One consumer in the fresh
// group GROUP subscribes to TOPIC and runs; when kafkajs emits consumer.events.GROUP_JOIN
// (JoinGroup + SyncGroup done, assignment known) it prints one JSON line on stdout and
// disconnects:
//   {"elapsed_ms": <connect() to GROUP_JOIN>, "duration_ms": <kafkajs' own join+sync time>,
//    "partitions": <partitions assigned>, "protocol": <assignor>}
// Exit 1 with the error on stderr if the consumer crashes, 2 if no join within TIMEOUT_MS
// (default 60000). SESSION_TIMEOUT_MS overrides kafkajs' sessionTimeout (30000), with
// heartbeatInterval min(3000, a third of it). kafkajs' log goes to stderr at WARN and above.
'use strict';

const { Kafka, logLevel } = require('kafkajs');

const stderrLog = () => ({ namespace, label, log }) => {
  const { message, ...extra } = log;
  process.stderr.write(`kafkajs ${label} [${namespace}] ${message} ${JSON.stringify(extra)}\n`);
};

async function main() {
  const [brokers, topic, groupId, timeoutArg, sessionArg] = process.argv.slice(2);
  if (!groupId) {
    throw new Error('usage: node group_join.js BROKERS TOPIC GROUP [TIMEOUT_MS [SESSION_TIMEOUT_MS]]');
  }
  const timeoutMs = Number(timeoutArg || 60000);
  const sessionTimeout = Number(sessionArg);
  const heartbeatInterval = Math.min(3000, Math.floor(sessionTimeout / 3));
  const session = sessionArg ? { sessionTimeout, heartbeatInterval } : {};
  const kafka = new Kafka({
    clientId: 'automq-py-bench-group-join',
    brokers: brokers.split(','),
    logLevel: logLevel.WARN,
    logCreator: stderrLog,
  });
  const consumer = kafka.consumer({ groupId, allowAutoTopicCreation: false, ...session });

  let finish;
  const done = new Promise((resolve) => {
    finish = resolve;
  });
  const t0 = process.hrtime.bigint();
  consumer.on(consumer.events.GROUP_JOIN, ({ payload }) => {
    const elapsedMs = Number(process.hrtime.bigint() - t0) / 1e6;
    const partitions = Object.values(payload.memberAssignment).reduce((n, p) => n + p.length, 0);
    const line = {
      elapsed_ms: elapsedMs,
      duration_ms: payload.duration,
      partitions,
      protocol: payload.groupProtocol,
    };
    finish({ code: 0, out: JSON.stringify(line) });
  });
  consumer.on(consumer.events.CRASH, ({ payload }) => {
    const err = payload.error;
    finish({ code: 1, err: `consumer crashed: ${err && err.stack ? err.stack : err}` });
  });
  const timeout = { code: 2, err: `no GROUP_JOIN within ${timeoutMs} ms` };
  const timer = setTimeout(() => finish(timeout), timeoutMs);

  const failed = (err) => finish({ code: 1, err: `failed: ${err && err.stack ? err.stack : err}` });
  // run() resolves only once the first join is done: not awaited, so the timeout can win
  consumer
    .connect()
    .then(() => consumer.subscribe({ topics: [topic], fromBeginning: true }))
    .then(() => consumer.run({ eachMessage: async () => {} }))
    .catch(failed);
  const result = await done;
  clearTimeout(timer);
  if (result.out) process.stdout.write(result.out + '\n');
  if (result.err) process.stderr.write(result.err + '\n');
  // a member stuck in a join can make disconnect() wait: do not let it hold the exit code
  const grace = new Promise((resolve) => setTimeout(resolve, 5000));
  await Promise.race([consumer.disconnect().catch(() => {}), grace]);
  process.exit(result.code);
}

main().catch((err) => {
  console.error(err && err.stack ? err.stack : err);
  process.exit(1);
});
