// redis-leader 0.1.0's takeover, measured as leasehold-bench's failover
// scenario measures leasehold's (crates/bench/src/failover.rs): three
// candidate processes campaign for one lock; each trial starts from one
// agreed leader (exactly one candidate says it leads, and the lock holds its
// id), breaks it, and times the way to the next 'elected' event of another
// candidate, as it arrives at this process.
//
//   takeover_kill              SIGKILL of the leader -> another elected
//   takeover_kill_expiry_gap   the old lock's expiry -> the new acquisition
//                              (Redis clock, from PTTL and TIME)
//   takeover_graceful          SIGTERM of the leader (it calls stop()) -> another elected
//   takeover_step_down         stop() in a leader that stays up -> another elected
//
// usage: node redis-leader.mjs REDIS_URL

import { fork } from 'node:child_process';
import { createHash } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import {
  checkRedis,
  cleanup,
  client,
  deleteKeys,
  emit,
  envCount,
  fail,
  ms,
  now,
  percentile,
  progress,
  redisUrl,
  runMain,
  runPrefix,
  sleep,
  within,
} from './common.mjs';

const PEER = 'redis-leader';
const CANDIDATES = envCount('PEER_CANDIDATES', 3);
const TRIALS = envCount('PEER_TRIALS', 5);
// leasehold-bench's defaults: --ttl-ms 1000, --retry-interval-ms 200. The
// library's `wait` is its retry interval; it renews every ttl / 2, which it
// does not let one set (leasehold's --renew-interval-ms is 300).
const TTL_MS = envCount('PEER_LEADER_TTL_MS', 1000);
const WAIT_MS = envCount('PEER_LEADER_WAIT_MS', 200);
const RENEW_MS = TTL_MS / 2;
const KEY = 'bench-group';
const CANDIDATE = fileURLToPath(new URL('./redis-leader-candidate.mjs', import.meta.url));

class Pool {
  constructor(url, prefix) {
    this.url = url;
    this.prefix = prefix;
    // The lock's key as the library names it, under this run's prefix.
    this.lockKey = `${prefix}:leader:${createHash('sha1').update(KEY).digest('hex')}`;
    this.control = client(url);
    this.candidates = [];
    this.waiters = [];
  }

