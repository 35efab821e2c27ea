// BullMQ's Relay (bullmq 6.7.0), measured as leasehold-bench's messaging
// scenario measures leasehold (crates/bench/src/messaging.rs):
//
//   latency     publish one message, wait for its delivery, repeat
//   throughput  messages/s to one subscriber, `in_flight` publishes in flight
//   fanout      deliveries/s to many subscribers in several Node processes
//
// usage: node relay.mjs REDIS_URL [latency|throughput|fanout ...]   (default: all)

import { fork } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { startRelay as startNode } from './relay-node.mjs';
import {
  BenchError,
  Inbox,
  checkRedis,
  cleanup,
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

const PEER = 'bullmq-relay';
const NAMESPACE = 'bench';
const FIGURES = ['latency', 'throughput', 'fanout'];

const config = {
  latencyMessages: envCount('PEER_LATENCY_MESSAGES', 5000),
  throughputMessages: envCount('PEER_THROUGHPUT_MESSAGES', 50_000),
  fanoutMessages: envCount('PEER_FANOUT_MESSAGES', 2000),
  subscribers: envCount('PEER_SUBSCRIBERS', 100),
  processes: envCount('PEER_FANOUT_PROCESSES', 4),
  inFlight: envCount('PEER_IN_FLIGHT', 100),
  // Unread messages a node's inbox keeps before the oldest are dropped.
  inboxMaxLength: envCount('PEER_INBOX_MAX_LENGTH', 100_000),
};

/** A Relay node of this run. */
function startRelay(url, prefix, nodeId, inboxMaxLength) {
  return startNode({ url, prefix, namespace: NAMESPACE, nodeId, inboxMaxLength });
}

/**
 * `inFlight` workers publish `n` messages between them, each one at a time,
 * so `inFlight` publishes are outstanding at any moment (leasehold-bench's
 * `spawn_publishers`). `check` sees each publish's result.
 */
async function publishAll(publisher, topic, n, inFlight, check = () => {}) {
  const workers = Math.max(1, inFlight);
  const tasks = [];
  for (let w = 0; w < workers; w++) {
    tasks.push(
      (async () => {
        for (let i = w; i < n; i += workers) {
          check(await publisher.publish(topic, i));
        }
      })(),
    );
  }
  await Promise.all(tasks);
}

async function nodeState(relay, nodeId) {
  const nodes = await relay.getNodes();
  return nodes.find(node => node.id === nodeId);
}

// 1. One message at a time: publish, wait for its delivery, repeat.
async function latency(publisher, inbox) {
  const n = config.latencyMessages;
  progress(`relay: latency, ${n} messages one at a time`);
  const samples = [];
  for (let i = 0; i < n; i++) {
    const sent = now();
    await publisher.publish('bench.t', i);
    const message = await within(inbox.next(), 5000, `message ${i} was not delivered within 5 s`);
    samples.push(now() - sent);
    if (message.data !== i) {
      fail(`messages out of order: expected ${i}, got ${JSON.stringify(message.data)}`);
    }
  }
  emit(latencyFigure(PEER, samples));
}

// 2. Throughput to one subscriber with `inFlight` publishes in flight.
async function throughput(publisher, sub, route) {
  const n = config.throughputMessages;
  const inFlight = config.inFlight;
  progress(`relay: throughput, ${n} messages, ${inFlight} in flight`);
  let received = 0;
  let lastAt = 0;
  let allIn;
  const all = new Promise(resolve => {
    allIn = resolve;
  });
  // Counted as they come rather than queued.
  route.to = () => {
    received++;
    lastAt = now();
    if (received === n) {
      allIn();
    }
  };
  const started = now();
  const sending = publishAll(publisher, 'bench.t', n, inFlight);
  let failure;
  sending.catch(err => {
    failure = err;
    allIn();
  });
  // One deadline for the whole run, as in leasehold-bench: 10 s + 100 µs a message.
  const deadline = 10_000 + n * 0.1;
  await within(all, deadline, 'deadline').catch(err => {
    if (!(err instanceof BenchError)) throw err;
  });
  if (failure) {
    throw failure;
  }
  // Up to the last delivery; with messages missing, the rate of those that came.
  const took = (received > 0 ? lastAt : now()) - started;
  await sending;
  const state = await nodeState(sub, sub.nodeId);
  const lost = n - received;
  emit({
    peer: PEER,
    figure: 'one_subscriber_rate',
    per_s: Math.round((received / took) * 1000),
    n,
    in_flight: inFlight,
    lost,
    // The subscriber node's own count of unread messages dropped because its
    // inbox was full (Relay's `getNodes()[].dropped`).
    dropped: state ? state.dropped : null,
    inbox_max_length: config.inboxMaxLength,
  });
  if (lost > 0) {
    fail(`throughput: only ${received} of ${n} delivered within ${deadline} ms`);
  }
}

// 3. Fan-out: every message to every subscriber, the subscribers spread over
// several Node processes, each subscriber a Relay node of its own (as each of
// leasehold-bench's fan-out subscribers is a node with an inbox of its own).
async function fanout(url, prefix, publisher) {
  const count = config.subscribers;
  const m = config.fanoutMessages;
  const processes = Math.min(config.processes, count);
  progress(`relay: fan-out, ${m} messages to ${count} subscribers in ${processes} processes`);
  const child = fileURLToPath(new URL('./relay-fanout-child.mjs', import.meta.url));
  const workers = [];
  for (let p = 0; p < processes; p++) {
    // Subscribers first..first + size of this process.
    const first = Math.floor((p * count) / processes);
    const size = Math.floor(((p + 1) * count) / processes) - first;
    const proc = fork(child, [url, prefix, NAMESPACE, String(first), String(size), String(m)], {
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
      env: { ...process.env, PEER_INBOX_MAX_LENGTH: String(config.inboxMaxLength) },
    });
    const worker = { proc, size, exited: false };
    worker.ready = new Promise((resolve, reject) => {
      proc.on('message', msg => {
        if (msg.type === 'ready') resolve();
        if (msg.type === 'done') worker.onDone(msg, now());
      });
      proc.on('exit', code => {
        worker.exited = true;
        reject(new BenchError(`fan-out process ${p} exited (${code}) before it was ready`));
        worker.onExit?.(code);
      });
    });
    workers.push(worker);
  }
  try {
    await within(
      Promise.all(workers.map(w => w.ready)),
      60_000,
      'fan-out subscribers not ready within 60 s',
    );
    const done = workers.map(
      worker =>
        new Promise((resolve, reject) => {
          worker.onDone = (msg, at) => resolve({ ...msg, at });
          worker.onExit = code =>
            reject(new BenchError(`a fan-out process exited (${code}) before it was done`));
        }),
    );
    for (const worker of workers) {
      worker.proc.send({ type: 'go' });
    }
    let reached = null;
    const started = now();
    await publishAll(publisher, 'bench.fan', m, config.inFlight, result => {
      reached ??= result.nodes;
    });
    const results = await Promise.all(done);
    const finished = Math.max(...results.map(r => r.at));
    const deliveries = results.reduce((sum, r) => sum + r.deliveries, 0);
    const took = finished - started;
    // The subscriber nodes' own counts of messages dropped from full inboxes.
    const dropped = (await publisher.getNodes())
      .filter(node => node.id.startsWith('bench-fan-'))
      .reduce((sum, node) => sum + node.dropped, 0);
    emit({
      peer: PEER,
      figure: 'fanout_rate',
      per_s: Math.round((deliveries / took) * 1000),
      deliveries,
      expected: m * count,
      messages: m,
      subscribers: count,
      processes,
      in_flight: config.inFlight,
      dropped,
    });
    if (reached !== count) {
      fail(`fan-out: a publish reached ${reached} nodes, not ${count}`);
    }
    if (deliveries !== m * count) {
      fail(`fan-out: ${deliveries} of ${m * count} delivered (10 s without a message ends a subscriber)`);
    }
  } finally {
    for (const worker of workers) {
      if (!worker.exited && worker.proc.connected) {
        worker.proc.send({ type: 'close' });
      }
    }
    await within(
      Promise.all(
        workers.map(w =>
          w.exited ? null : new Promise(resolve => w.proc.once('exit', resolve)),
        ),
      ),
      30_000,
      'fan-out processes did not exit within 30 s',
    ).catch(err => {
      for (const worker of workers) {
        if (!worker.exited) worker.proc.kill('SIGKILL');
      }
      throw err;
    });
  }
}

async function main() {
  const url = redisUrl();
  const asked = process.argv.slice(3);
  for (const figure of asked) {
    if (!FIGURES.includes(figure)) {
      fail(`unknown figure ${figure}: one of ${FIGURES.join(', ')}`);
    }
  }
  const figures = asked.length > 0 ? asked : FIGURES;
  await checkRedis(url);
  const prefix = runPrefix('relay');
  progress(`relay: key prefix ${prefix}`);
  const relays = [];
  try {
    const publisher = await startRelay(url, prefix, 'bench-pub', config.inboxMaxLength);
    relays.push(publisher);
    if (figures.includes('latency') || figures.includes('throughput')) {
      const sub = await startRelay(url, prefix, 'bench-sub', config.inboxMaxLength);
      relays.push(sub);
      const inbox = new Inbox();
      // Where the subscriber's messages go: the latency figure's queue, then
      // the throughput figure's counter.
      const route = { to: message => inbox.push(message) };
      await sub.subscribe('bench.t', message => route.to(message));
      if (figures.includes('latency')) {
        await latency(publisher, inbox);
      }
      if (figures.includes('throughput')) {
        await throughput(publisher, sub, route);
      }
      await sub.close();
      relays.pop();
    }
    if (figures.includes('fanout')) {
      await fanout(url, prefix, publisher);
    }
  } finally {
    await Promise.allSettled(relays.map(relay => relay.close()));
    // A closed Relay node unregisters itself and the rest of its namespace's
    // keys expire on their own; what is left is deleted now.
    await cleanup('relay', async () => {
      const left = await deleteKeys(url, prefix);
      progress(`relay: closed; ${left} leftover keys deleted`);
    });
  }
}

runMain(main);
