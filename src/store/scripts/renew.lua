-- Renew a held lease (compare-and-expire).
-- KEYS: lease, members, config
-- ARGV: node id, incarnation, term, ttl ms, candidacy ms
-- Returns {1, config} renewed (config as in claim.lua), {0} the lease is
-- gone (expired), {-1, lease value} another holder.
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] .. '#' .. ARGV[2] .. '#' .. ARGV[3] then
  local now = now_ms()
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]))
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[5]), ARGV[1])
  -- The leader keeps the member list tidy: drop candidacies that lapsed.
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  return {1, redis.call('HMGET', KEYS[3], 'ttlMs', 'renewIntervalMs', 'retryIntervalMs')}
end
if not current then return {0} end
return {-1, current}
