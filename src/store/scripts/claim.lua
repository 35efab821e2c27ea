-- Claim a group's lease.
-- KEYS: lease, term, members, config
-- ARGV: node id, incarnation, ttl ms, highest term this node has seen, candidacy ms
-- Returns {1, term, fresh, config} when this node holds the lease afterwards
-- (fresh = 1 for a new acquisition, 0 when it kept a lease it already held),
-- or {0, term, pttl ms, holder id, config} when another node holds it.
-- config is {ttlMs, renewIntervalMs, retryIntervalMs} from the group's
-- config hash (written by the controller), so nodes pick up new timings at
-- their next claim without another call.
local mine = ARGV[1] .. '#' .. ARGV[2] .. '#'
local ttl = tonumber(ARGV[3])
local seen = tonumber(ARGV[4])
local now = now_ms()
local config = redis.call('HMGET', KEYS[4], 'ttlMs', 'renewIntervalMs', 'retryIntervalMs')
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[5]), ARGV[1])
local stored = tonumber(redis.call('GET', KEYS[2]) or '0')
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, #mine) == mine then
  -- Our own lease, still standing after a fail-safe demotion: nobody else
  -- could have held it in between, so it keeps its term.
  local term = tonumber(string.sub(current, #mine + 1))
  if term > stored then redis.call('SET', KEYS[2], term) end
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1, term, 0, config}
end
if current and holder_id(current) ~= ARGV[1] then
  return {0, stored, redis.call('PTTL', KEYS[1]), holder_id(current), config}
end
-- Free, or held by an earlier incarnation of this node id (an unclean restart
-- with a stable id): a new acquisition, under a term larger than any before.
local term = math.max(stored, seen) + 1
redis.call('SET', KEYS[2], term)
redis.call('SET', KEYS[1], mine .. term, 'PX', ttl)
return {1, term, 1, config}
