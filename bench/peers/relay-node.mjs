// A Relay node of a run, as relay.mjs and relay-fanout-child.mjs start it:
// its errors and (at most once a second) its lag events reported on stderr.

import { Relay } from 'bullmq';
import { now, progress, within } from './common.mjs';

// leasehold-bench's messaging nodes hold a 30 s node lease; so does a Relay
// node by default (leaseDuration).
export const LEASE_MS = 30_000;

export async function startRelay({ url, prefix, namespace, nodeId, inboxMaxLength }) {
  const relay = new Relay({
    connection: { url },
    prefix,
    namespace,
    nodeId,
    leaseDuration: LEASE_MS,
    inboxMaxLength,
  });
  relay.on('error', err => progress(`relay ${nodeId}: error: ${err.message}`));
  let lagSaid = 0;
  relay.on('lag', backlog => {
    if (now() - lagSaid > 1000) {
      lagSaid = now();
      progress(`relay ${nodeId}: 'lag' event, ${backlog} unread`);
    }
  });
  try {
    await within(relay.waitUntilReady(), 10_000, `relay ${nodeId}: Redis not ready within 10 s`);
  } catch (err) {
    await relay.close().catch(() => {});
    throw err;
  }
  return relay;
}
