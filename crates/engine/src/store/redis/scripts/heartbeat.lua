-- Extend a node's lease.
-- KEYS: nodes, node hash
-- ARGV: node id, incarnation, lease ms
-- Returns {1, now} extended; {0, now} the lease had expired or the node was
-- swept (the caller re-registers and reports recovery); {-1, incarnation}
-- another incarnation owns this id now.
local incarnation = redis.call('HGET', KEYS[2], 'incarnation')
if incarnation and incarnation ~= ARGV[2] then return {-1, incarnation} end
local now = now_ms()
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if (not incarnation) or (not expiry) or tonumber(expiry) <= now then
  return {0, now}
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('HSET', KEYS[2], 'heartbeat_at', now)
return {1, now}
