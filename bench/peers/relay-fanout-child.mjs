// One process of relay.mjs's fan-out figure: `size` subscribers, each a
// Relay node of its own subscribed to `bench.fan`. Started by relay.mjs,
// which it talks to over IPC:
//
//   child -> parent  {type:'ready'}                   every subscriber subscribed
//   parent -> child  {type:'go'}                      publishing starts
//   child -> parent  {type:'done', deliveries}        every subscriber has all
//                                                     (or went 10 s without one)
//   parent -> child  {type:'close'}                   close the nodes and exit
//
// usage (by relay.mjs): node relay-fanout-child.mjs URL PREFIX NAMESPACE FIRST SIZE MESSAGES

import { now, progress } from './common.mjs';
import { startRelay } from './relay-node.mjs';

const [url, prefix, namespace, firstArg, sizeArg, messagesArg] = process.argv.slice(2);
const first = Number(firstArg);
const size = Number(sizeArg);
const m = Number(messagesArg);
const inboxMaxLength = Number(process.env.PEER_INBOX_MAX_LENGTH || 100_000);
// As leasehold-bench: a subscriber 10 s without a message is done.
const IDLE_MS = 10_000;

function send(message) {
  if (process.connected) {
    process.send(message);
  }
}

const subscribers = [];
let going = false;
let reported = false;
let idleTimer;

function check() {
  if (reported || !going) {
    return;
  }
  const at = now();
  for (const s of subscribers) {
    if (!s.finished && at - s.lastAt > IDLE_MS) {
      s.finished = true;
    }
  }
  if (subscribers.every(s => s.finished)) {
    reported = true;
    clearInterval(idleTimer);
    send({ type: 'done', deliveries: subscribers.reduce((sum, s) => sum + s.got, 0) });
  }
}

async function main() {
  await Promise.all(
    Array.from({ length: size }, async (_, k) => {
      const nodeId = `bench-fan-${String(first + k).padStart(3, '0')}`;
      const relay = await startRelay({ url, prefix, namespace, nodeId, inboxMaxLength });
      const subscriber = { relay, got: 0, lastAt: 0, finished: false };
      subscribers[k] = subscriber;
      await relay.subscribe('bench.fan', () => {
        subscriber.got++;
        subscriber.lastAt = now();
        if (subscriber.got === m) {
          subscriber.finished = true;
          check();
        }
      });
    }),
  );

  process.on('message', async message => {
    if (message.type === 'go') {
      going = true;
      const at = now();
      for (const s of subscribers) {
        s.lastAt = Math.max(s.lastAt, at);
      }
      idleTimer = setInterval(check, 250);
      check();
    } else if (message.type === 'close') {
      clearInterval(idleTimer);
      await Promise.allSettled(subscribers.map(s => s.relay.close()));
      process.exit(0);
    }
  });
  // The parent gone: nothing more to do.
  process.on('disconnect', async () => {
    await Promise.allSettled(subscribers.map(s => s.relay.close()));
    process.exit(1);
  });
  send({ type: 'ready' });
}

main().catch(err => {
  progress(`relay fan-out process: FAILED: ${err?.stack ?? err}`);
  process.exit(1);
});
