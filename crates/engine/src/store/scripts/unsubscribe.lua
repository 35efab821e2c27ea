-- ARGV: prefix, node id, subscription. Returns 1 if it was subscribed.
local prefix, id, sub = ARGV[1], ARGV[2], ARGV[3]
local was = redis.call('SREM', prefix .. ':node:' .. id .. ':subs', sub)
redis.call('SREM', prefix .. ':topic:' .. sub .. ':subs', id)
forget_if_unused(prefix, sub)
return was
