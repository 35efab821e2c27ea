// Helpers shared by the peer benches: arguments, percentiles (as
// leasehold-bench computes them), progress on stderr, one JSON object per
// figure on stdout, and cleanup of a run's keys.

import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import Redis from 'ioredis';

/** The Redis URL, first argument of every script. */
export function redisUrl() {
  const url = process.argv[2];
  if (!url || !/^rediss?:\/\//.test(url)) {
    fail(`usage: node ${process.argv[1]} REDIS_URL [...] (got ${url ?? 'nothing'})`);
  }
  return url;
}

/** A positive integer from the environment, or its default. */
export function envCount(name, fallback) {
  const raw = process.env[name];
  if (raw === undefined || raw === '') {
    return fallback;
  }
  const value = Number(raw);
  if (!Number.isSafeInteger(value) || value <= 0) {
    fail(`${name} must be a positive integer, got ${JSON.stringify(raw)}`);
  }
  return value;
}

/** A fresh key prefix per run, so a bench never touches other data. */
export function runPrefix(peer) {
  return `leasehold-peers-${peer}-${randomBytes(4).toString('hex')}`;
}

/** Monotonic milliseconds (fractional). */
export const now = () => performance.now();

/**
 * The same rank as leasehold-bench's `percentile` (report.rs):
 * round(p / 100 * (n - 1)) of the sorted samples.
 */
export function percentile(sorted, p) {
  if (sorted.length === 0) {
    return 0;
  }
  const rank = Math.round((p / 100) * (sorted.length - 1));
  return sorted[Math.min(rank, sorted.length - 1)];
}

/** Milliseconds rounded to the microsecond, for the JSON lines. */
export const ms = value => Math.round(value * 1000) / 1000;

export function progress(what) {
  process.stderr.write(`peers: ${what}\n`);
}

/** One figure: one JSON object on one line of stdout. */
export function emit(figure) {
  process.stdout.write(`${JSON.stringify(figure)}\n`);
}

export class BenchError extends Error {}

export function fail(message) {
  throw new BenchError(message);
}

/** Runs `main`, turning a failure into a message on stderr and exit 1. */
export function runMain(main) {
  main().then(
    () => process.exit(0),
    err => {
      const what =
        err instanceof BenchError
          ? err.message
          : process.env.PEER_DEBUG
            ? err?.stack ?? String(err)
            : `${err?.name ?? 'Error'}: ${err?.message ?? err}`;
      process.stderr.write(`peers: FAILED: ${what}\n`);
      process.exit(1);
    },
  );
}

/** Rejects with `message` if `promise` has not settled within `limitMs`. */
export function within(promise, limitMs, message) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new BenchError(message)), limitMs);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

export const sleep = delayMs => new Promise(resolve => setTimeout(resolve, delayMs));

/**
 * A queue of delivered messages read one at a time, like leasehold's
 * `inbox.next_message()`.
 */
export class Inbox {
  constructor() {
    this.buffered = [];
    this.waiting = [];
  }

  push(message) {
    const waiter = this.waiting.shift();
    if (waiter) {
      waiter(message);
    } else {
      this.buffered.push(message);
    }
  }

  next() {
    if (this.buffered.length > 0) {
      return Promise.resolve(this.buffered.shift());
    }
    return new Promise(resolve => this.waiting.push(resolve));
  }
}

/** A plain ioredis client, failing fast rather than queueing forever. */
export function client(url, options = {}) {
  const redis = new Redis(url, { maxRetriesPerRequest: 1, ...options });
  redis.on('error', err => progress(`redis client error: ${err.message}`));
  return redis;
}

/** Fails with a clear message unless Redis answers PING. */
export async function checkRedis(url) {
  const redis = new Redis(url, {
    lazyConnect: true,
    connectTimeout: 5000,
    retryStrategy: () => null,
    maxRetriesPerRequest: 0,
  });
  let cause;
  redis.on('error', err => {
    cause ??= err;
  });
  try {
    await redis.connect();
    await redis.ping();
  } catch (err) {
    fail(`cannot reach Redis at ${url}: ${(cause ?? err).message}`);
  } finally {
    redis.disconnect();
  }
}

/** Runs a cleanup step; its failure is reported, not thrown over the bench's own. */
export async function cleanup(what, step) {
  try {
    await step();
  } catch (err) {
    progress(`${what}: cleanup failed: ${err.message}`);
  }
}

/** Deletes every key under `prefix`; returns how many. */
export async function deleteKeys(url, prefix) {
  const redis = client(url);
  let deleted = 0;
  try {
    let cursor = '0';
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000);
      cursor = next;
      if (keys.length > 0) {
        deleted += await redis.unlink(...keys);
      }
    } while (cursor !== '0');
  } finally {
    redis.disconnect();
  }
  return deleted;
}

/** Latency figures as leasehold-bench reports them: p50, p99, max. */
export function latencyFigure(peer, samples, extra = {}) {
  const sorted = [...samples].sort((a, b) => a - b);
  return {
    peer,
    figure: 'latency',
    p50_ms: ms(percentile(sorted, 50)),
    p99_ms: ms(percentile(sorted, 99)),
    max_ms: ms(percentile(sorted, 100)),
    n: sorted.length,
    ...extra,
  };
}
