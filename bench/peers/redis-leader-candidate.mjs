// One candidate of redis-leader.mjs: a process campaigning with
// redis-leader 0.1.0, reporting to its parent over IPC.
//
//   child -> parent  {type:'ready', id}     connected; campaigning starts
//   child -> parent  {type:'elected'}       the library's 'elected' event
//   child -> parent  {type:'revoked'}       the library's 'revoked' event
//   parent -> child  {type:'step-down'}     stop() (release), then after one
//                                           ttl campaign again
//   SIGTERM                                 graceful shutdown: stop(), and exit
//                                           once the lock is released
//
// usage (by redis-leader.mjs): node redis-leader-candidate.mjs URL KEY_PREFIX KEY TTL_MS WAIT_MS

import Leader from 'redis-leader';
import { client, progress } from './common.mjs';

const [url, keyPrefix, key, ttlArg, waitArg] = process.argv.slice(2);
const ttl = Number(ttlArg);
const wait = Number(waitArg);

// redis-leader takes a callback-style client; ioredis takes callbacks too.
// Its keys (`leader:<sha1 of key>`) have no prefix of their own: ioredis's
// keyPrefix puts them under this run's prefix.
const redis = client(url, { keyPrefix });
const leader = new Leader(redis, { ttl, wait, key });
let leads = false;

function send(message) {
  if (process.connected) {
    process.send(message);
  }
}

leader.on('elected', () => {
  leads = true;
  send({ type: 'elected' });
});
leader.on('revoked', () => {
  leads = false;
  send({ type: 'revoked' });
});
leader.on('error', err => {
  progress(`redis-leader candidate ${process.pid}: error: ${err.message}`);
  process.exit(1);
});

function exitSoon(code) {
  redis.quit().finally(() => process.exit(code));
  setTimeout(() => process.exit(code), 1000).unref();
}

// stop() takes no callback (the README's `stop(callback)` is not in the
// code): a leader's release ends with its 'revoked' event.
process.on('SIGTERM', () => {
  if (leads) {
    leader.once('revoked', () => exitSoon(0));
    leader.stop();
  } else {
    leader.stop();
    // Its GET, queued before the QUIT, still completes.
    exitSoon(0);
  }
});

process.on('message', message => {
  if (message.type === 'step-down') {
    // The release is a stop(); campaigning again is a fresh elect(), one ttl
    // later (leasehold's step-down abstains for a ttl as well).
    leader.once('revoked', () => setTimeout(() => leader.elect(), ttl));
    leader.stop();
  }
});

process.on('disconnect', () => exitSoon(1));

redis.once('ready', () => {
  send({ type: 'ready', id: leader.id });
  leader.elect();
});
