-- Remove nodes whose lease expired, at most a batch of them.
-- KEYS: nodes
-- ARGV: prefix, batch size
-- Returns {swept ids, now ms, earliest remaining expiry ms or -1}.
-- Each node goes through remove_node (remove_node.lua), which builds every
-- other key it touches from the prefix.
local nodes_key = KEYS[1]
local prefix = ARGV[1]
local batch = tonumber(ARGV[2])
local now = now_ms()
local expired = redis.call('ZRANGEBYSCORE', nodes_key, '-inf', now, 'LIMIT', 0, batch)
for _, id in ipairs(expired) do remove_node(prefix, id) end
local next_expiry = -1
local first = redis.call('ZRANGE', nodes_key, 0, 0, 'WITHSCORES')
if first[2] then next_expiry = tonumber(first[2]) end
return {expired, now, next_expiry}