  async start(slot) {
    const proc = fork(CANDIDATE, [this.url, `${this.prefix}:`, KEY, String(TTL_MS), String(WAIT_MS)], {
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    const candidate = { slot, proc, id: null, leads: false, exited: false };
    candidate.exit = new Promise(resolve => {
      proc.on('exit', (code, signal) => {
        candidate.exited = true;
        candidate.leads = false;
        resolve({ code, signal });
      });
    });
    const ready = new Promise((resolve, reject) => {
      proc.on('message', message => {
        if (message.type === 'ready') {
          candidate.id = message.id;
          resolve();
        } else if (message.type === 'elected') {
          candidate.leads = true;
          const at = now();
          this.waiters = this.waiters.filter(w => !w(candidate, at));
        } else if (message.type === 'revoked') {
          candidate.leads = false;
        }
      });
      candidate.exit.then(({ code, signal }) =>
        reject(new Error(`candidate ${slot} exited (${code ?? signal}) before it was ready`)),
      );
    });
    this.candidates[slot] = candidate;
    await within(ready, 10_000, `candidate ${slot} not ready within 10 s`);
    return candidate;
  }

  /** The next 'elected' of a candidate other than `other`: its arrival time. */
  nextElected(other, limitMs) {
    const elected = new Promise(resolve => {
      this.waiters.push((candidate, at) => {
        if (candidate === other) return false;
        resolve(at);
        return true;
      });
    });
    return within(elected, limitMs, `no other candidate elected within ${limitMs} ms`);
  }

  /** One agreed leader: one candidate says it leads, and the lock holds its id. */
  async steady() {
    const limit = 5 * TTL_MS + 5000;
    const started = now();
    for (;;) {
      const leaders = this.candidates.filter(c => c.leads && !c.exited);
      if (leaders.length === 1 && (await this.control.get(this.lockKey)) === leaders[0].id) {
        return leaders[0];
      }
      if (now() - started > limit) {
        fail(`no single agreed leader within ${limit} ms (${leaders.length} say they lead)`);
      }
      await sleep(1);
    }
  }

  /** Redis's clock and the lock's expiry on it, read together (ms). */
  async lockExpiry() {
    const [[, time], [, pttl]] = await this.control.multi().time().pttl(this.lockKey).exec();
    const nowMs = Number(time[0]) * 1000 + Number(time[1]) / 1000;
    return { nowMs, expiresAt: nowMs + Math.max(0, pttl) };
  }

  async replace(candidate) {
    await within(candidate.exit, 10_000, `candidate ${candidate.slot} did not exit within 10 s`);
    await this.start(candidate.slot);
  }

  async close() {
    for (const c of this.candidates) {
      if (c && !c.exited) c.proc.kill('SIGKILL');
    }
    await Promise.all(this.candidates.map(c => c?.exit));
    this.control.disconnect();
  }
}

function series(figure, samples, extra = {}) {
  const sorted = [...samples].sort((a, b) => a - b);
  return {
    peer: PEER,
    figure,
    p50_ms: ms(percentile(sorted, 50)),
    max_ms: ms(percentile(sorted, 100)),
    trials: sorted.length,
    samples_ms: samples.map(ms),
    ttl_ms: TTL_MS,
    wait_ms: WAIT_MS,
    renew_ms: RENEW_MS,
    candidates: CANDIDATES,
    ...extra,
  };
}

async function main() {
  const url = redisUrl();
  await checkRedis(url);
  const prefix = runPrefix('leader');
  const pool = new Pool(url, prefix);
  const signalLimit = 2 * TTL_MS + 2 * WAIT_MS + 2000;
  try {
    progress(`redis-leader: starting ${CANDIDATES} candidate processes (key prefix ${prefix})`);
    for (let slot = 0; slot < CANDIDATES; slot++) {
      await pool.start(slot);
    }

    const kill = [];
    const gap = [];
    for (let k = 1; k <= TRIALS; k++) {
      progress(`redis-leader: crash (SIGKILL), trial ${k} of ${TRIALS}`);
      const leader = await pool.steady();
      const elected = pool.nextElected(leader, signalLimit);
      const sent = now();
      leader.proc.kill('SIGKILL');
      const before = await pool.lockExpiry();
      kill.push((await elected) - sent);
      const after = await pool.lockExpiry();
      const acquired = after.expiresAt - TTL_MS;
      gap.push(Math.max(0, acquired - before.expiresAt));
      await pool.replace(leader);
    }
    emit(series('takeover_kill', kill));
    emit(series('takeover_kill_expiry_gap', gap, { clock: 'redis' }));

    const graceful = [];
    for (let k = 1; k <= TRIALS; k++) {
      progress(`redis-leader: graceful shutdown (SIGTERM, stop()), trial ${k} of ${TRIALS}`);
      const leader = await pool.steady();
      const elected = pool.nextElected(leader, signalLimit);
      const sent = now();
      leader.proc.kill('SIGTERM');
      graceful.push((await elected) - sent);
      const { code } = await within(leader.exit, 10_000, 'the stopped leader did not exit');
      if (code !== 0) {
        fail(`the leader stopped by SIGTERM exited with ${code}`);
      }
      await pool.start(leader.slot);
    }
    emit(
      series('takeover_graceful', graceful, {
        how: 'SIGTERM; the leader calls stop() (GET, then DEL of the lock) and exits; the others find the lock free at their next try, every wait_ms',
      }),
    );

    const stepDown = [];
    for (let k = 1; k <= TRIALS; k++) {
      progress(`redis-leader: step-down (stop()), trial ${k} of ${TRIALS}`);
      const leader = await pool.steady();
      const elected = pool.nextElected(leader, TTL_MS + 2000);
      const sent = now();
      leader.proc.send({ type: 'step-down' });
      stepDown.push((await elected) - sent);
      // It campaigns again a ttl after its release: let it come back.
      await sleep(TTL_MS);
    }
    emit(
      series('takeover_step_down', stepDown, {
        how: 'stop() in a leader that stays up (request over IPC); it campaigns again with elect() one ttl later',
      }),
    );

    emit({
      peer: PEER,
      figure: 'dead_node_sweep',
      measured: false,
      reason: 'redis-leader keeps no membership (one SET NX PX lock, nothing per candidate): there is no dead-node sweep to time',
    });
  } finally {
    await cleanup('redis-leader', () => pool.close());
    await cleanup('redis-leader', async () => {
      const left = await deleteKeys(url, prefix);
      progress(`redis-leader: candidates stopped; ${left} keys deleted`);
    });
  }
}

runMain(main);
