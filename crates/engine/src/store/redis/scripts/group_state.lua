-- Read a group's state in one step.
-- KEYS: lease, term, members, priorities, config
-- ARGV: none
-- Returns {lease value or false, term, pttl ms (-2 when free), now ms,
-- {id, expiry, ...} of live members, {id, priority, ...} of the members
-- whose priority is not the default ('0 REASON' for an unhealthy one),
-- the preferred members (space-separated) or false}.
local lease_key = KEYS[1]
local term_key = KEYS[2]
local members_key = KEYS[3]
local priorities_key = KEYS[4]
local config_key = KEYS[5]
local now = now_ms()
return {
  redis.call('GET', lease_key),
  tonumber(redis.call('GET', term_key) or '0'),
  redis.call('PTTL', lease_key),
  now,
  redis.call('ZRANGEBYSCORE', members_key, '(' .. now, '+inf', 'WITHSCORES'),
  redis.call('HGETALL', priorities_key),
  redis.call('HGET', config_key, 'preferred'),
}
