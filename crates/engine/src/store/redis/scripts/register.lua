-- Register (or re-register) a node incarnation.
-- KEYS: nodes, node hash, inbox
-- ARGV: node id, incarnation, lease ms, "1" if this is a recovery,
--       number of subscriptions N, N subscriptions, then field/value pairs
-- Returns {now ms, previous incarnation or ""}. A different previous
-- incarnation is replaced: a restart with a stable id wins, and a still-live
-- older process finds out on its next heartbeat.
-- On recovery the subscriptions are restored and a marker is appended to the
-- inbox, so the reader reports the recovery before any message published
-- after it. Retained messages are not delivered again.
-- The prefix is the nodes key without ":nodes"; keys built from it, not in KEYS:
-- P:node:ID:subs, P:topic:SUB:subs, P:patterns (the subscriptions) and
-- P:limits (the node's inbox_max, for publishers), P:packed (whether this
-- incarnation reads packed inbox entries, for publishers).
local nodes_key = KEYS[1]
local node_key = KEYS[2]
local inbox_key = KEYS[3]
local id = ARGV[1]
local incarnation = ARGV[2]
local lease_ms = tonumber(ARGV[3])
local recovery = ARGV[4]
local nsubs = tonumber(ARGV[5])
local now = now_ms()
local prefix = string.sub(nodes_key, 1, #nodes_key - #':nodes')
local previous = redis.call('HGET', node_key, 'incarnation') or ''
redis.call('ZADD', nodes_key, now + lease_ms, id)
for i = 6, 5 + nsubs do add_subscription(prefix, id, ARGV[i]) end
local fields = {'incarnation', incarnation, 'registered_at', now, 'heartbeat_at', now}
for i = 6 + nsubs, #ARGV, 2 do
  fields[#fields + 1] = ARGV[i]
  fields[#fields + 1] = ARGV[i + 1]
end
redis.call('HSET', node_key, unpack(fields))
-- Publishers look up every target's inbox limit in one hash.
local limit = redis.call('HGET', node_key, 'inbox_max')
if limit then redis.call('HSET', prefix .. ':limits', id, limit) end
-- Publishers write packed inbox entries (publish.lua) only to the
-- incarnation recorded here, which says it reads them: a process of an
-- older version registered again under this id leaves the record behind
-- with another incarnation than its own, and gets the older fields.
if redis.call('HGET', node_key, 'inbox') == 'packed' then
  redis.call('HSET', prefix .. ':packed', id, incarnation)
else
  redis.call('HDEL', prefix .. ':packed', id)
end
if recovery == '1' then
  redis.call('XADD', inbox_key, '*', 'k', 'recovered')
end
return {now, previous}
