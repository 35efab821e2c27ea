// The floor from Node: one ioredis client XADDs, another reads with
// XREAD BLOCK 0, one message at a time. Each round the reader's XREAD is
// already blocked in Redis (its CLIENT LIST flags show `b`) before the XADD
// is sent; the time is from sending the XADD until both its reply and the
// XREAD's are in (as leasehold-bench's own floor in messaging.rs times it).
//
// usage: node raw-stream.mjs REDIS_URL

import {
  checkRedis,
  cleanup,
  client,
  deleteKeys,
  emit,
  envCount,
  fail,
  latencyFigure,
  now,
  progress,
  redisUrl,
  runMain,
  runPrefix,
  within,
} from './common.mjs';

const PEER = 'raw-stream';

async function blocked(control, readerId) {
  for (let tries = 0; tries < 5000; tries++) {
    const line = await control.call('CLIENT', 'LIST', 'ID', readerId);
    const flags = /(?:^| )flags=(\S+)/.exec(line)?.[1] ?? '';
    if (flags.includes('b')) {
      return;
    }
  }
  fail('the reader never showed as blocked in XREAD');
}

async function main() {
  const url = redisUrl();
  const n = envCount('PEER_LATENCY_MESSAGES', 5000);
  await checkRedis(url);
  const prefix = runPrefix('raw');
  const key = `${prefix}:stream`;
  // No retries: a dropped connection is a failed bench, not a slow sample.
  const writer = client(url);
  const reader = client(url);
  const control = client(url);
  try {
    const readerId = await reader.client('ID');
    progress(`raw stream: latency, ${n} messages one at a time (key ${key})`);
    const samples = [];
    let last = '0-0';
    for (let i = 0; i < n; i++) {
      const reading = reader.xread('BLOCK', 0, 'STREAMS', key, last);
      await blocked(control, readerId);
      // An 8-byte payload, as leasehold's messages and its own floor.
      const payload = String(i).padStart(8, '0');
      const sent = now();
      const id = await writer.xadd(key, '*', 'p', payload);
      const reply = await within(reading, 5000, `message ${i} was not read within 5 s`);
      samples.push(now() - sent);
      const [, entries] = reply[0];
      const [readId, fields] = entries[0];
      if (entries.length !== 1 || readId !== id || fields[1] !== payload) {
        fail(`read ${JSON.stringify(entries)} for message ${i} (${id})`);
      }
      // Kept short, as leasehold-bench's floor keeps its stream.
      await writer.xtrim(key, 'MAXLEN', 0);
      last = id;
    }
    emit(latencyFigure(PEER, samples, { blocked_before_send: true }));
  } finally {
    for (const c of [writer, reader, control]) {
      c.disconnect();
    }
    await cleanup('raw stream', async () => {
      const left = await deleteKeys(url, prefix);
      progress(`raw stream: ${left} keys deleted`);
    });
  }
}

runMain(main);
