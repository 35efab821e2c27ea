-- Unsubscribe a node from a topic or pattern, in both directions; a pattern
-- nobody subscribes to any more leaves the pattern index.
-- KEYS: none: P:node:ID:subs, P:topic:SUB:subs and P:patterns are built
-- from the prefix.
-- ARGV: prefix, node id, subscription. Returns 1 if it was subscribed.
local prefix, id, sub = ARGV[1], ARGV[2], ARGV[3]
local was = redis.call('SREM', prefix .. ':node:' .. id .. ':subs', sub)
redis.call('SREM', prefix .. ':topic:' .. sub .. ':subs', id)
forget_if_unused(prefix, sub)
return was
