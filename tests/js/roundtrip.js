// kafkajs producer for tests/automq_py/clients/test_kafkajs.py.
//
// usage: node roundtrip.js BOOTSTRAP TOPIC COUNT PARTITIONS [--idempotent]
//
// Creates TOPIC, sends COUNT keyed records with headers and explicit timestamps to explicit
// partitions (alternating uncompressed and gzip sends), then prints one JSON line per record
// as the broker acknowledged it: {partition, offset, key, value, timestamp, headers}.
// kafkajs consumers need consumer groups, so the Python test reads the records back itself.
'use strict';

const { Kafka, CompressionTypes, logLevel } = require('kafkajs');

const SEND_SIZE = 500;

function records(count, partitions, baseTs) {
  const out = [];
  for (let i = 0; i < count; i++) {
    out.push({
      partition: i % partitions,
      key: `key-${i}`,
      value: `value-${i}-${'y'.repeat(i % 40)}`,
      timestamp: String(baseTs + i),
      headers: { index: String(i), source: 'kafkajs', empty: '' },
    });
  }
  return out;
}

async function main() {
  const [bootstrap, topic, countArg, partitionsArg, flag] = process.argv.slice(2);
  const count = Number(countArg);
  const partitions = Number(partitionsArg);
  const idempotent = flag === '--idempotent';
  const kafka = new Kafka({
    clientId: 'automq-py-kafkajs-test',
    brokers: [bootstrap],
    logLevel: logLevel.ERROR,
    retry: { retries: 3 },
  });

  const admin = kafka.admin();
  await admin.connect();
  const created = await admin.createTopics({
    topics: [{ topic, numPartitions: partitions, replicationFactor: 1 }],
    waitForLeaders: true,
  });
  await admin.disconnect();
  if (!created) throw new Error(`topic ${topic} already existed`);

  const producer = kafka.producer({
    idempotent,
    maxInFlightRequests: idempotent ? 1 : undefined,
    allowAutoTopicCreation: false,
  });
  await producer.connect();
  const all = records(count, partitions, Date.now());
  const lines = [];
  for (let start = 0; start < all.length; start += SEND_SIZE) {
    const messages = all.slice(start, start + SEND_SIZE);
    const compression = (start / SEND_SIZE) % 2 ? CompressionTypes.GZIP : CompressionTypes.None;
    const acks = await producer.send({ topic, messages, acks: -1, compression });
    // one ack per partition; within a partition, messages keep the order they were sent in
    const next = new Map(acks.map((a) => [a.partition, BigInt(a.baseOffset)]));
    for (const m of messages) {
      const offset = next.get(m.partition);
      if (offset === undefined) throw new Error(`no ack for partition ${m.partition}`);
      next.set(m.partition, offset + 1n);
      lines.push(JSON.stringify({ ...m, offset: Number(offset), timestamp: Number(m.timestamp) }));
    }
  }
  await producer.disconnect();
  process.stdout.write(lines.join('\n') + '\n');
}

main().catch((err) => {
  console.error(err && err.stack ? err.stack : err);
  process.exit(1);
});
