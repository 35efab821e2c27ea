-- Extend a node's lease.
-- KEYS: nodes, node hash
-- ARGV: node id, incarnation, lease ms
-- Returns {1, now} extended; {0, now} the lease had expired or the node was
-- swept (the caller re-registers and reports recovery); {-1, incarnation}
-- another incarnation owns this id now.
local nodes_key = KEYS[1]
local node_key = KEYS[2]
local id = ARGV[1]
local incarnation = ARGV[2]
local lease_ms = tonumber(ARGV[3])
local registered = redis.call('HGET', node_key, 'incarnation')
if registered and registered ~= incarnation then return {-1, registered} end
local now = now_ms()
local expiry = redis.call('ZSCORE', nodes_key, id)
if (not registered) or (not expiry) or tonumber(expiry) <= now then
  return {0, now}
end
redis.call('ZADD', nodes_key, now + lease_ms, id)
redis.call('HSET', node_key, 'heartbeat_at', now)
return {1, now}
