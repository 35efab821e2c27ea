-- Remove nodes whose lease expired, at most ARGV[2] of them.
-- KEYS: nodes
-- ARGV: prefix, batch size
-- Returns {swept ids, now ms, earliest remaining expiry ms or -1}.
-- Each node goes through remove_node (remove_node.lua), which builds every
-- other key it touches from the prefix.
local now = now_ms()
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(expired) do remove_node(ARGV[1], id) end
local next_expiry = -1
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then next_expiry = tonumber(first[2]) end
return {expired, now, next_expiry}
