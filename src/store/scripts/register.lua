-- Register (or re-register) a node incarnation.
-- KEYS: nodes, node hash
-- ARGV: node id, incarnation, lease ms, then field/value pairs of metadata
-- Returns {now ms, previous incarnation or ""}. A different previous
-- incarnation is replaced: a restart with a stable id wins, and a still-live
-- older process finds out on its next heartbeat.
local now = now_ms()
local previous = redis.call('HGET', KEYS[2], 'incarnation') or ''
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
local fields = {'incarnation', ARGV[2], 'registered_at', now, 'heartbeat_at', now}
for i = 4, #ARGV, 2 do
  fields[#fields + 1] = ARGV[i]
  fields[#fields + 1] = ARGV[i + 1]
end
redis.call('HSET', KEYS[2], unpack(fields))
return {now, previous}
