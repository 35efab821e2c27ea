-- Read a group's state in one step.
-- KEYS: lease, term, members, priorities, config
-- ARGV: none
-- Returns {lease value or false, term, pttl ms (-2 when free), now ms,
-- {id, expiry, ...} of live members, {id, priority, ...} of the members
-- whose priority is not the default ('0 REASON' for an unhealthy one),
-- the preferred members (space-separated) or false}.
local now = now_ms()
return {
  redis.call('GET', KEYS[1]),
  tonumber(redis.call('GET', KEYS[2]) or '0'),
  redis.call('PTTL', KEYS[1]),
  now,
  redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. now, '+inf', 'WITHSCORES'),
  redis.call('HGETALL', KEYS[4]),
  redis.call('HGET', KEYS[5], 'preferred'),
}
