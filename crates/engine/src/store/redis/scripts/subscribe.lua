-- Subscribe a node to a topic or pattern, and hand it the retained messages
-- the subscription covers, first in its inbox. A full inbox drops its oldest
-- unread message for each, and counts the drops in the node's hash.
-- KEYS: node inbox
-- ARGV: prefix, node id, subscription, inbox max length
-- Returns the number of retained messages delivered.
-- Keys built from the prefix, not in KEYS: P:node:ID:subs, P:topic:SUB:subs,
-- P:patterns, P:retained, P:topic:T:retained, P:node:ID (the drop count).
-- A topic in P:retained whose retained message expired leaves that set.
local inbox_key = KEYS[1]
local prefix, id, sub = ARGV[1], ARGV[2], ARGV[3]
local maxlen = tonumber(ARGV[4])
local fresh = redis.call('SISMEMBER', prefix .. ':node:' .. id .. ':subs', sub) == 0
add_subscription(prefix, id, sub)
if not fresh then return 0 end
local topics = {}
if is_pattern(sub) then
  for _, topic in ipairs(redis.call('SMEMBERS', prefix .. ':retained')) do
    if matches(sub, topic) then topics[#topics + 1] = topic end
  end
  table.sort(topics)
else
  topics[1] = sub
end
local delivered = 0
local backlog = redis.call('XLEN', inbox_key)
for _, topic in ipairs(topics) do
  local packed = redis.call('GET', prefix .. ':topic:' .. topic .. ':retained')
  if packed then
    local m = cmsgpack.unpack(packed)
    if backlog >= maxlen then
      -- Drop the oldest unread to make room, counted as publish.lua does.
      redis.call('HINCRBY', prefix .. ':node:' .. id, 'dropped', backlog - maxlen + 1)
      backlog = maxlen
    else
      backlog = backlog + 1
    end
    redis.call('XADD', inbox_key, 'MAXLEN', maxlen, '*', 'i', m[1], 't', topic, 'f', m[2], 'p', m[3], 'r', '1')
    delivered = delivered + 1
  elseif is_pattern(sub) then
    redis.call('SREM', prefix .. ':retained', topic) -- expired
  end
end
return delivered
