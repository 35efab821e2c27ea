-- Every registered node with its lease and inbox state, for introspection.
-- KEYS: nodes
-- ARGV: prefix
-- Returns {now, {id, lease_until, registered_at, heartbeat_at, backlog, dropped, groups}...}.
-- Reads P:node:ID (HMGET) and P:node:ID:inbox (XLEN), built from the prefix.
local nodes_key = KEYS[1]
local prefix = ARGV[1]
local now = now_ms()
local out = {}
local flat = redis.call('ZRANGE', nodes_key, 0, -1, 'WITHSCORES')
for i = 1, #flat, 2 do
  local id = flat[i]
  local node_key = prefix .. ':node:' .. id
  local h = redis.call('HMGET', node_key, 'registered_at', 'heartbeat_at', 'dropped', 'groups')
  out[#out + 1] = {
    id, flat[i + 1], h[1] or '0', h[2] or '0',
    redis.call('XLEN', node_key .. ':inbox'), h[3] or '0', h[4] or '',
  }
end
return {now, out}
